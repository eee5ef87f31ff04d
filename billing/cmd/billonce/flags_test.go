package main

import (
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// watched is a TCP listener that counts the connections made to it and
// closes each at once.
type watched struct {
	ln   net.Listener
	mu   sync.Mutex
	seen []net.Addr    // remote addresses, in the order accepted
	next chan net.Conn // every connection accepted, in order
}

func watch(t *testing.T) *watched {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	w := &watched{ln: ln}
	t.Cleanup(func() { ln.Close() })
	w.next = make(chan net.Conn, 1000)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				close(w.next)
				return
			}
			w.mu.Lock()
			w.seen = append(w.seen, c.RemoteAddr())
			w.mu.Unlock()
			c.Close()
			w.next <- c
		}
	}()
	return w
}

func (w *watched) addr() string { return w.ln.Addr().String() }

// conns returns how many connections were made before now: it connects
// itself and waits until the listener has accepted that connection, which
// the kernel queues behind every earlier one.
func (w *watched) conns(t *testing.T) int {
	t.Helper()
	c, err := net.Dial("tcp", w.addr())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	for got := range w.next {
		if got.RemoteAddr().String() == c.LocalAddr().String() {
			w.mu.Lock()
			defer w.mu.Unlock()
			return len(w.seen) - 1
		}
	}
	t.Fatal("the listener closed")
	return 0
}

