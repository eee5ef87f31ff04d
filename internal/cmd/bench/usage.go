package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"iter"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// meterName is the event name of the sum meter the usage section reports to.
const meterName = "api_calls"

// usageTarget is the least events/s of billonce over the naive loop that
// the usage section aims at; below it, a CPU profile is written.
const usageTarget = 0.85

// usageReports streams n usage reports: customers in turn, each for one
// one-minute window, the windows ending a minute before base and going
// back in time, never holding them all.
func usageReports(n, customers int, base time.Time) iter.Seq2[billing.Usage, error] {
	return func(yield func(billing.Usage, error) bool) {
		for i := range n {
			c, w := i%customers, i/customers
			start := base.Add(-time.Duration(w+2) * time.Minute)
			u := billing.Usage{Customer: customerID(c), Meter: meterName, Kind: billing.Increments,
				Start: start, End: start.Add(time.Minute), Value: usageValue(i)}
			if !yield(u, nil) {
				return
			}
		}
	}
}

func usageValue(i int) int64 { return 1 + int64(i%97) }

// usageBase is the minute the reports' windows end before: now, so that
// every window is over and within Stripe's 35 days.
func usageBase() time.Time { return time.Now().UTC().Truncate(time.Minute) }

// usageFake is a fresh zero-latency fake with the sum meter.
func usageFake() *billingtest.Server {
	srv := billingtest.NewServer(billingtest.Config{})
	srv.CreateMeter(meterName, "sum", "")
	return srv
}

// countedOnce checks, at the fake, that n events were accepted, each
// customer's as many as it reported, and each customer's total the sum of
// its reports' values.
func countedOnce(srv *billingtest.Server, n, customers int, base time.Time) error {
	if got := srv.Stats().Created - 1; got != int64(n) { // the meter, then the events
		return fmt.Errorf("fake accepted %d meter events, want %d", got, n)
	}
	events := make([]int, customers)
	totals := make([]float64, customers)
	for i := range n {
		events[i%customers]++
		totals[i%customers] += float64(usageValue(i))
	}
	windows := (n + customers - 1) / customers
	from, to := base.Add(-time.Duration(windows+1)*time.Minute), base
	for c := range min(n, customers) {
		if got := srv.MeterEvents(meterName, customerID(c)); got != events[c] {
			return fmt.Errorf("%s: %d meter events at the fake, want %d", customerID(c), got, events[c])
		}
		if got := srv.MeterTotal(meterName, customerID(c), from, to); got != totals[c] {
			return fmt.Errorf("%s: meter total %v at the fake, want %v", customerID(c), got, totals[c])
		}
	}
	return nil
}

// usageRun reports n usage reports with RunUsage against a fresh fake.
func usageRun(ctx context.Context, e *env, o options, n int, profile string) (result, error) {
	srv := usageFake()
	defer srv.Close()
	s, _, err := e.store(ctx, o.concurrency+2)
	if err != nil {
		return result{}, err
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: -1})
	if err != nil {
		return result{}, err
	}
	if profile != "" {
		stop, err := startProfile(profile)
		if err != nil {
			return result{}, err
		}
		defer stop()
	}
	base := usageBase()
	m0, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return result{}, err
	}
	self0, pg0 := cpuTimes()
	sum, err := b.RunUsage(ctx, usageReports(n, o.usageCustomers, base), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch})
	if err != nil {
		return result{}, err
	}
	self1, pg1 := cpuTimes()
	m1, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return result{}, err
	}
	if sum.Created != n {
		return result{}, fmt.Errorf("RunUsage sent %d of %d reports: %+v %v", sum.Created, n, sum.Progress, sum.Failures)
	}
	if err := countedOnce(srv, n, o.usageCustomers, base); err != nil {
		return result{}, fmt.Errorf("RunUsage: %w", err)
	}
	return result{float64(n) / sum.Elapsed.Seconds(), (self1 - self0) / time.Duration(n), (pg1 - pg0) / time.Duration(n), m1.per(m0, n)}, nil
}

