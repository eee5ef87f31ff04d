package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/pgtest"
)

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "" { // the program reads these; a replica gets its own
		os.Unsetenv("DATABASE_URL")
		os.Unsetenv("STRIPE_SECRET_KEY")
		os.Unsetenv("SPENDCAP_ADMIN_TOKEN")
	}
	pgtest.Main(m)
}

const helperEnv = "SPEND_CAP_PROXY_HELPER_ARGS"

// TestHelperProcess is the program itself, for tests that run it as
// separate OS processes.
func TestHelperProcess(t *testing.T) {
	args := os.Getenv(helperEnv)
	if args == "" {
		t.Skip("runs only as a subprocess")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	if err := run(ctx, strings.Split(args, "\x1f"), os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "spendcap-proxy:", err)
		os.Exit(1)
	}
	os.Exit(0)
}

type replica struct {
	cmd  *exec.Cmd
	base string
	out  *bytes.Buffer // its standard output, complete once it has exited
	err  *bytes.Buffer // its standard error
	stop func()        // ends it with SIGTERM and waits; safe to call again
}

func (r *replica) printed() string { return r.out.String() + r.err.String() }

// startReplica runs the program as its own process and waits for the
// address it listens on.
func startReplica(t *testing.T, env []string, args ...string) *replica {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(append(os.Environ(), env...), helperEnv+"="+strings.Join(args, "\x1f"))
	r := &replica{cmd: cmd, out: &bytes.Buffer{}, err: &bytes.Buffer{}}
	cmd.Stderr = r.err
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		r.out.WriteString(lines.Text() + "\n")
		if rest, ok := strings.CutPrefix(lines.Text(), "spend-cap proxy on "); ok {
			r.base, _, _ = strings.Cut(rest, " ")
			break
		}
	}
	if r.base == "" {
		cmd.Wait()
		t.Fatalf("the proxy did not start:\n%s", r.printed())
	}
	done := make(chan struct{})
	go func() { // keep reading, so the process never blocks on a write
		for lines.Scan() {
			r.out.WriteString(lines.Text() + "\n")
		}
		close(done)
	}()
	r.stop = sync.OnceFunc(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		if err := cmd.Wait(); err != nil {
			t.Errorf("replica exited with %v:\n%s", err, r.printed())
		}
	})
	t.Cleanup(r.stop)
	return r
}

func call(t *testing.T, method, u, bearer string, form url.Values) (int, map[string]any) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	if form.Get("amount") != "" {
		req.Header.Set("Idempotency-Key", "idem-"+form.Get("customer"))
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Errorf("%s %s: %v", method, u, err)
		return 0, nil
	}
	defer resp.Body.Close()
	var body map[string]any
	json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, body
}

