package billing_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// windowTotal is the total of attempt attempt, value value, of customer's
// hour from start on the meter "hourly".
func windowTotal(customer string, start time.Time, value int64, attempt int) billing.Usage {
	return billing.Usage{Customer: customer, Meter: "hourly", Kind: billing.WindowTotals,
		Start: start, End: start.Add(time.Hour), Value: value, Attempt: attempt}
}

// A window's totals given to one RunUsage in order are all sent, each
// after the one before it, so that the meter ends with the newest: the run
// waits for an earlier total of the window instead of leaving the later
// ones pending for the next run.
func TestRunUsageSendsEveryTotalOfAWindowInOneRun(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("hourly", "sum", "hour")
	start := hourAgo()
	reports := []billing.Usage{windowTotal("cus_1", start, 100, 1), windowTotal("cus_1", start, 150, 2), windowTotal("cus_1", start, 200, 3)}
	sum, err := e.b.RunUsage(context.Background(), slicesSeq(reports), nil)
	if err != nil || !sum.Complete() || sum.Created != 3 {
		t.Errorf("RunUsage = %+v, %v (%v); want 3 created", sum.Progress, err, sum.Failures)
	}
	if got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour)); got != 200 {
		t.Errorf("the meter keeps %v for the window, want the newest total 200", got)
	}
	if n := e.srv.MeterEvents("hourly", "cus_1"); n != 3 {
		t.Errorf("%d meter events, want 3: each total once", n)
	}
}

// sendOrder records, for every meter event's key, when its first request
// reached the fake and when its report's outcome was settled, on one
// clock, and the customer and period of the key.
type sendOrder struct {
	mu      sync.Mutex
	tick    int
	arrived map[string]int
	settled map[string]int
	period  map[string]string // customer + " " + period
}

// newSendOrder records the meter events sent to e's fake, which answers
// each as fault says.
func newSendOrder(e *env, fault billingtest.Fault) *sendOrder {
	o := &sendOrder{arrived: map[string]int{}, settled: map[string]int{}, period: map[string]string{}}
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.Method != http.MethodPost || r.Path != meterEvents {
			return billingtest.Fault{}
		}
		o.mu.Lock()
		defer o.mu.Unlock()
		o.tick++
		if _, ok := o.arrived[r.IdempotencyKey]; !ok {
			o.arrived[r.IdempotencyKey] = o.tick
		}
		return fault
	})
	return o
}

// observe is a Config.Observe recording the outcomes.
func (o *sendOrder) observe(ev billing.Event) {
	if ev.Kind != billing.EventOutcome || ev.Key == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	o.tick++
	o.settled[ev.Key] = o.tick
	o.period[ev.Key] = ev.Customer + " " + ev.Period
}

// requireEachAfterTheOneBefore fails t unless every total sent of attempt
// 2 or more reached Stripe only after the outcome of the window's total
// before it was settled: never two totals of a window at once.
func (o *sendOrder) requireEachAfterTheOneBefore(t *testing.T) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	keys := map[string]map[int]string{} // window → attempt → key
	for key, p := range o.period {
		window, n, ok := strings.Cut(p, " total ")
		attempt, err := strconv.Atoi(n)
		if !ok || err != nil {
			t.Fatalf("period %q is not a window total's", p)
		}
		if keys[window] == nil {
			keys[window] = map[int]string{}
		}
		keys[window][attempt] = key
	}
	for window, byAttempt := range keys {
		for attempt, key := range byAttempt {
			prev, ok := byAttempt[attempt-1]
			at, sent := o.arrived[key]
			if attempt < 2 || !ok || !sent {
				continue
			}
			if at < o.settled[prev] {
				t.Errorf("%s: total %d reached Stripe before total %d was settled", window, attempt, attempt-1)
			}
		}
	}
}

