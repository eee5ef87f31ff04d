package billing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/retry"
)

// A Run against an address that refuses every connection stops with
// ErrStripeUnreachable after a few rounds of its workers, instead of
// retrying customer after customer. Nothing was written, so every claim it
// made is abandoned: the next run claims them afresh.
func TestRunStopsWhenStripeIsUnreachable(t *testing.T) {
	e := newEnv(t, func(c *billing.Config) {
		c.StripeURL = refusedURL(t)
		c.Retry = retry.Policy{} // the defaults, as in production
	})
	const n = 10_000
	start := time.Now()
	sum, err := e.b.Run(context.Background(), period, billing.Customers(customers(n)...), nil)
	t.Logf("%d customers against a refused port: stopped after %v, %d settled: %v", n, time.Since(start).Round(time.Millisecond), sum.Done, err)
	if !errors.Is(err, billing.ErrStripeUnreachable) || !billing.StopsRun(err) {
		t.Fatalf("Run: %v; want ErrStripeUnreachable, which stops runs", err)
	}
	if sum.Done >= n || sum.Created != 0 {
		t.Errorf("summary %+v; want a stop long before the end, nothing created", sum.Progress)
	}
	if rows := e.claimRows(); rows != 0 {
		t.Errorf("%d claims left; want none: no request got a connection, so every claim is abandoned", rows)
	}
	var ce *billing.ChargeError
	if !errors.As(err, &ce) || ce.Key == "" {
		t.Errorf("Run: %v; want the *ChargeError of the customer whose attempt found Stripe unreachable", err)
	}
	var ne net.Error
	if !errors.As(err, &ne) {
		t.Errorf("Run: %v; want the last transport error in the chain", err)
	}
}

// A single Charge keeps its retry policy but gives up on the same rule;
// with both rules turned off it retries until the policy says stop.
func TestChargeGivesUpWhenStripeIsUnreachable(t *testing.T) {
	for _, tc := range []struct {
		name         string
		attempts     int
		after        time.Duration
		wantAttempts int
		want         error
	}{
		{"after 4 attempts without an answer", 4, -1, 4, billing.ErrStripeUnreachable},
		{"rules off: the retry policy decides", -1, -1, 20, billing.ErrOutcomeUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			calls := 0
			e := newEnv(t, func(c *billing.Config) {
				c.StripeURL = refusedURL(t)
				c.Retry.MaxAttempts = 20
				if tc.attempts > 0 {
					// A pause of twice MaxInterval between misses starts a
					// new streak: a loaded machine's pauses must not.
					c.Retry.MaxInterval = time.Second
				}
				c.UnreachableAttempts, c.UnreachableAfter = tc.attempts, tc.after
				c.Observe = func(ev billing.Event) {
					if ev.Kind == billing.EventStripeCall {
						mu.Lock()
						calls++
						mu.Unlock()
					}
				}
			})
			_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Charge: %v; want %v", err, tc.want)
			}
			if calls != tc.wantAttempts {
				t.Errorf("%d attempts; want %d", calls, tc.wantAttempts)
			}
			if rows := e.claimRows(); rows != 0 {
				t.Errorf("%d claims left; want none: nothing was written", rows)
			}
		})
	}
}

// The time rule: attempts without an answer stop a call, whatever their
// number, within UnreachableAfter of the first: a retry whose wait would
// end past it is not waited for. The waits here are fixed (the classifier
// asks for the policy's longest), so the waits Do plans are known; their
// sum, not the clock, is checked.
func TestChargeGivesUpWithinUnreachableAfter(t *testing.T) {
	const wait, after = 400 * time.Millisecond, 1500 * time.Millisecond
	var waits []time.Duration
	e := newEnv(t, func(c *billing.Config) {
		c.StripeURL = refusedURL(t)
		c.Retry = retry.Policy{
			Classify: func(err error) retry.Decision {
				if d := billing.Classify(err); d.Retry() {
					return retry.After(wait)
				}
				return retry.Stop()
			},
			InitialInterval: wait, MaxInterval: wait, MaxAttempts: 1000,
			Notify: func(e retry.Event) { waits = append(waits, e.Wait) },
		}
		c.UnreachableAttempts, c.UnreachableAfter = -1, after
	})
	start := time.Now()
	_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	t.Logf("gave up after %v and %d waits: %v", time.Since(start).Round(time.Millisecond), len(waits), err)
	if !errors.Is(err, billing.ErrStripeUnreachable) {
		t.Fatalf("Charge: %v; want ErrStripeUnreachable", err)
	}
	var total time.Duration
	for _, w := range waits {
		total += w
	}
	if total >= after || len(waits) < 2 {
		t.Errorf("waits %v, %v in all; want at least two, and in all less than UnreachableAfter (%v)", waits, total, after)
	}
	if rows := e.claimRows(); rows != 0 {
		t.Errorf("%d claims left; want none: nothing was written", rows)
	}
}