// Two replicas on one database share one budget: 50 concurrent charges at
// the edge of the cap, sent to both, move exactly the cap at the fake
// Stripe and no more. A key revoked on one replica is refused by the
// other; the admin API wants its own token; nothing prints the secret.
func TestTwoReplicasShareOneCap(t *testing.T) {
	const secret = "sk_test_held_by_the_proxy_only_a1b2c3d4e5f6"
	const token = "admin_token_for_the_test"
	const capAmount, amount, requests = 1000, 100, 50
	srv := billingtest.NewServer(billingtest.Config{APIKeys: []string{secret}})
	t.Cleanup(srv.Close)
	db := pgtest.URL(t)
	env := []string{"STRIPE_SECRET_KEY=" + secret, "SPENDCAP_ADMIN_TOKEN=" + token}
	a := startReplica(t, env, "-database-url", db, "-upstream", srv.URL)
	b := startReplica(t, env, "-database-url", db, "-upstream", srv.URL)

	if st, _ := call(t, "POST", a.base+"/admin/keys", secret, url.Values{"cap": {"5"}}); st != http.StatusUnauthorized {
		t.Errorf("admin API with the Stripe secret as token: status %d; want 401", st)
	}
	st, issued := call(t, "POST", a.base+"/admin/keys", token, url.Values{"cap": {fmt.Sprint(capAmount)}, "allow": {"POST /v1/charges"}, "label": {"test"}})
	if st != http.StatusOK {
		t.Fatalf("issuing a key: %d %v", st, issued)
	}
	vk, _ := issued["vault_key"].(string)
	id, _ := issued["key_id"].(string)

	var wg sync.WaitGroup
	statuses := make([]int, requests)
	for i := range requests {
		wg.Go(func() {
			base := []string{a.base, b.base}[i%2]
			statuses[i], _ = call(t, "POST", base+"/v1/charges", vk,
				url.Values{"amount": {fmt.Sprint(amount)}, "currency": {"usd"}, "customer": {fmt.Sprintf("cus_%02d", i)}})
		})
	}
	wg.Wait()
	var ok, refused int
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			refused++
		}
	}
	var upstream int64
	var paid int
	for _, p := range srv.Payments() {
		if p.Paid {
			upstream += p.Amount
			paid++
		}
	}
	t.Logf("%d requests of %d at a cap of %d over 2 replicas: %d answered 200, %d refused at the cap; %d payments, %d moved at the fake Stripe",
		requests, amount, capAmount, ok, refused, paid, upstream)
	if upstream > capAmount {
		t.Errorf("%d moved at the fake Stripe; cap %d", upstream, capAmount)
	}
	if upstream != capAmount || ok != capAmount/amount || refused != requests-ok {
		t.Errorf("want exactly %d charges of %d and the rest refused at the cap", capAmount/amount, amount)
	}

	if st, body := call(t, "DELETE", b.base+"/admin/keys/"+id, token, nil); st != http.StatusOK {
		t.Fatalf("revoking on the other replica: %d %v", st, body)
	}
	if st, _ := call(t, "POST", a.base+"/v1/charges", vk, url.Values{"amount": {"1"}, "currency": {"usd"}, "customer": {"cus_late"}}); st != http.StatusUnauthorized {
		t.Errorf("a revoked key: status %d; want 401", st)
	}
	if st, _ := call(t, "DELETE", b.base+"/admin/keys/vk_unknown", token, nil); st != http.StatusNotFound {
		t.Errorf("revoking an unknown key: status %d; want 404", st)
	}

	for _, r := range []*replica{a, b} {
		r.stop() // all it printed is in r.out and r.err once it has exited
		if strings.Contains(r.printed(), secret) || strings.Contains(r.printed(), vk) {
			t.Errorf("a replica printed the Stripe secret or the vault key:\n%s", r.printed())
		}
	}
}

// callAuth is call with the Authorization header given whole ("" for
// none); it returns the answer's body as text too.
func callAuth(t *testing.T, method, u, authorization string, form url.Values) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, u, strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if authorization != "" {
		req.Header.Set("Authorization", authorization)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, u, err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	b.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header, b.String()
}