// Totals of many windows and customers, interleaved, in one RunUsage with
// concurrency 8 and batches that split each window's totals: every total
// is sent once, each after the one before it of its window is settled,
// and every window ends with its newest total.
func TestRunUsageSendsInterleavedTotalsOfManyWindowsEachAfterTheOneBefore(t *testing.T) {
	t.Parallel()
	var order *sendOrder
	e := newEnv(t, func(c *billing.Config) { c.Observe = func(ev billing.Event) { order.observe(ev) } })
	order = newSendOrder(e, billingtest.Fault{})
	e.srv.CreateMeter("hourly", "sum", "hour")
	customers := []string{"cus_1", "cus_2", "cus_3", "cus_4"}
	base := hourAgo().Add(-2 * time.Hour)
	type window struct {
		customer string
		start    time.Time
	}
	var reports []billing.Usage
	newest := map[window]int64{}
	perCustomer := map[string]int{}
	for attempt := 1; attempt <= 3; attempt++ {
		for w := range 3 {
			for c, cus := range customers {
				if attempt > 1+(c+w)%3 {
					continue // this window has fewer totals
				}
				start := base.Add(time.Duration(w) * time.Hour)
				v := int64(1000*c + 100*w + 10*attempt)
				reports = append(reports, windowTotal(cus, start, v, attempt))
				newest[window{cus, start}] = v
				perCustomer[cus]++
			}
		}
	}
	sum, err := e.b.RunUsage(context.Background(), slicesSeq(reports), &billing.RunOptions{Concurrency: 8, BatchSize: 5})
	if err != nil || !sum.Complete() || sum.Created != len(reports) {
		t.Errorf("RunUsage = %+v, %v (%v); want %d created", sum.Progress, err, sum.Failures, len(reports))
	}
	for w, v := range newest {
		if got := e.srv.MeterTotal("hourly", w.customer, w.start, w.start.Add(time.Hour)); got != float64(v) {
			t.Errorf("%s at %s: the meter keeps %v, want the newest total %d", w.customer, w.start.Format(time.RFC3339), got, v)
		}
	}
	for cus, n := range perCustomer {
		if got := e.srv.MeterEvents("hourly", cus); got != n {
			t.Errorf("%s: %d meter events, want %d: each total once", cus, got, n)
		}
	}
	order.requireEachAfterTheOneBefore(t)
}

// A total that needs reconciliation (its identifier is taken by an event
// its claim never sent) stays pending, and the totals after it in the
// same run are not sent: each meets a total before it that is not
// settled, as it would in another run, and is handed back.
func TestRunUsageSendsNoTotalAfterOneThatNeedsReconciliation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("hourly", "sum", "hour")
	ctx := context.Background()
	start := hourAgo()
	first := windowTotal("cus_1", start, 100, 1)
	if _, err := e.otherTable().ReportUsage(ctx, first); err != nil {
		t.Fatal(err)
	}
	reports := []billing.Usage{first, windowTotal("cus_1", start, 150, 2), windowTotal("cus_1", start, 200, 3)}
	sum, err := e.b.RunUsage(ctx, slicesSeq(reports), nil)
	if err != nil || sum.Pending != 3 || sum.Created != 0 {
		t.Errorf("RunUsage = %+v, %v (%v); want 3 pending", sum.Progress, err, sum.Failures)
	}
	for i, f := range sum.Failures {
		var ce *billing.ChargeError
		if !errors.As(f, &ce) {
			t.Fatalf("failure %v is not a *ChargeError", f)
		}
		want := billing.ErrInProgress
		if ce.Attempt == 1 {
			want = billing.ErrNeedsReconciliation
		}
		if !errors.Is(f, want) {
			t.Errorf("failure %d = %v, want %v", i, f, want)
		}
	}
	if n := sends(e.srv); n != 2 {
		t.Errorf("%d meter events sent, want 2: the other table's and the first total's, refused", n)
	}
	if got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour)); got != 100 {
		t.Errorf("the meter keeps %v, want the other table's 100", got)
	}
	if n := e.claimRows(); n != 1 {
		t.Errorf("%d claims, want 1: the first total's, pending; the later ones are handed back", n)
	}
}

