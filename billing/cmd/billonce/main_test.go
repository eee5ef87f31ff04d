package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// envExec makes the test binary run the command itself: each test runs
// billonce as a process, as an operator would.
const envExec = "BILLONCE_CMD_EXEC"

func TestMain(m *testing.M) {
	if os.Getenv(envExec) == "1" {
		main()
	}
	pgtest.Main(m)
}

// result is what one billonce process did.
type result struct {
	code           int
	stdout, stderr string
}

// env is a test's database and fake Stripe.
type env struct {
	t     *testing.T
	db    string
	fake  *billingtest.Server
	pool  *pgxpool.Pool
	key   string
	extra []string
}

const testKey = "sk_test_billonce_cmd"

func newEnv(t *testing.T, cfg billingtest.Config) *env {
	t.Helper()
	u := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return &env{t: t, db: u, fake: billingtest.Start(t, cfg), pool: pool, key: testKey}
}

// billonce runs the command with args, stdin as its standard input, and
// the env's database and Stripe in its environment.
func (e *env) billonce(stdin string, args ...string) result {
	e.t.Helper()
	cmd := e.command(args...)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errb.String()}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("billonce %v: %v", args, err)
	}
	return r
}

// command is the command with args, and the env's database and Stripe in
// its environment. It ends with the test.
func (e *env) command(args ...string) *exec.Cmd {
	cmd := exec.CommandContext(e.t.Context(), os.Args[0], args...)
	cmd.Env = []string{envExec + "=1"}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "DATABASE_URL=") && !strings.HasPrefix(kv, "STRIPE_") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	if e.db != "" {
		cmd.Env = append(cmd.Env, "DATABASE_URL="+e.db)
	}
	if e.fake != nil {
		cmd.Env = append(cmd.Env, "STRIPE_URL="+e.fake.URL, "STRIPE_SECRET_KEY="+e.key)
	}
	cmd.Env = append(cmd.Env, e.extra...)
	return cmd
}

// want fails the test unless r exited with code.
func (r result) want(t *testing.T, code int) result {
	t.Helper()
	if r.code != code {
		t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", r.code, code, r.stdout, r.stderr)
	}
	return r
}

func decode[T any](t *testing.T, s string) T {
	t.Helper()
	var v T
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		t.Fatalf("decoding %q: %v", s, err)
	}
	return v
}

// getClaim reads a claim from the test's database.
func (e *env) getClaim(key string) claim.Claim {
	e.t.Helper()
	st, err := claim.NewPostgres(e.pool, claim.Config{})
	if err != nil {
		e.t.Fatal(err)
	}
	c, err := st.Get(context.Background(), key)
	if err != nil {
		e.t.Fatal(err)
	}
	return c
}

// exec runs SQL on the test's database.
func (e *env) exec(sql string, args ...any) {
	e.t.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.t.Fatal(err)
	}
}

// keyOf returns the key of customer's claim for period at attempt.
func (e *env) keyOf(customer, period string, attempt int) string {
	e.t.Helper()
	var k string
	if err := e.pool.QueryRow(context.Background(), "SELECT key FROM billonce_claims WHERE customer = $1 AND period = $2 AND attempt = $3",
		customer, period, attempt).Scan(&k); err != nil {
		e.t.Fatal(err)
	}
	return k
}

// -h and --help print the usage on standard output and exit 0, for the
// command and every subcommand, and never what the secrets of the
// environment hold.
func TestHelpExitsZeroEverywhere(t *testing.T) {
	t.Parallel()
	secrets := []string{"postgres://billonce:pw_of_the_help_test@127.0.0.1:1/billonce", "sk_test_of_the_help_test", "admin_token_of_the_help_test"}
	e := &env{t: t, extra: []string{"DATABASE_URL=" + secrets[0], "STRIPE_SECRET_KEY=" + secrets[1], "SPENDCAP_ADMIN_TOKEN=" + secrets[2]}}
	for _, args := range [][]string{{"-h"}, {"--help"}, {"help"}} {
		r := e.billonce("", args...).want(t, exitOK)
		if !strings.Contains(r.stdout, "Usage: billonce <command>") {
			t.Errorf("%v: stdout %q lacks the usage", args, r.stdout)
		}
	}
	for name := range commands {
		for _, h := range []string{"-h", "--help"} {
			r := e.billonce("", name, h).want(t, exitOK)
			if !strings.Contains(r.stdout, "Usage: billonce "+name) {
				t.Errorf("%s %s: stdout %q lacks the usage", name, h, r.stdout)
			}
			for _, s := range secrets {
				if strings.Contains(r.stdout+r.stderr, s) {
					t.Errorf("%s %s prints %q", name, h, s)
				}
			}
		}
	}
}

func TestUsageErrorsExitTwo(t *testing.T) {
	t.Parallel()
	e := &env{t: t}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "Usage"},
		{[]string{"bill"}, `unknown command "bill"`},
		{[]string{"run", "-period", "2026-09", "-amount", "100", "-currency", "usd"}, "STRIPE_SECRET_KEY"},
		{[]string{"status", "-period", "2026-09"}, "DATABASE_URL"},
		{[]string{"run"}, "-period required"},
		{[]string{"status", "-period"}, "flag needs an argument"},
		{[]string{"export", "-period", "2026-09", "-format", "xml"}, "use csv or json"},
		{[]string{"resolve", "-key", "k", "-payment", "cus_1"}, "want a PaymentIntent"},
		{[]string{"rebill", "-customer", "c", "-period", "2026-09", "-attempt", "1"}, "numbered from 2"},
	} {
		r := e.billonce("cus_a\n", c.args...).want(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: stderr %q lacks %q", c.args, r.stderr, c.want)
		}
	}
}