// naiveUsage sends the same reports with stripe-go's meterevent client,
// each with a random identifier and a random idempotency key, no
// database, at the same concurrency, against a fresh fake.
func naiveUsage(ctx context.Context, o options, n int) (result, error) {
	srv := usageFake()
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL), HTTPClient: &http.Client{Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	cl := meterevent.Client{B: backend, Key: "sk_test_bench"}
	base := usageBase()
	var reports []billing.Usage
	for u := range usageReports(n, o.usageCustomers, base) {
		reports = append(reports, u)
	}
	elapsed, self, err := concurrently(o.concurrency, n, func(i int) error {
		u := reports[i]
		var id, k [16]byte
		rand.Read(id[:])
		rand.Read(k[:])
		params := &stripe.BillingMeterEventParams{
			EventName:  stripe.String(u.Meter),
			Identifier: stripe.String(hex.EncodeToString(id[:])),
			Timestamp:  stripe.Int64(u.Start.Unix()),
			Payload:    map[string]string{"stripe_customer_id": u.Customer, "value": strconv.FormatInt(u.Value, 10)},
		}
		params.Context, params.IdempotencyKey = ctx, stripe.String(hex.EncodeToString(k[:]))
		_, err := cl.New(params)
		return err
	})
	if err != nil {
		return result{}, err
	}
	if err := countedOnce(srv, n, o.usageCustomers, base); err != nil {
		return result{}, fmt.Errorf("naive usage loop: %w", err)
	}
	return result{rate: float64(n) / elapsed.Seconds(), selfCPU: self}, nil
}

func benchUsage(ctx context.Context, e *env, o options, t *table) error {
	n := o.usageReports
	var safe, naive []result
	// Interleaved, as in the run section.
	for range max(1, o.reps) {
		s, err := usageRun(ctx, e, o, n, "")
		if err != nil {
			return err
		}
		nv, err := naiveUsage(ctx, o, n)
		if err != nil {
			return err
		}
		safe, naive = append(safe, s), append(naive, nv)
	}
	med := medianOf
	rate := func(r result) float64 { return r.rate }
	self := func(r result) float64 { return float64(r.selfCPU.Microseconds()) }
	pg := func(r result) float64 { return float64(r.pgCPU.Microseconds()) }
	ms, mn := med(safe, rate), med(naive, rate)
	windows := (n + o.usageCustomers - 1) / o.usageCustomers
	t.add(fmt.Sprintf("RunUsage of %d reports, billonce", n), fmt.Sprintf("%.0f events/s", ms),
		fmt.Sprintf("%d customers × %d one-minute windows, Increments, sum meter; claims in PostgreSQL, concurrency %d, batch %d; CPU/event: %.0f µs here (fake included) + %.0f µs PostgreSQL; %s",
			min(n, o.usageCustomers), windows, o.concurrency, o.batch, med(safe, self), med(safe, pg), pgNote("event", pgsOf(safe))))
	t.add(fmt.Sprintf("%d meter events, naive loop", n), fmt.Sprintf("%.0f events/s", mn),
		fmt.Sprintf("stripe-go meterevent.New, random identifiers and keys, no database, same concurrency; CPU/event: %.0f µs here (fake included)", med(naive, self)))
	ratio := ms / mn
	t.add("usage: billonce / naive", fmt.Sprintf("%.2f", ratio), fmt.Sprintf("target ≥ %.2f; per rep: billonce %s, naive %s", usageTarget, rates(ratesOf(safe)), rates(ratesOf(naive))))
	if ratio < usageTarget || o.profile != "" {
		path := filepath.Join(os.TempDir(), "billonce-usage.cpu.pprof")
		if _, err := usageRun(ctx, e, o, n, path); err != nil {
			return err
		}
		t.add("CPU profile of a RunUsage", path, "this process only; cumulative top entries below")
		t.notes = append(t.notes, topOfProfile(path)...)
	}
	if o.usageMemory == "" {
		return nil
	}
	sizes, err := splitInts(o.usageMemory)
	if err != nil {
		return err
	}
	for _, s := range sizes {
		r, err := measureMemory(ctx, e, o, s, true)
		if err != nil {
			return err
		}
		t.add(fmt.Sprintf("peak RSS, runner reporting %d", s), fmt.Sprintf("%.1f MiB", float64(r.VmHWMKiB)/1024),
			fmt.Sprintf("VmHWM of the runner process, reports streamed from an iterator; peak heap %.1f MiB; %.0f events/s", float64(r.PeakHeap)/(1<<20), float64(s)/r.Seconds))
	}
	return nil
}

func ratesOf(rs []result) []float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, r.rate)
	}
	return xs
}

// splitInts reads a comma-separated list of counts.
func splitInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("-usage-memory %q: want counts of reports, such as 10000,100000", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// startProfile writes a CPU profile to path until stop is called.
func startProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// heapPeak samples the live heap every few milliseconds until stop is
// called, and returns the largest HeapInuse seen.
func heapPeak() (stop func() uint64) {
	done := make(chan struct{})
	peak := make(chan uint64)
	go func() {
		var most uint64
		var ms runtime.MemStats
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			runtime.ReadMemStats(&ms)
			most = max(most, ms.HeapInuse)
			select {
			case <-done:
				peak <- most
				return
			case <-tick.C:
			}
		}
	}()
	return func() uint64 {
		close(done)
		return <-peak
	}
}
