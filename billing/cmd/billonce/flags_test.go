package main

import (
	"net"
	"strings"
	"sync"
	"testing"
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
	for _, c := range []struct {
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
	} {
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