// A storm of 5xx is an answer every time: it is retried as before, and
// never taken for an unreachable Stripe, however many come in a row.
func TestFiveHundredStormIsRetriedNotStopped(t *testing.T) {
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.IdempotencyKey != "" && r.Attempt <= 4 {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	}}, func(c *billing.Config) { c.UnreachableAttempts = 8 })
	ids := customers(40)
	sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Created != len(ids) {
		t.Fatalf("Run: %+v, %v; want everyone created, no stop", sum.Progress, err)
	}
	if got := e.srv.Stats().Requests; got < int64(5*len(ids)) {
		t.Errorf("%d requests; want at least %d (four 500s and a success each)", got, 5*len(ids))
	}
	for _, id := range ids {
		if n := e.count(id); n != 1 {
			t.Errorf("%s charged %d times; want 1", id, n)
		}
	}
}

// A Stripe slower than the attempt timeout on first attempts, that answers
// the retries, is retried as before: the answers start the count again.
func TestSlowStripeIsRetriedNotStopped(t *testing.T) {
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.IdempotencyKey != "" && r.Attempt == 1 {
			return billingtest.Fault{Kind: billingtest.FaultSlow, Delay: 1500 * time.Millisecond}
		}
		return billingtest.Fault{}
	}}, func(c *billing.Config) {
		// Every first attempt times out; a retry meets the 409 of the
		// first attempt still held, or its replay: an answer. The attempt
		// timeout leaves a busy machine a second to answer the retry, so
		// that only the held attempts go unanswered.
		c.Retry.AttemptTimeout = time.Second
		c.UnreachableAttempts = 12 // more than one round of timeouts, fewer than the run has
	})
	ids := customers(16)
	sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Created != len(ids) {
		t.Fatalf("Run: %+v, %v; want everyone created, no stop", sum.Progress, err)
	}
	for _, id := range ids {
		if n := e.count(id); n != 1 {
			t.Errorf("%s charged %d times; want 1", id, n)
		}
	}
}

// forwarder relays TCP connections to a server, and can be taken down
// (every connection refused) and brought back on the same address.
type forwarder struct {
	t      *testing.T
	to     string
	mu     sync.Mutex
	l      net.Listener
	addr   string
	closed bool
}

func newForwarder(t *testing.T, to string) *forwarder {
	f := &forwarder{t: t, to: strings.TrimPrefix(to, "http://")}
	f.listen("127.0.0.1:0")
	t.Cleanup(f.down)
	return f
}

func (f *forwarder) listen(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		f.t.Fatal(err)
	}
	f.mu.Lock()
	f.l, f.addr, f.closed = l, l.Addr().String(), false
	f.mu.Unlock()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s, err := net.Dial("tcp", f.to)
				if err != nil {
					return
				}
				defer s.Close()
				go io.Copy(s, c)
				io.Copy(c, s)
			}()
		}
	}()
}

func (f *forwarder) url() string { return "http://" + f.addr }

// down closes the listener: new connections are refused.
func (f *forwarder) down() {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.closed {
		f.l.Close()
		f.closed = true
	}
}

func (f *forwarder) up() { f.listen(f.addr) }

// A connection cut after Stripe committed, then a Stripe that refuses
// every connection: the run stops, the customer whose request was written
// stays pending with its key (not abandoned), and the next run gets
// Stripe's replay for it, not a second charge. The customers never sent
// are abandoned and billed afresh.
func TestCutAfterCommitIsReplayedNotAbandoned(t *testing.T) {
	var f *forwarder
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.Customer == "cus_cut" && r.Attempt == 1 {
			f.down() // the cut answer is under way; every later connection is refused
			return billingtest.Fault{Kind: billingtest.FaultCut}
		}
		return billingtest.Fault{}
	}})
	f = newForwarder(t, e.srv.URL)
	b := e.biller(func(c *billing.Config) {
		c.StripeURL = f.url()
		c.UnreachableAttempts, c.UnreachableAfter = 3, -1
	})
	ids := append([]string{"cus_cut"}, customers(5)...)
	_, err := b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 1})
	if !errors.Is(err, billing.ErrStripeUnreachable) {
		t.Fatalf("Run: %v; want ErrStripeUnreachable", err)
	}
	if c := e.claimOf("cus_cut"); c.State != "pending" {
		t.Errorf("cus_cut's claim is %s; want pending with its key: Stripe committed its charge", c.State)
	}
	if rows := e.claimRows(); rows != 1 {
		t.Errorf("%d claims; want cus_cut's alone: the others were never sent and are abandoned", rows)
	}
	if n := e.count("cus_cut"); n != 1 {
		t.Fatalf("cus_cut charged %d times at the fake; want 1 (committed before the cut)", n)
	}

	f.up()
	sum, err := b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Created != len(ids) {
		t.Fatalf("second Run: %+v, %v; want everyone billed by this run (cus_cut by Stripe's replay)", sum.Progress, err)
	}
	for _, id := range ids {
		if n := e.count(id); n != 1 {
			t.Errorf("%s charged %d times; want 1", id, n)
		}
	}
}