// A flag that cannot work is refused with exit status 2 before anything is
// opened: the database is not connected to, and no vault key is issued,
// for a setting billing would refuse later anyway.
func TestBadFlagsAreRefusedBeforeAnyConnection(t *testing.T) {
	t.Parallel()
	db, proxy := watch(t), watch(t)
	e := &env{t: t, db: "postgres://billonce:pw@" + db.addr() + "/billonce?sslmode=disable",
		extra: []string{"STRIPE_SECRET_KEY=sk_test_flags", "SPENDCAP_ADMIN_TOKEN=admin_token_flags"}}
	vault := []string{"-vault-proxy-url", "http://" + proxy.addr(), "-credential", "acct_test/key"}
	start, end := lastHour()
	usageFile := customersFile(t, usageRow("cus_a", "api_calls", "increments", start, end, 1))
	cases := []struct {
		args []string
		want string
	}{
		{[]string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-concurrency", "5000"}, "Concurrency 5000 is above the limit of 1000"},
		{append([]string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-concurrency", "5000"}, vault...), "Concurrency 5000 is above the limit of 1000"},
		{append([]string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-lease", "1ns"}, vault...), "lease 1ns must be at least 1ms"},
		{append([]string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-scope", "billonce "}, vault...), "Config.Scope"},
		{[]string{"usage", "-file", usageFile, "-concurrency", "5000"}, "Concurrency 5000 is above the limit of 1000"},
		{[]string{"reconcile", "-lease", "1ns"}, "lease 1ns must be at least 1ms"},
		{[]string{"rebill", "-customer", "cus_a", "-period", period, "-attempt", "2", "-scope", "billonce "}, "Config.Scope"},
		{[]string{"rebill", "-customer", "cus_a", "-period", period, "-attempt", "2", "-amount", "100", "-currency", "dollars"}, "currency"},
		{[]string{"rebill", "-customer", "cus_a", "-period", period, "-attempt", "2", "-amount", "100"}, "-amount and -currency go together"},
	}
	// -account is checked as billing checks an account, before anything
	// is opened, wherever it is taken.
	long := "acct_" + strings.Repeat("x", 300)
	for _, args := range [][]string{
		{"run", "-period", period, "-amount", "100", "-currency", "usd"},
		append([]string{"run", "-period", period, "-amount", "100", "-currency", "usd"}, vault...),
		{"run", "-period", period, "-amount", "100", "-currency", "usd", "-invoice"},
		{"usage", "-file", usageFile},
		{"rebill", "-customer", "cus_a", "-period", period, "-attempt", "2"},
		{"transfer", "-period", period, "-amount", "100", "-currency", "usd"},
		{"payout", "-period", period, "-amount", "100", "-currency", "usd"},
		{"status", "-period", period},
		{"inspect", "-customer", "cus_a", "-period", period},
		{"inspect", "-period", period},
		{"export", "-period", period},
	} {
		for _, bad := range []struct{ account, want string }{
			{"", "-account is empty"},
			{" \t ", "-account is empty"},
			{"cus_x", `-account "cus_x": a connected account's id starts with acct_`},
			{"acct_", `-account "acct_": a connected account's id starts with acct_`},
			{" acct_1", "white space"},
			{long, "-account is 305 bytes long; the limit is 255"},
		} {
			cases = append(cases, struct {
				args []string
				want string
			}{append(append([]string{}, args...), "-account", bad.account), bad.want})
		}
	}
	for _, c := range cases {
		r := e.billonce("cus_a\n", c.args...)
		if r.code != exitUsage || !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: exit %d, stderr %q; want %d and %q", c.args, r.code, r.stderr, exitUsage, c.want)
		}
	}
	if n := db.conns(t); n != 0 {
		t.Errorf("%d connections to the database; want none", n)
	}
	if n := proxy.conns(t); n != 0 {
		t.Errorf("%d connections to the spend-cap proxy; want none", n)
	}
}

// silent is a listener that accepts connections and never answers; it
// returns its address.
func silent(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	return ln.Addr().String()
}

// Every call the command makes itself to another machine ends at its
// bound when that machine accepts the connection and never answers, and
// the error names the bound: a cron job ends and alerts rather than
// waiting for ever. Each machine has a bound of its own (-db-timeout,
// -vault-timeout, -stripe-timeout), so that the test bounds only the one
// that never answers.
func TestEveryCallOfTheCommandEndsAtTheTimeout(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.pendingClaim("cus_p", 300, "cus_a")
	never := silent(t)
	fake := e.fake

	// The spend-cap proxy's admin API, issuing the run's vault key.
	e.fake, e.extra = nil, []string{"SPENDCAP_ADMIN_TOKEN=admin_token_timeout"}
	r := e.billonce("cus_b,100,usd\n", "run", "-period", period, "-vault-proxy-url", "http://"+never, "-credential", "acct_test/key", "-vault-timeout", "50ms").want(t, exitStopped)
	if !strings.Contains(r.stderr, "spend-cap proxy") || !strings.Contains(r.stderr, "no answer within 50ms (-vault-timeout)") {
		t.Errorf("run through a proxy that never answers: stderr %q; want the proxy and the bound named", r.stderr)
	}
	billingtest.RequireNotCharged(t, fake, "cus_b", period)

	// Stripe, read by resolve.
	e.fake, e.extra = fake, []string{"STRIPE_URL=http://" + never}
	r = e.billonce("", "resolve", "-key", key, "-payment", "ch_1", "-stripe-timeout", "50ms").want(t, exitStopped)
	if !strings.Contains(r.stderr, "Stripe") || !strings.Contains(r.stderr, "no answer within 50ms (-stripe-timeout)") {
		t.Errorf("resolve against a Stripe that never answers: stderr %q; want Stripe and the bound named", r.stderr)
	}

	// The database, for every subcommand.
	e.db, e.extra = "postgres://billonce:pw@"+never+"/billonce?sslmode=disable", nil
	for _, args := range [][]string{
		{"migrate"},
		{"run", "-period", period},
		{"status", "-period", period},
		{"export", "-period", period},
		{"inspect", "-key", key},
	} {
		r := e.billonce("cus_c,100,usd\n", append(args, "-db-timeout", "50ms")...).want(t, exitStopped)
		if !strings.Contains(r.stderr, "the database") || !strings.Contains(r.stderr, "no answer within 50ms (-db-timeout)") || strings.Contains(r.stderr, ":pw@") {
			t.Errorf("%s against a database that never answers: stderr %q; want the database (without its password) and the bound named", args[0], r.stderr)
		}
	}
	billingtest.RequireNotCharged(t, fake, "cus_c", period)
}
