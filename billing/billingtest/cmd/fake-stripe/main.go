// Command fake-stripe serves billonce's fake Stripe API (billing/billingtest)
// as a process of its own, so that several billing processes can share it,
// and prints from its ledger how many times each customer was charged when
// it stops.
//
//	go run ./billing/billingtest/cmd/fake-stripe -addr 127.0.0.1:12111
//	go run ./billing/billingtest/cmd/fake-stripe -seed 7 -cut 0.05 -500-before 0.05 -declines cus_a,cus_b=insufficient_funds
//
// It runs until SIGINT or SIGTERM. Point a client at the URL it prints, with
// any API key. On a second address (-admin-addr), GET /state returns the
// ledger (payments and invoices) as JSON while it runs, GET /meter_total
// what a meter counts for a customer over a time range, and POST /control
// changes faults, declines and the clock, or processes every meter event
// at once ({"aggregate": true}).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil)
	stop()
	os.Exit(code)
}

// run serves until ctx is done. ready, if not nil, receives the server's URL
// once it listens.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- string) int {
	fs := flag.NewFlagSet("fake-stripe", flag.ContinueOnError)
	fs.SetOutput(stderr)
	addr := fs.String("addr", "127.0.0.1:12111", "address to listen on (host:port; port 0 picks a free one)")
	adminAddr := fs.String("admin-addr", "127.0.0.1:0", "address of the JSON state and control endpoints (keep it on loopback)")
	seed := fs.Int64("seed", 1, "seed of the random faults: the same seed gives the same faults for the same keys")
	rates := map[billingtest.FaultKind]*float64{}
	for _, f := range []struct {
		name string
		kind billingtest.FaultKind
		help string
	}{
		{"drop", billingtest.FaultDrop, "commit, then close the connection without answering"},
		{"cut", billingtest.FaultCut, "commit, then send half a response and close the connection"},
		{"slow", billingtest.FaultSlow, "commit, then answer after 2s (same key meanwhile: 409)"},
		{"500-before", billingtest.FaultErrorBefore, "answer 500 without committing"},
		{"500-after", billingtest.FaultErrorAfter, "commit, then answer (and store) a 500"},
		{"409", billingtest.FaultInFlight, "answer 409 idempotency_key_in_use"},
		{"lock-timeout", billingtest.FaultLockTimeout, "answer 429 lock_timeout"},
		{"rate-limit", billingtest.FaultRateLimit, "answer 429 rate_limit"},
	} {
		rates[f.kind] = fs.Float64(f.name, 0, "probability (0 to 1) that a request gets this fault: "+f.help)
	}
	declines := fs.String("declines", "", "customers whose cards decline: cus_a,cus_b=insufficient_funds (default code generic_decline)")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "fake-stripe: unexpected argument %q: every setting is a flag (see -h)\n", fs.Arg(0))
		return 2
	}
	cfg := billingtest.Config{Addr: *addr, Declines: map[string]string{}}
	faultRates := map[billingtest.FaultKind]float64{}
	for k, v := range rates {
		if *v != 0 {
			faultRates[k] = *v
		}
	}
	random, err := billingtest.RandomFaults(*seed, faultRates)
	if err != nil {
		fmt.Fprintf(stderr, "fake-stripe: %v\n", err)
		return 2
	}
	cfg.Script = random
	for _, d := range strings.Split(*declines, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		cust, code, _ := strings.Cut(d, "=")
		cfg.Declines[cust] = code
	}
	srv, err := newServer(cfg)
	if err != nil {
		fmt.Fprintf(stderr, "fake-stripe: %v\n", err)
		return 2
	}
	ln, err := net.Listen("tcp", *adminAddr)
	if err != nil {
		srv.Close()
		fmt.Fprintf(stderr, "fake-stripe: -admin-addr: %v\n", err)
		return 2
	}
	adm := &http.Server{Handler: &admin{srv: srv, seed: *seed, rates: faultRates}, ReadHeaderTimeout: 10 * time.Second}
	go adm.Serve(ln)
	defer adm.Close()
	fmt.Fprintf(stdout, "fake Stripe listening on %s (any API key; state: GET http://%s/state)\n", srv.URL, ln.Addr())
	if len(faultRates) > 0 {
		fmt.Fprintf(stdout, "faults: seed %d, rates %v\n", *seed, faultRates)
	}
	if ready != nil {
		ready <- srv.URL
	}
	<-ctx.Done()
	srv.Close()
	summarize(stdout, srv)
	return 0
}

// newServer is billingtest.NewServer with its panic turned into an error.
func newServer(cfg billingtest.Config) (srv *billingtest.Server, err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("%v", p)
		}
	}()
	return billingtest.NewServer(cfg), nil
}

// summarize prints, per billing period, how many customers were charged
// once and how many more than once.
func summarize(w io.Writer, srv *billingtest.Server) {
	type cp struct{ customer, period string }
	counts := map[cp]int{}
	declined := 0
	for _, p := range srv.Payments() {
		if !p.Paid {
			declined++
			continue
		}
		counts[cp{p.Customer, p.Period}]++
	}
	type tally struct {
		once, more int
		twice      []string
	}
	periods := map[string]*tally{}
	for k, n := range counts {
		t := periods[k.period]
		if t == nil {
			t = &tally{}
			periods[k.period] = t
		}
		if n == 1 {
			t.once++
		} else {
			t.more++
			t.twice = append(t.twice, fmt.Sprintf("%s×%d", k.customer, n))
		}
	}
	st := srv.Stats()
	fmt.Fprintf(w, "fake Stripe stopped: %d requests, %d payments created (%d declined), %d replays, %d 409s, faults %v\n",
		st.Requests, st.Created, declined, st.Replays, st.InUse, st.Faults)
	names := make([]string, 0, len(periods))
	for p := range periods {
		names = append(names, p)
	}
	sort.Strings(names)
	for _, p := range names {
		t := periods[p]
		if p == "" {
			p = "(no period)"
		}
		fmt.Fprintf(w, "period %s: %d customers charged once, %d charged more than once\n", p, t.once, t.more)
		if t.more > 0 {
			sort.Strings(t.twice)
			fmt.Fprintf(w, "  charged more than once: %s\n", strings.Join(t.twice[:min(len(t.twice), 20)], ", "))
		}
	}
	if len(names) == 0 {
		fmt.Fprintln(w, "nobody was charged")
	}
}