// With Config.Logger nil a stopped run is not silent: warnings and errors
// go to slog.Default, info stays quiet. It swaps slog.Default, so it does
// not run in parallel.
func TestNilLoggerWarnsOnSlogDefault(t *testing.T) {
	var buf bytes.Buffer
	prev := slog.Default()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { slog.SetDefault(prev) })

	e := newEnv(t, func(c *billing.Config) {
		c.StripeURL = refusedURL(t)
		c.UnreachableAttempts = 3
	})
	if _, err := e.b.Run(context.Background(), period, billing.Customers(customers(3)...), &billing.RunOptions{Concurrency: 1}); !errors.Is(err, billing.ErrStripeUnreachable) {
		t.Fatalf("Run: %v; want ErrStripeUnreachable", err)
	}
	slog.SetDefault(prev)
	lines := logLines(t, &buf)
	stopped := false
	for _, l := range lines {
		if l["level"] != "WARN" && l["level"] != "ERROR" {
			t.Errorf("logged at %v by default: %v", l["level"], l)
		}
		if l["msg"] == "billonce: stopping the run" {
			stopped = true
			if d, ok := l["elapsed"].(string); !ok {
				t.Errorf("elapsed is %T %v; want a readable duration", l["elapsed"], l["elapsed"])
			} else if _, err := time.ParseDuration(d); err != nil {
				t.Errorf("elapsed %q: %v", d, err)
			}
		}
	}
	if !stopped {
		t.Errorf("no error line for the stopped run on slog.Default:\n%s", buf.String())
	}
}

// Durations log as readable strings, not slog's nanoseconds.
func TestDurationsLogAsReadableStrings(t *testing.T) {
	var buf syncBuffer
	e := newEnv(t, func(c *billing.Config) {
		c.StripeURL = refusedURL(t)
		c.UnreachableAttempts = 3
		c.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	e.b.Charge(context.Background(), "cus_1", period, nil)
	waits := 0
	for _, l := range logLines(t, &buf.b) {
		if w, ok := l["wait"]; ok {
			waits++
			if d, ok := w.(string); !ok {
				t.Errorf("wait is %T %v; want a readable duration", w, w)
			} else if _, err := time.ParseDuration(d); err != nil {
				t.Errorf("wait %q: %v", d, err)
			}
		}
	}
	if waits == 0 {
		t.Errorf("no retry logged with its wait:\n%s", buf.b.String())
	}
}

func logLines(t *testing.T, buf *bytes.Buffer) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		if line == "" {
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(line), &m); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		out = append(out, m)
	}
	return out
}

// An invoice's steps are writes like a charge's, behind the same guard:
// against an address that refuses every connection, Invoice gives up by
// the same rule, after as many attempts, and its claim, whose draft was
// never written, is abandoned, so that the next call claims it afresh.
func TestInvoiceGivesUpWhenStripeIsUnreachable(t *testing.T) {
	var mu sync.Mutex
	calls := 0
	e := newEnv(t, func(c *billing.Config) {
		c.StripeURL = refusedURL(t)
		c.Retry.MaxAttempts = 20
		c.Retry.MaxInterval = time.Second // see TestChargeGivesUpWhenStripeIsUnreachable
		c.UnreachableAttempts, c.UnreachableAfter = 4, -1
		c.Observe = func(ev billing.Event) {
			if ev.Kind == billing.EventStripeCall {
				mu.Lock()
				calls++
				mu.Unlock()
			}
		}
	})
	inv := &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Description: "seats", Amount: 1200}}}
	_, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
	if !errors.Is(err, billing.ErrStripeUnreachable) {
		t.Fatalf("Invoice: %v; want ErrStripeUnreachable", err)
	}
	if calls != 4 {
		t.Errorf("%d attempts; want 4, as for a charge", calls)
	}
	if rows := e.claimRows(); rows != 0 {
		t.Errorf("%d claims left; want none: the draft was never written", rows)
	}
}