// The admin API issues a key only with an allowlist, takes its token only
// with the Bearer scheme, and hands a vault key out once: in the answer
// that issues it, never in a later answer, an error or the log.
func TestAdminAPI(t *testing.T) {
	const secret = "sk_test_held_by_the_proxy_only_f6e5d4c3b2a1"
	const token = "admin_token_for_the_admin_test"
	srv := billingtest.Start(t, billingtest.Config{APIKeys: []string{secret}})
	px := startReplica(t, []string{"STRIPE_SECRET_KEY=" + secret, "SPENDCAP_ADMIN_TOKEN=" + token},
		"-database-url", pgtest.URL(t), "-upstream", srv.URL)
	keys := px.base + "/admin/keys"
	issue := url.Values{"cap": {"1000"}, "allow": {"POST /v1/charges"}, "expires_in": {"1h"}}

	t.Run("NoAllowlistIsRefused", func(t *testing.T) {
		st, _, body := callAuth(t, "POST", keys, "Bearer "+token, url.Values{"cap": {"1000"}})
		if st != http.StatusBadRequest || !strings.Contains(body, "allow") || strings.Contains(body, "vault_key") {
			t.Errorf("a key with no allowlist: %d %s; want 400 naming allow, and no key", st, body)
		}
	})

	t.Run("TokenOnlyWithBearerScheme", func(t *testing.T) {
		for _, auth := range []string{"", token, "Basic " + token, "Token " + token, "Bearer", "Bearer " + token + "x", "Bearer  " + token} {
			if st, _, body := callAuth(t, "POST", keys, auth, issue); st != http.StatusUnauthorized || strings.Contains(body, token) {
				t.Errorf("Authorization %q: %d %s; want 401 without the token", auth, st, body)
			}
		}
		if st, _, body := callAuth(t, "POST", keys, "bearer "+token, issue); st != http.StatusOK {
			t.Errorf("the scheme in lower case: %d %s; want 200 (the scheme's name is case-insensitive)", st, body)
		}
	})

	t.Run("VaultKeyOnlyInTheIssueAnswer", func(t *testing.T) {
		st, h, body := callAuth(t, "POST", keys, "Bearer "+token, issue)
		var issued struct {
			VaultKey string `json:"vault_key"`
			KeyID    string `json:"key_id"`
		}
		json.Unmarshal([]byte(body), &issued)
		if st != http.StatusOK || !strings.HasPrefix(issued.VaultKey, "vault_") || !strings.HasPrefix(issued.KeyID, "vk_") {
			t.Fatalf("issuing: %d %s", st, body)
		}
		if h.Get("Cache-Control") != "no-store" {
			t.Errorf("the issue answer's Cache-Control is %q; want no-store", h.Get("Cache-Control"))
		}
		vk := issued.VaultKey
		var later []string
		for _, c := range []struct {
			method, url, auth string
			form              url.Values
		}{
			{"POST", keys, "Bearer " + vk, issue}, // the vault key as admin token
			{"DELETE", keys + "/" + issued.KeyID, vk, nil},
			{"POST", px.base + "/v1/refunds", "Bearer " + vk, url.Values{"charge": {"ch_1"}}}, // not allowed
			{"POST", keys, "Bearer " + token, url.Values{"cap": {"-1"}, "allow": {"POST /v1/charges"}}},
			{"DELETE", keys + "/" + issued.KeyID, "Bearer " + token, nil},
			{"DELETE", keys + "/" + issued.KeyID, "Bearer " + token, nil},                                                              // twice
			{"POST", px.base + "/v1/charges", "Bearer " + vk, url.Values{"amount": {"1"}, "currency": {"usd"}, "customer": {"cus_1"}}}, // revoked
		} {
			st, _, body := callAuth(t, c.method, c.url, c.auth, c.form)
			later = append(later, fmt.Sprintf("%s %s: %d %s", c.method, c.url, st, body))
		}
		if st, _, _ := callAuth(t, "POST", px.base+"/v1/charges", "Bearer "+vk, url.Values{"amount": {"1"}, "currency": {"usd"}, "customer": {"cus_1"}}); st != http.StatusUnauthorized {
			t.Errorf("the revoked key: %d; want 401", st)
		}
		px.stop()
		for _, s := range append(later, px.printed()) {
			if strings.Contains(s, vk) || strings.Contains(s, secret) || strings.Contains(s, token) {
				t.Errorf("the vault key, the Stripe secret or the admin token after issuing:\n%s", s)
			}
		}
	})
}

// -h prints the flags on standard output and touches nothing; a mistake in
// the command line is a usage error (exit status 2 in main).
func TestHelpAndUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"-h"}, {"-help"}, {"--help"}} {
		var out bytes.Buffer
		if err := run(context.Background(), args, &out); !errors.Is(err, flag.ErrHelp) || !strings.Contains(out.String(), "-database-url") {
			t.Errorf("run(%q) = %v, output %q; want the flags on standard output", args, err, out.String())
		}
	}
	for _, args := range [][]string{{"-nope"}, {"extra"}} {
		var out bytes.Buffer
		var u usageError
		if err := run(context.Background(), args, &out); !errors.As(err, &u) {
			t.Errorf("run(%q) = %v; want a usage error", args, err)
		}
	}
}

// A database that accepts connections and never answers stops the proxy
// at its start within -db-timeout, with an error that names the bound and
// not the password, instead of a server that never comes up and never
// says why.
func TestStartEndsAtTheTimeoutOnADatabaseThatNeverAnswers(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	held := make(chan net.Conn, 100)
	t.Cleanup(func() {
		ln.Close()
		close(held)
		for c := range held {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			held <- c
		}
	}()
	t.Setenv("STRIPE_SECRET_KEY", "sk_test_held_by_the_proxy_timeout")
	var out bytes.Buffer
	err = run(context.Background(), []string{"-database-url", "postgres://proxy:pw_of_the_db@" + ln.Addr().String() + "/proxy?sslmode=disable", "-db-timeout", "50ms"}, &out)
	if err == nil || !strings.Contains(err.Error(), "the database gave no answer within 50ms (-db-timeout)") || strings.Contains(err.Error()+out.String(), "pw_of_the_db") {
		t.Errorf("run = %v, printed %q; want an error naming the database and the bound, not the password", err, out.String())
	}
}