// A total that Stripe refuses for its window (an event stamped too long
// ago, say) is declined; the totals after it are each sent only once the
// one before is settled, as a failed total no longer holds the window,
// and are refused the same way: nothing is created or counted.
func TestRunUsageSendsTheTotalAfterADeclinedOneOnlyOnceItIsSettled(t *testing.T) {
	t.Parallel()
	var order *sendOrder
	e := newEnv(t, func(c *billing.Config) { c.Observe = func(ev billing.Event) { order.observe(ev) } })
	order = newSendOrder(e, billingtest.Fault{Kind: billingtest.FaultRefuse,
		Refusal: billingtest.Refusal{Code: "timestamp_too_far_in_past", Param: "timestamp"}})
	e.srv.CreateMeter("hourly", "sum", "hour")
	start := hourAgo()
	reports := []billing.Usage{windowTotal("cus_1", start, 100, 1), windowTotal("cus_1", start, 150, 2), windowTotal("cus_1", start, 200, 3)}
	sum, err := e.b.RunUsage(context.Background(), slicesSeq(reports), nil)
	if err != nil || sum.Declined != 3 || sum.Created != 0 {
		t.Errorf("RunUsage = %+v, %v (%v); want 3 declined", sum.Progress, err, sum.Failures)
	}
	if n := e.srv.MeterEvents("hourly", "cus_1"); n != 0 {
		t.Errorf("%d meter events counted, want none", n)
	}
	order.requireEachAfterTheOneBefore(t)
}

// A run that stops while a window's first total is being sent (its
// context done, or another report's answer stopping it) hands back the
// totals waiting for it, claimed and never sent: the next run claims them
// afresh and sends them, after the first.
func TestRunUsageStoppedHandsBackTheTotalsWaitingForOne(t *testing.T) {
	for _, byAnswer := range []bool{false, true} {
		name := "context done"
		if byAnswer {
			name = "stopping answer"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.srv.CreateMeter("hourly", "sum", "hour")
			arrived, release, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
			var held, stop sync.Once
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method != http.MethodPost || r.Path != meterEvents {
					return billingtest.Fault{}
				}
				switch r.Customer {
				case "cus_1":
					hold := false
					held.Do(func() { hold = true; close(arrived) })
					if hold {
						return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
					}
				case "cus_2":
					<-arrived // refused while the first total is at Stripe
					return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized}
				}
				return billingtest.Fault{}
			})
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			start := hourAgo()
			reports := []billing.Usage{windowTotal("cus_1", start, 100, 1), windowTotal("cus_1", start, 150, 2), windowTotal("cus_1", start, 200, 3)}
			opts := &billing.RunOptions{Concurrency: 8}
			want := context.Canceled
			if byAnswer {
				// cus_2's answer is the first outcome of the run: the
				// first total is held at Stripe, the others wait for it.
				reports = append(reports, windowTotal("cus_2", start, 7, 1))
				opts.Progress = func(billing.Progress) { stop.Do(func() { close(stopped) }) }
				want = billing.ErrStripeAuth
				go func() { <-arrived; <-stopped; close(release) }()
			} else {
				go func() { <-arrived; cancel() }()
			}
			sum, err := e.b.RunUsage(ctx, slicesSeq(reports), opts)
			if !byAnswer {
				close(release)
			}
			if !errors.Is(err, want) || sum.Done != len(reports) {
				t.Errorf("RunUsage = %+v, %v; want stopped by %v, every report counted", sum.Progress, err, want)
			}
			if n := e.srv.MeterEvents("hourly", "cus_1"); n != 1 {
				t.Errorf("%d meter events, want 1: only the first total was sent", n)
			}
			if n := e.claimRows(); n != 1 {
				t.Errorf("%d claims, want 1, the first total's: the totals waiting for it are handed back", n)
			}
			e.srv.SetScript(nil)
			sum, err = e.b.RunUsage(context.Background(), slicesSeq(reports), nil)
			if err != nil || !sum.Complete() {
				t.Errorf("next RunUsage = %+v, %v (%v); want complete", sum.Progress, err, sum.Failures)
			}
			if got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour)); got != 200 {
				t.Errorf("the meter keeps %v, want the newest total 200", got)
			}
			if n := e.srv.MeterEvents("hourly", "cus_1"); n != 3 {
				t.Errorf("%d meter events, want 3: each total once", n)
			}
		})
	}
}
