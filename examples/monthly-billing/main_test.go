package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

func TestMain(m *testing.M) {
	// The program reads these; the tests pass everything as flags.
	os.Unsetenv("DATABASE_URL")
	os.Unsetenv("STRIPE_SECRET_KEY")
	os.Unsetenv("VAULT_PROXY_URL")
	os.Unsetenv("VAULT_KEY")
	pgtest.Main(m)
}

const period = "2026-09"

type result struct {
	code           int
	stdout, stderr string
}

func runMain(t *testing.T, args ...string) result {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, &out, &errb)
	return result{code, out.String(), errb.String()}
}

// fakeStripe starts a fake Stripe for one test.
func fakeStripe(t *testing.T, cfg billingtest.Config) *billingtest.Server {
	t.Helper()
	srv := billingtest.NewServer(cfg)
	t.Cleanup(srv.Close)
	return srv
}

func decodeReport(t *testing.T, r result) reportJSON {
	t.Helper()
	var rep reportJSON
	dec := json.NewDecoder(strings.NewReader(r.stdout))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&rep); err != nil {
		t.Fatalf("stdout is not one JSON report: %v\nstdout:\n%s\nstderr:\n%s", err, r.stdout, r.stderr)
	}
	if dec.More() {
		t.Fatalf("stdout holds more than one JSON value:\n%s", r.stdout)
	}
	return rep
}

// assertOnce checks at the fake that each customer was charged exactly once
// for period, and that nobody else was charged.
func assertOnce(t *testing.T, srv *billingtest.Server, customers []string) {
	t.Helper()
	for _, c := range customers {
		if n := srv.CountPeriod(c, period); n != 1 {
			t.Errorf("customer %s charged %d times for %s; want 1", c, n, period)
		}
	}
	if paid := srv.Stats().Paid; paid != int64(len(customers)) {
		t.Errorf("the fake holds %d paid charges; want %d", paid, len(customers))
	}
}

func demoIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = demoID(i+1, n)
	}
	return ids
}

// The demo, as run with no Stripe flags: the program's own fake, its own
// second run and its own ledger check, reported as JSON.
func TestDemoBillsEveryoneOnceAndTheSecondRunCreatesNothing(t *testing.T) {
	t.Parallel()
	r := runMain(t, "-database-url", pgtest.URL(t), "-customers", "200", "-rate", "-1", "-period", period, "-json")
	if r.code != exitOK {
		t.Fatalf("exit %d; want 0\nstderr:\n%s", r.code, r.stderr)
	}
	rep := decodeReport(t, r)
	if rep.Status != "complete" || rep.Run == nil || rep.SecondRun == nil || rep.Ledger == nil {
		t.Fatalf("report %+v: want status complete with run, second run and ledger", rep)
	}
	if rep.Run.Created != 200 || rep.Run.Customers != 200 {
		t.Errorf("first run created %d of %d; want 200 of 200", rep.Run.Created, rep.Run.Customers)
	}
	if rep.SecondRun.Created != 0 || rep.SecondRun.AlreadyBilled != 200 || *rep.SecondRunRequests != 0 {
		t.Errorf("second run created %d, already billed %d, sent %d requests; want 0, 200, 0",
			rep.SecondRun.Created, rep.SecondRun.AlreadyBilled, *rep.SecondRunRequests)
	}
	if want := (ledger{Customers: 200, Once: 200, OK: true}); *rep.Ledger != want {
		t.Errorf("ledger %+v; want %+v", *rep.Ledger, want)
	}
	if !strings.Contains(r.stderr, "100% 200/200") {
		t.Errorf("stderr has no final progress line:\n%s", r.stderr)
	}
}

