package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

// TestMain runs the program itself when the test re-executes its own binary
// with QUICKSTART_MAIN set, so the test drives the real main: environment
// variables in, exit status out.
func TestMain(m *testing.M) {
	if os.Getenv("QUICKSTART_MAIN") == "1" {
		main()
		os.Exit(0)
	}
	pgtest.Main(m)
}

const period = "2026-09"

// quickstart runs the program against dbURL and the fake, with the shared
// sample customers on standard input, and returns its exit status and log.
func quickstart(t *testing.T, dbURL string, srv *billingtest.Server) (int, string) {
	t.Helper()
	return quickstartAt(t, dbURL, srv.URL)
}

// quickstartAt is quickstart against the Stripe at stripeURL.
func quickstartAt(t *testing.T, dbURL, stripeURL string) (int, string) {
	t.Helper()
	in, err := os.Open("../../testdata/customers.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	var out bytes.Buffer
	code := exitOf(t, command(dbURL, stripeURL, in, &out, &out, period))
	return code, out.String()
}

// command is the program with args, the database and Stripe given in its
// environment, and the streams given.
func command(dbURL, stripeURL string, stdin io.Reader, stdout, stderr io.Writer, args ...string) *exec.Cmd {
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), "QUICKSTART_MAIN=1", "DATABASE_URL="+dbURL,
		"STRIPE_URL="+stripeURL, "STRIPE_SECRET_KEY=sk_test_quickstart")
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdin, stdout, stderr
	return cmd
}

// exitOf runs cmd and returns its exit status.
func exitOf(t *testing.T, cmd *exec.Cmd) int {
	t.Helper()
	err := cmd.Run()
	var exit *exec.ExitError
	if errors.As(err, &exit) {
		return exit.ExitCode()
	}
	if err != nil {
		t.Fatal(err)
	}
	return 0
}

func sampleCustomers(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile("../../testdata/customers.txt")
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// The program bills every customer once and exits 0; a second run charges
// nobody again; a lock held by another replica makes it exit 3 without
// sending anything.
func TestQuickstart(t *testing.T) {
	dbURL := pgtest.URL(t)
	ids := sampleCustomers(t)
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()

	for run := 1; run <= 2; run++ {
		code, log := quickstart(t, dbURL, srv)
		if code != 0 {
			t.Fatalf("run %d: exit %d; want 0\n%s", run, code, log)
		}
		for _, id := range ids {
			if n := srv.CountPeriod(id, period); n != 1 {
				t.Fatalf("run %d: %s charged %d times at the fake; want 1", run, id, n)
			}
		}
		if run == 2 && !strings.Contains(log, "0 created, 12 already billed") {
			t.Fatalf("second run: %s; want everyone already billed", log)
		}
	}

	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := guard.Lock(context.Background(), "billonce-run:billonce:"+period)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Unlock(context.Background())
	before := srv.Stats().Requests
	if code, log := quickstart(t, dbURL, srv); code != exitLockHeld || srv.Stats().Requests != before {
		t.Fatalf("with the lock held elsewhere: exit %d, %d requests; want 3 and none\n%s", code, srv.Stats().Requests-before, log)
	}
}

// A declined customer makes the program exit 4 (customers not billed), run
// after run, and is
// charged at the fake by none of them.
func TestQuickstartDeclined(t *testing.T) {
	ids := sampleCustomers(t)
	srv := billingtest.NewServer(billingtest.Config{Declines: map[string]string{ids[3]: "insufficient_funds"}})
	defer srv.Close()
	dbURL := pgtest.URL(t)
	for run := 1; run <= 2; run++ {
		if code, log := quickstart(t, dbURL, srv); code != exitIncomplete || !strings.Contains(log, "1 declined") {
			t.Fatalf("run %d: exit %d; want 4 with one declined\n%s", run, code, log)
		}
	}
	for i, id := range ids {
		want := 1
		if i == 3 {
			want = 0
		}
		if n := srv.CountPeriod(id, period); n != want {
			t.Fatalf("%s charged %d times at the fake; want %d", id, n, want)
		}
	}
}

// Against an address that refuses every connection the program stops,
// exits 1 and says why on its own (the Biller's default logger writes the
// stopped run to slog.Default), instead of retrying customer after
// customer. The run after it, against a Stripe that answers, bills
// everyone once: nothing was sent, so nothing was left pending.
func TestQuickstartStripeUnreachable(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refused := "http://" + l.Addr().String()
	l.Close()
	dbURL := pgtest.URL(t)

	start := time.Now()
	code, log := quickstartAt(t, dbURL, refused)
	t.Logf("against a refused port: exit %d after %v", code, time.Since(start).Round(time.Millisecond))
	if code != 1 || !strings.Contains(log, "Stripe unreachable") || !strings.Contains(log, "billonce: stopping the run") {
		t.Fatalf("exit %d; want 1, the stop logged and the error saying Stripe is unreachable\n%s", code, log)
	}

	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	if code, log := quickstart(t, dbURL, srv); code != 0 {
		t.Fatalf("the next run: exit %d; want 0\n%s", code, log)
	}
	for _, id := range sampleCustomers(t) {
		if n := srv.CountPeriod(id, period); n != 1 {
			t.Errorf("%s charged %d times at the fake; want 1", id, n)
		}
	}
}

// -h, -help and --help print the usage on standard output and exit 0; a
// wrong number of arguments or a period that is not one is a usage error,
// exit 2. None of them touches the database or Stripe: no table, no
// request.
func TestQuickstartUsage(t *testing.T) {
	dbURL := pgtest.URL(t)
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"-h"}, 0},
		{[]string{"-help"}, 0},
		{[]string{"--help"}, 0},
		{nil, exitUsage},
		{[]string{period, "extra"}, exitUsage},
		{[]string{"-x"}, exitUsage},
		{[]string{"2026-13-45"}, exitUsage},
	} {
		var stdout, stderr bytes.Buffer
		code := exitOf(t, command(dbURL, srv.URL, strings.NewReader("cus_a\n"), &stdout, &stderr, tc.args...))
		// Help goes to standard output alone; a usage error to standard
		// error.
		usage, other, where := stdout.String(), stderr.String(), "stdout"
		if tc.code != 0 {
			usage, other, where = other, usage, "stderr"
		}
		if code != tc.code || !strings.Contains(usage, "usage: quickstart PERIOD") || other != "" {
			t.Errorf("%q: exit %d; want %d and the usage on %s alone\nstdout:\n%s\nstderr:\n%s", tc.args, code, tc.code, where, stdout.String(), stderr.String())
		}
	}
	if n := srv.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe; want none", n)
	}
	pool, err := pgxpool.New(context.Background(), dbURL)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var tables int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").Scan(&tables); err != nil {
		t.Fatal(err)
	}
	if tables != 0 {
		t.Errorf("%d tables in the database; want it untouched", tables)
	}
}