// The same, counted at a fake the test owns: two runs of the program, every
// demo customer charged exactly once.
func TestTwoRunsChargeEveryCustomerOnceAtTheFake(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	db := pgtest.URL(t)
	args := []string{"-database-url", db, "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers", "150", "-rate", "-1", "-period", period}
	if r := runMain(t, args...); r.code != exitOK || !strings.Contains(r.stdout, "created           150") {
		t.Fatalf("first run: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	before := srv.Stats().Requests
	r := runMain(t, append(args, "-json")...)
	if r.code != exitOK {
		t.Fatalf("second run: exit %d\n%s", r.code, r.stderr)
	}
	if rep := decodeReport(t, r); rep.Run.Created != 0 || rep.Run.AlreadyBilled != 150 || rep.SecondRun != nil {
		t.Errorf("second run: %+v; want created 0, already billed 150, no demo rerun against a real Stripe URL", rep.Run)
	}
	if d := srv.Stats().Requests - before; d != 0 {
		t.Errorf("the second run sent %d requests to Stripe; want 0", d)
	}
	assertOnce(t, srv, demoIDs(150))
}

// The whole default path: no database flag, so a throwaway PostgreSQL.
func TestNoFlagsStartsItsOwnDatabaseAndFake(t *testing.T) {
	t.Parallel()
	r := runMain(t, "-customers", "20", "-rate", "-1")
	if r.code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	for _, want := range []string{"in-process fake Stripe", "throwaway PostgreSQL", "20 charged exactly once, 0 more than once", "every customer is billed for " + time.Now().UTC().Format("2006-01")} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("stdout lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestDemoDeclinesExitNonZeroAndSayWhatToDo(t *testing.T) {
	t.Parallel()
	r := runMain(t, "-database-url", pgtest.URL(t), "-customers", "30", "-demo-declines", "3", "-rate", "-1", "-period", period, "-json")
	if r.code != exitIncomplete {
		t.Fatalf("exit %d; want %d\nstderr:\n%s", r.code, exitIncomplete, r.stderr)
	}
	rep := decodeReport(t, r)
	if rep.Status != "incomplete" || rep.Run.Declined != 3 || rep.Run.Created != 27 || rep.SecondRun.Created != 0 || rep.SecondRun.Declined != 3 {
		t.Errorf("report %+v run %+v second %+v", rep, rep.Run, rep.SecondRun)
	}
	if want := (ledger{Customers: 30, Once: 27, NotCharged: 3, OK: true}); *rep.Ledger != want {
		t.Errorf("ledger %+v; want %+v", *rep.Ledger, want)
	}
	if !strings.Contains(r.stderr, "3 declined") || !strings.Contains(r.stderr, "Rebill") {
		t.Errorf("stderr does not say what to do about declines:\n%s", r.stderr)
	}
	// Each failure is an object naming the customer, its key and attempt,
	// the kind, and Stripe's codes and request id.
	declined := map[string]bool{}
	for _, i := range demoDeclined(3, 30) {
		declined[demoID(i, 30)] = true
	}
	if len(rep.Run.Failures) != 3 {
		t.Fatalf("failures %+v; want the 3 declined", rep.Run.Failures)
	}
	for _, f := range rep.Run.Failures {
		if !declined[f.Customer] || f.Period != period || f.Key == "" || f.Attempt != 1 || f.Kind != "declined" ||
			f.StripeCode != "card_declined" || f.DeclineCode != "insufficient_funds" || f.RequestID == "" || f.Message == "" {
			t.Errorf("failure %+v; want a declined demo customer of %s with its key, attempt 1, card_declined (insufficient_funds) and a request id", f, period)
		}
	}
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "customers.csv")
	if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestCustomersFileBillsEachRowAtItsPrice(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	file := writeFile(t, "customer,amount,currency,payment_method\ncus_a,2500,usd\ncus_b, 1200 ,EUR,pm_1\n# a comment\n\"cus_c\",99,jpy\n")
	r := runMain(t, "-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers-file", file, "-period", period)
	if r.code != exitOK {
		t.Fatalf("exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	assertOnce(t, srv, []string{"cus_a", "cus_b", "cus_c"})
	got := map[string]string{}
	for _, p := range srv.Payments() {
		got[p.Customer] = fmt.Sprintf("%d %s", p.Amount, p.Currency)
	}
	want := map[string]string{"cus_a": "2500 usd", "cus_b": "1200 eur", "cus_c": "99 jpy"}
	for c, w := range want {
		if got[c] != w {
			t.Errorf("customer %s charged %q; want %q", c, got[c], w)
		}
	}
}

// Every bad file is refused before the database or Stripe is touched: the
// database URL points nowhere, and the fake must see no request.
func TestBadCustomersFileFailsBeforeAnything(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	nowhere := "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1"
	good := "cus_1,100,usd\n"
	for _, tc := range []struct {
		name, content, want string
		extra               []string
	}{
		{"malformed quote", good + "cus_2,\"100,usd\n", ":2: malformed CSV", nil},
		{"too few columns", good + good[:0] + "cus_2,100,usd\ncus_3,100\n", ":3: 2 columns", nil},
		{"negative amount", "customer,amount,currency\n" + good + "cus_2,-5,usd\n", ":3: customer cus_2: amount -5: must be a positive number of the currency's smallest unit (cents)\n", nil},
		{"zero amount", good + "cus_2,0,usd\n", ":2: customer cus_2: amount 0: must be a positive number", nil},
		{"amount too large", good + "cus_2,100000000,usd\n", ":2: customer cus_2: amount 100000000 is above Stripe's largest amount 99999999\n", nil},
		{"decimal amount", good + "cus_2,25.00,usd\n", ":2: customer cus_2: amount \"25.00\" is not a whole number", nil},
		{"unknown currency", good + "cus_2,100,usx\n", ":2: customer cus_2: currency \"usx\" is not a currency Stripe charges in; use a three-letter ISO code such as usd or eur\n", nil},
		{"space in id", good + "cus 2,100,usd\n", ":2: customer ID \"cus 2\" contains white space, control characters or invalid UTF-8\n", nil},
		{"empty id", good + ",100,usd\n", ":2: customer ID is empty\n", nil},
		{"long id", good + strings.Repeat("c", 256) + ",100,usd\n", ":2: customer ID is 256 bytes long; the limit is 255\n", nil},
		{"bad payment method", "cus_1,100,usd,pm 1\n", ":1: customer cus_1: payment method \"pm 1\" contains white space", []string{"-api", "payment_intents"}},
		{"duplicate customer", good + "cus_2,100,usd\ncus_1,100,usd\n", ":3: customer cus_1 is listed again (first on line 1)", nil},
		{"empty file", "customer,amount,currency\n", ": no customers in the file", nil},
		{"payment intents without method", good, ":1: customer cus_1: -api payment_intents needs a payment method", []string{"-api", "payment_intents"}},
		{"payment method by invoice", good + "cus_2,100,usd,pm_1\n", ":2: customer cus_2: a payment method is not used by -by invoice", []string{"-by", "invoice"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			file := writeFile(t, tc.content)
			args := append([]string{"-database-url", nowhere, "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers-file", file}, tc.extra...)
			r := runMain(t, args...)
			if r.code != exitUsage {
				t.Errorf("exit %d; want %d\nstderr:\n%s", r.code, exitUsage, r.stderr)
			}
			if !strings.Contains(r.stderr, "monthly-billing: "+file+tc.want) || strings.Contains(r.stderr, "invalid input") {
				t.Errorf("stderr lacks %q after the file name, or repeats billing's \"invalid input\":\n%s", tc.want, r.stderr)
			}
			if !strings.Contains(r.stderr, "nothing was charged") {
				t.Errorf("stderr does not say nothing was charged:\n%s", r.stderr)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		r := runMain(t, "-database-url", nowhere, "-customers-file", filepath.Join(t.TempDir(), "nope.csv"))
		if r.code != exitUsage || !strings.Contains(r.stderr, "cannot open the customers file") {
			t.Errorf("exit %d, stderr:\n%s", r.code, r.stderr)
		}
	})
	if n := srv.Stats().Requests; n != 0 {
		t.Errorf("the fake saw %d requests; want 0", n)
	}
}

// -h, -help and --help print the flags on stdout and exit 0 before
// anything is touched (the database URL points nowhere); a bad flag prints
// them on stderr and exits 2.
func TestHelpGoesToStdout(t *testing.T) {
	t.Setenv("DATABASE_URL", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1")
	for _, h := range []string{"-h", "-help", "--help"} {
		if r := runMain(t, h); r.code != exitOK || !strings.Contains(r.stdout, "-database-url") || r.stderr != "" {
			t.Errorf("%s: exit %d; want 0 and the flags on stdout alone\nstdout:\n%s\nstderr:\n%s", h, r.code, r.stdout, r.stderr)
		}
	}
	if r := runMain(t, "-nope"); r.code != exitUsage || !strings.Contains(r.stderr, "-database-url") || r.stdout != "" {
		t.Errorf("-nope: exit %d; want 2 and the flags on stderr alone\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
}

func TestBadFlagsFailWithAClearMessage(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-stripe-url", srv.URL}, "-stripe-url is set but there is no key"},
		{[]string{"-stripe-url", "api.stripe.com", "-stripe-key", "sk_test_x"}, "want an absolute http or https URL"},
		{[]string{"-api", "invoices"}, `-api "invoices": use charges or payment_intents`},
		{[]string{"-period", "2026-13"}, "use a month like 2026-09"},
		{[]string{"-customers", "0"}, "-customers 0: want at least 1"},
		{[]string{"-customers", "5", "-customers-file", "x.csv"}, "both given"},
		{[]string{"-demo-declines", "2", "-stripe-url", srv.URL, "-stripe-key", "sk_test_x"}, "-demo-declines works only with the in-process fake"},
		{[]string{"-demo-declines", "11", "-customers", "10"}, "want 0 to 10"},
		{[]string{"-demo-bank-debits", "11", "-customers", "10"}, "want 0 to 10"},
		{[]string{"-webhook-addr", "127.0.0.1:0", "-stripe-url", srv.URL, "-stripe-key", "sk_test_x"}, "no signing secret"},
		{[]string{"-rate", "0"}, "-rate 0 would never send anything"},
		{[]string{"-concurrency", "-1"}, "-concurrency -1"},
		{[]string{"extra"}, `unexpected argument "extra"`},
		{[]string{"-nope"}, "flag provided but not defined: -nope"},
		{[]string{"-database-url", "::not a url", "-stripe-url", srv.URL, "-stripe-key", "sk_test_x"}, "connection string does not parse"},
		{[]string{"-vault-proxy-url", srv.URL}, "-vault-proxy-url is set but there is no vault key: pass -vault-key or set VAULT_KEY"},
		{[]string{"-vault-key", "vk_x"}, "-vault-key is set but there is no proxy: pass -vault-proxy-url or set VAULT_PROXY_URL"},
		{[]string{"-vault-proxy-url", srv.URL, "-vault-key", "vk_x", "-stripe-key", "sk_test_x"}, "behind the proxy this process needs no Stripe secret"},
		{[]string{"-vault-proxy-url", srv.URL, "-vault-key", "vk_x", "-stripe-url", srv.URL}, "-stripe-url and -vault-proxy-url both given"},
		{[]string{"-vault-proxy-url", "http://proxy.example.com", "-vault-key", "vk_x"}, `-vault-proxy-url "http://proxy.example.com" is plain http on a non-loopback host, which would send the vault key in clear text; use https` + "\n"},
		{[]string{"-vault-proxy-url", "https://u:p@proxy.example.com", "-vault-key", "vk_x"}, "-vault-proxy-url carries user info"},
		{[]string{"-vault-proxy-url", srv.URL, "-vault-key", "vk x"}, "-vault-key contains white space"},
		{[]string{"-vault-proxy-url", srv.URL, "-vault-key", "vk_x", "-demo-declines", "1"}, "-demo-declines works only with the in-process fake"},
		{[]string{"-by", "card"}, `-by "card": use charge or invoice`},
		{[]string{"-by", "invoice", "-api", "payment_intents"}, "Stripe pays an invoice itself"},
		{[]string{"-by", "invoice", "-vault-proxy-url", srv.URL, "-vault-key", "vk_x"}, "paying an invoice carries none"},
		{[]string{"-by", "invoice", "-demo-bank-debits", "1"}, "-demo-bank-debits bills by charge"},
		{[]string{"-usage", "-stripe-url", srv.URL, "-stripe-key", "sk_test_x"}, "-usage reports demo usage"},
	} {
		r := runMain(t, tc.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, tc.want) {
			t.Errorf("%q: exit %d; want %d and %q in stderr:\n%s", tc.args, r.code, exitUsage, tc.want, r.stderr)
		}
	}
	if n := srv.Stats().Requests; n != 0 {
		t.Errorf("the fake saw %d requests; want 0", n)
	}
	// A database that does not answer is no usage error: the program
	// stopped early, exit 1.
	if r := runMain(t, "-database-url", "postgres://nobody@127.0.0.1:1/none?sslmode=disable&connect_timeout=1", "-stripe-url", srv.URL, "-stripe-key", "sk_test_x"); r.code != exitStopped || !strings.Contains(r.stderr, "cannot reach the database") {
		t.Errorf("unreachable database: exit %d; want %d and \"cannot reach the database\" in stderr:\n%s", r.code, exitStopped, r.stderr)
	}
	// -json reports input errors as JSON too.
	r := runMain(t, "-json", "-period", "soon")
	if rep := decodeReport(t, r); rep.Status != "invalid_input" || rep.ExitCode != exitUsage || !strings.Contains(rep.Error, "soon") {
		t.Errorf("report %+v", rep)
	}
}

func TestStripeKeyIsNeverPrinted(t *testing.T) {
	const (
		secret      = "sk_test_S3CR3T0123456789abcdef"
		vaultSecret = "vk_V4ULT0123456789abcdef"
	)
	t.Setenv("STRIPE_SECRET_KEY", secret)
	// The fake accepts another key only, so the run fails with Stripe's 401;
	// the proxy knows no vault key, so it refuses with its own 401.
	srv := fakeStripe(t, billingtest.Config{APIKeys: []string{"sk_test_other"}})
	proxy := spendcaptest.NewProxy(spendcaptest.Config{Upstream: srv.URL, StripeKey: "sk_test_other"})
	t.Cleanup(proxy.Close)
	db := pgtest.URL(t)
	check := func(args []string, code int, want ...string) {
		t.Helper()
		r := runMain(t, args...)
		if strings.Contains(r.stdout+r.stderr, "S3CR3T") || strings.Contains(r.stdout+r.stderr, "V4ULT") {
			t.Errorf("%q printed a secret key:\nstdout:\n%s\nstderr:\n%s", args, r.stdout, r.stderr)
		}
		if r.code != code {
			t.Errorf("%q: exit %d; want %d\n%s\n%s", args, r.code, code, r.stdout, r.stderr)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout+r.stderr, w) {
				t.Errorf("%q: output lacks %q:\n%s\n%s", args, w, r.stdout, r.stderr)
			}
		}
	}
	refused := []string{"Stripe refused the key", "sk_test_****"}
	check([]string{"-h"}, exitOK)
	check([]string{"-database-url", db, "-stripe-url", srv.URL, "-customers", "5", "-period", period}, exitStopped, refused...)
	check([]string{"-database-url", db, "-stripe-url", srv.URL, "-customers", "5", "-period", period, "-json"}, exitStopped, refused...)
	check([]string{"-database-url", db, "-stripe-url", srv.URL, "-stripe-key", secret, "-customers", "5", "-period", "bad"}, exitUsage)

	// The vault key, from the environment and from the flag.
	t.Setenv("VAULT_KEY", vaultSecret)
	// Another period: the claims the direct runs left pending were sent with
	// the Stripe key, and a Biller behind the proxy would not resend them.
	vault := []string{"-database-url", db, "-vault-proxy-url", proxy.URL, "-customers", "5", "-period", "2026-10"}
	check(vault, exitUsage, "behind the proxy this process needs no Stripe secret")
	t.Setenv("STRIPE_SECRET_KEY", "")
	revoked := []string{"no longer accepts the vault key", "vault key ****"}
	check(vault, exitStopped, revoked...)
	check(append(vault, "-json"), exitStopped, revoked...)
	check(append(vault, "-h"), exitOK)
	t.Setenv("VAULT_KEY", "")
	check(append(vault, "-vault-key", vaultSecret), exitStopped, revoked...)
	check(append(vault, "-vault-key", vaultSecret, "-period", "bad"), exitUsage)

	if paid := srv.Stats().Paid; paid != 0 {
		t.Errorf("%d charges with a refused key", paid)
	}
	if n := len(proxy.Log()); n == 0 {
		t.Errorf("no request reached the proxy; the vault runs did not test what they claim")
	}
}

// Behind a spend-cap proxy the run stops at the vault key's cap, having
// charged no more than it; with the cap raised, the next run bills the rest,
// everyone exactly once.
func TestVaultProxyCapStopsTheRunAndARerunFinishes(t *testing.T) {
	const (
		stripeSecret = "sk_test_held_by_the_proxy"
		firstKey     = "vk_run_2026_09_first_0123456789"
		secondKey    = "vk_run_2026_09_second_0123456789"
		n            = 100
		capAmount    = 100_000 // $1,000 of the 100 customers' $2,566
	)
	// Stripe accepts only the proxy's secret: the process has none to send.
	srv := fakeStripe(t, billingtest.Config{APIKeys: []string{stripeSecret}})
	proxy := spendcaptest.NewProxy(spendcaptest.Config{Upstream: srv.URL, StripeKey: stripeSecret})
	t.Cleanup(proxy.Close)
	proxy.IssueKey(firstKey, spendcap.Key{CapAmount: capAmount})

	args := []string{"-database-url", pgtest.URL(t), "-vault-proxy-url", proxy.URL,
		"-customers", strconv.Itoa(n), "-rate", "-1", "-period", period}
	r := runMain(t, append(args, "-vault-key", firstKey, "-json")...)
	if r.code != exitStopped {
		t.Fatalf("capped run: exit %d; want %d\n%s\n%s", r.code, exitStopped, r.stdout, r.stderr)
	}
	rep := decodeReport(t, r)
	if rep.Status != "stopped" || len(rep.Advice) != 1 || !strings.Contains(rep.Advice[0], "the spend cap of the vault key is reached") ||
		!strings.Contains(rep.Error, `spend-cap proxy refused POST `+proxy.URL+`/v1/charges with 429 "Spend cap of $1000 for this key reached"`) {
		t.Errorf("report: status %q, error %q, advice %q; want stopped, with the spend cap named", rep.Status, rep.Error, rep.Advice)
	}
	if !strings.Contains(r.stderr, "monthly-billing: the spend cap of the vault key is reached") {
		t.Errorf("stderr does not name the spend cap:\n%s", r.stderr)
	}
	var charged int64
	for _, p := range srv.Payments() {
		if p.Paid {
			charged += p.Amount
		}
	}
	paid := srv.Stats().Paid
	if charged > capAmount || paid == 0 || paid >= n {
		t.Errorf("the capped run charged %d customers, %d cents; want some but not all, at most %d cents", paid, charged, capAmount)
	}
	// Requests in flight when the run stopped may have charged without the
	// run hearing back: those customers are pending, and the next run gets
	// Stripe's replay.
	if created := int64(rep.Run.Created); created > paid || created+int64(rep.Run.Pending) < paid {
		t.Errorf("the report says %d created, %d pending; the fake holds %d paid charges", rep.Run.Created, rep.Run.Pending, paid)
	}
	for _, id := range demoIDs(n) {
		if c := srv.CountPeriod(id, period); c > 1 {
			t.Errorf("customer %s charged %d times", id, c)
		}
	}
	t.Logf("capped run: %d customers charged, $%d.%02d under a $%d cap; the run counted %d created, %d pending",
		paid, charged/100, charged%100, capAmount/100, rep.Run.Created, rep.Run.Pending)

	// A new key with room for the rest, from the environment this time.
	proxy.IssueKey(secondKey, spendcap.Key{CapAmount: 10 * capAmount})
	t.Setenv("VAULT_KEY", secondKey)
	if r := runMain(t, args...); r.code != exitOK || !strings.Contains(r.stdout, fmt.Sprintf("already billed %6d", rep.Run.Created)) {
		t.Fatalf("rerun: exit %d; want 0 with %d already billed\n%s\n%s", r.code, rep.Run.Created, r.stdout, r.stderr)
	}
	assertOnce(t, srv, demoIDs(n))
	for _, e := range proxy.Log() {
		if e.KeyID != spendcap.KeyID(firstKey) && e.KeyID != spendcap.KeyID(secondKey) {
			t.Errorf("the proxy saw a request with another credential (%s)", e.KeyID)
		}
	}
}

func TestLockHeldByAnotherRunner(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	db := pgtest.URL(t)
	pool, err := pgxpool.New(context.Background(), db)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billonce"})
	if err != nil {
		t.Fatal(err)
	}
	held, err := guard.Lock(context.Background(), "billonce-run:billonce:"+period)
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"-database-url", db, "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers", "10", "-period", period}
	r := runMain(t, args...)
	if r.code != exitLockHeld || !strings.Contains(r.stderr, "another runner holds the lock") {
		t.Errorf("exit %d; want %d\nstderr:\n%s", r.code, exitLockHeld, r.stderr)
	}
	if n := srv.Stats().Requests; n != 0 {
		t.Errorf("%d requests reached Stripe while the lock was held elsewhere", n)
	}
	held.Unlock(context.Background())
	if r := runMain(t, args...); r.code != exitOK {
		t.Errorf("after the lock is released: exit %d\n%s", r.code, r.stderr)
	}
	assertOnce(t, srv, demoIDs(10))
}

// A changed amount for a customer already billed this period is refused,
// never charged, and the message says so.
func TestChangedAmountIsRefused(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	db := pgtest.URL(t)
	args := []string{"-database-url", db, "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-period", period, "-customers-file"}
	if r := runMain(t, append(args, writeFile(t, "cus_a,100,usd\ncus_b,100,usd\n"))...); r.code != exitOK {
		t.Fatalf("exit %d\n%s", r.code, r.stderr)
	}
	r := runMain(t, append(append([]string{"-json"}, args...), writeFile(t, "cus_a,100,usd\ncus_b,250,usd\n"))...)
	if r.code != exitIncomplete {
		t.Errorf("exit %d; want %d\n%s", r.code, exitIncomplete, r.stderr)
	}
	rep := decodeReport(t, r)
	if got := *rep.Run; got.AlreadyBilled != 1 || got.Invalid != 1 || got.Pending != 0 || got.Created != 0 {
		t.Errorf("run %+v; want already billed 1, invalid 1 (the changed amount), pending 0", got)
	}
	if f := rep.Run.Failures; len(f) != 1 || f[0].Customer != "cus_b" || f[0].Period != period || f[0].Kind != "mismatch" {
		t.Errorf("failures %+v; want cus_b, kind mismatch", f)
	}
	// One piece of advice for the changed amount, and the summary line:
	// nothing about unknown outcomes or other bad input.
	if len(rep.Advice) != 2 || !strings.Contains(rep.Advice[0], "1 customers have an amount or currency that differs from the claim recorded earlier") ||
		!strings.HasPrefix(rep.Advice[1], "not every customer is billed") {
		t.Errorf("advice %q; want the changed-amount advice and the summary line only", rep.Advice)
	}
	assertOnce(t, srv, []string{"cus_a", "cus_b"})
}

// An interrupted run (SIGINT or SIGTERM cancel the context) leaves nothing
// half done: run again and every customer is charged once.
func TestInterruptedRunFinishesOnTheNextRun(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var once sync.Once
	srv := fakeStripe(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.Attempt == 1 && r.Customer == demoID(40, 100) {
			once.Do(cancel)
		}
		return billingtest.Fault{}
	}})
	args := []string{"-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers", "100", "-rate", "-1", "-period", period}
	var out, errb bytes.Buffer
	if code := run(ctx, args, &out, &errb); code != exitStopped || !strings.Contains(errb.String(), "interrupted: run the same command again") {
		t.Fatalf("interrupted run: exit %d\n%s\n%s", code, out.String(), errb.String())
	}
	if paid := srv.Stats().Paid; paid == 0 || paid == 100 {
		t.Fatalf("the interrupted run charged %d customers; want some but not all", paid)
	}
	if r := runMain(t, args...); r.code != exitOK {
		t.Fatalf("rerun: exit %d\n%s", r.code, r.stderr)
	}
	assertOnce(t, srv, demoIDs(100))
}

const helperEnv = "MONTHLY_BILLING_HELPER_ARGS"

// TestHelperProcess is the program itself, for tests that run it as
// separate OS processes.
func TestHelperProcess(t *testing.T) {
	args := os.Getenv(helperEnv)
	if args == "" {
		t.Skip("runs only as a subprocess")
	}
	os.Exit(run(context.Background(), strings.Split(args, "\x1f"), os.Stdout, os.Stderr))
}

func helper(args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperEnv+"="+strings.Join(args, "\x1f"))
	return cmd
}

// Several processes at once against one database and one Stripe bill
// nobody twice, with the lock (one does the work) and without it (the
// claims decide).
func TestSeveralProcessesBillNobodyTwice(t *testing.T) {
	t.Parallel()
	for _, useLock := range []string{"true", "false"} {
		t.Run("lock="+useLock, func(t *testing.T) {
			srv := fakeStripe(t, billingtest.Config{})
			args := []string{"-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_x",
				"-customers", "300", "-rate", "400", "-period", period, "-lock=" + useLock}
			cmds := make([]*exec.Cmd, 3)
			outs := make([]bytes.Buffer, 3)
			for i := range cmds {
				cmds[i] = helper(args...)
				cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
				if err := cmds[i].Start(); err != nil {
					t.Fatal(err)
				}
			}
			codes := map[int]int{}
			for i, c := range cmds {
				c.Wait()
				code := c.ProcessState.ExitCode()
				codes[code]++
				// Without the lock a runner may meet customers another
				// one is charging (exit 1, "run again").
				if code != exitOK && code != exitLockHeld && !(useLock == "false" && code == exitIncomplete) {
					t.Errorf("process %d: exit %d\n%s", i, code, outs[i].String())
				}
			}
			t.Logf("exit codes: %v", codes)
			if r := runMain(t, args...); r.code != exitOK || !strings.Contains(r.stdout, "created             0") {
				t.Errorf("final run: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
			}
			assertOnce(t, srv, demoIDs(300))
		})
	}
}

// SIGKILL in the middle of a run, then run again until done: nobody is
// charged twice. The killed runner's claims wait out their lease (-lease).
func TestKilledRunFinishesWithoutASecondCharge(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	args := []string{"-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_x",
		"-customers", "400", "-rate", "100", "-lease", "2s", "-period", period}
	cmd := helper(args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Waiting on a real process: poll the fake until it has charged 50.
	for srv.Stats().Paid < 50 {
		time.Sleep(10 * time.Millisecond)
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	killedAt := srv.Stats().Paid
	if killedAt >= 400 {
		t.Fatalf("the run finished before it was killed")
	}
	var reruns []int
	for {
		r := runMain(t, args...)
		reruns = append(reruns, r.code)
		if r.code == exitOK {
			break
		}
		if r.code != exitIncomplete || !strings.Contains(r.stderr, "its claims are free at") {
			t.Fatalf("rerun: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
		}
		time.Sleep(200 * time.Millisecond) // the killed runner's leases run out on the database clock
	}
	t.Logf("killed after %d charges; reruns exited %v", killedAt, reruns)
	assertOnce(t, srv, demoIDs(400))
}

func TestRedaction(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"sk_test_abc": "sk_test_****", "rk_live_abc_def": "rk_live_****", "sk_abc": "****", "whatever": "****", "": "****",
	} {
		if got := redactKey(in); got != want {
			t.Errorf("redactKey(%q) = %q; want %q", in, got, want)
		}
	}
	if got := redactURL("postgres://u:hunter2@h/db"); strings.Contains(got, "hunter2") {
		t.Errorf("redactURL kept the password: %s", got)
	}
}

// The shared sample customers file passes the program's check for either
// API, and a run over it bills each customer once at the fake.
func TestSampleCustomersFile(t *testing.T) {
	t.Parallel()
	const path = "../../testdata/customers.csv"
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		if n, err := checkFile(path, api, false); err != nil || n != 5 {
			t.Fatalf("checkFile(%s, %s) = %d, %v; want 5 customers", path, api, n, err)
		}
	}
	srv := fakeStripe(t, billingtest.Config{})
	r := runMain(t, "-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_sample",
		"-customers-file", path, "-period", period, "-json")
	if r.code != 0 {
		t.Fatalf("exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	for i := 1; i <= 5; i++ {
		billingtest.RequireChargedOnce(t, srv, fmt.Sprintf("cus_sample%02d", i), period)
	}
}

// The demo with bank debits: they are processing after the run, settle
// three days later on the fake's clock, and Stripe's events (duplicated,
// out of order) reach the job's webhook; the second run sends nothing,
// reports the one that failed after settlement apart from declines, and
// nobody is charged twice.
func TestDemoBankDebitsSettleThroughTheWebhook(t *testing.T) {
	t.Parallel()
	r := runMain(t, "-database-url", pgtest.URL(t), "-customers", "30", "-demo-bank-debits", "3", "-demo-declines", "1",
		"-rate", "-1", "-period", period, "-json")
	if r.code != exitIncomplete {
		t.Fatalf("exit %d; want 4 (one bank debit failed)\nstderr:\n%s", r.code, r.stderr)
	}
	rep := decodeReport(t, r)
	if rep.Run.Processing != 3 || rep.Run.Created != 26 || rep.Run.Declined != 1 || rep.Run.FailedAfter != 0 {
		t.Errorf("first run = %+v", rep.Run)
	}
	if s := rep.SecondRun; s.Processing != 0 || s.FailedAfter != 1 || s.Declined != 1 || s.AlreadyBilled != 28 || s.Created != 0 {
		t.Errorf("second run = %+v", s)
	}
	if rep.SecondRunRequests == nil || *rep.SecondRunRequests != 0 {
		t.Errorf("the second run sent requests to Stripe: %v", rep.SecondRunRequests)
	}
	if rep.Settlement == nil || rep.Settlement.Events == 0 || rep.Settlement.Statuses[200] != rep.Settlement.Deliveries {
		t.Errorf("settlement = %+v", rep.Settlement)
	}
	if rep.Ledger == nil || !rep.Ledger.OK || rep.Ledger.Once != 28 || rep.Ledger.MoreThanOnce != 0 {
		t.Errorf("ledger = %+v", rep.Ledger)
	}
	if !strings.Contains(strings.Join(rep.Advice, " "), "1 bank debits failed after settlement") {
		t.Errorf("advice = %q", rep.Advice)
	}
	if strings.Contains(r.stderr, "whsec_") {
		t.Errorf("the webhook secret was printed:\n%s", r.stderr)
	}
}

// A Stripe key, a Stripe URL or a spend-cap proxy without a database is a
// usage error, run as a process: a throwaway database would forget the
// claims, and the next run would bill everyone again. Nothing is sent.
// With no credentials at all the demo still starts its own (see
// TestNoFlagsStartsItsOwnDatabaseAndFake). The environment's defaults
// fill the same settings as the flags (TestMain clears them, for every
// process the tests start).
func TestCredentialsWithoutADatabaseAreAUsageError(t *testing.T) {
	srv := fakeStripe(t, billingtest.Config{})
	for _, args := range [][]string{
		{"-stripe-key", "sk_test_x", "-customers", "5"},
		{"-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers", "5"},
		{"-vault-proxy-url", srv.URL, "-vault-key", "vk_x", "-customers", "5"},
	} {
		cmd := helper(args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		err := cmd.Run()
		code := 0
		if cmd.ProcessState != nil {
			code = cmd.ProcessState.ExitCode()
		}
		if code != exitUsage || !strings.Contains(errb.String(), "no database: pass -database-url or set DATABASE_URL") {
			t.Errorf("%q: exit %d (%v); want %d and what to set\nstdout:\n%s\nstderr:\n%s", args, code, err, exitUsage, out.String(), errb.String())
		}
		if strings.Contains(out.String()+errb.String(), "throwaway PostgreSQL") {
			t.Errorf("%q: started a throwaway database", args)
		}
	}
	if n := srv.Stats().Requests; n != 0 {
		t.Errorf("the fake saw %d requests; want 0", n)
	}
}
