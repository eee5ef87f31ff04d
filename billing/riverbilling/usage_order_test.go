package riverbilling_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// A queue does not keep its jobs in order: the job of a window's second
// total may run before the first's. It waits for the first instead of
// being cancelled, and the window ends with the newest total. A job
// cancelled as invalid is never run again, and the window keeps the older,
// smaller total.
func TestUsageWindowTotalsInAnyOrder(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("seats", "sum", "hour")
	c := e.client(e.riverConfig(e.biller(), nil))
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	first := billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour), Value: 10, Attempt: 1}
	second := first
	second.Value, second.Attempt = 25, 2
	jobs := []*rivertype.JobRow{e.insertUsage(c, second), e.insertUsage(c, first)}
	w := e.usageWorker(e.biller())
	// River works each job until it completes, is cancelled or runs out of
	// attempts; a snoozed or failed job comes back.
	for round := 0; round < 5; round++ {
		for i, j := range jobs {
			switch j.State {
			case rivertype.JobStateCompleted, rivertype.JobStateCancelled, rivertype.JobStateDiscarded:
				continue
			}
			res := work(e, w, j)
			jobs[i] = res.Job
			if res.EventKind == river.EventKindJobCancelled {
				t.Logf("job of total %d cancelled: %v", []int64{25, 10}[i], lastErr(res.Job))
			}
		}
	}
	if got := e.srv.MeterTotal("seats", "cus_1", start, start.Add(time.Hour)); got != 25 {
		t.Errorf("window total %v at Stripe, want 25, the newest total (jobs: %s, %s)", got, jobs[0].State, jobs[1].State)
	}
}

// The job of a window's second total that runs while the first total is
// being sent by another worker is snoozed until the first can have
// settled, at most a minute, without using up an attempt or sending
// anything; run again once the first is delivered, it sends its total,
// and the window ends with it.
func TestUsageWindowTotalWaitsForTheTotalBeingSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("seats", "sum", "hour")
	arrived, release := make(chan struct{}), make(chan struct{})
	var held sync.Once
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		hold := false
		if r.Path == meterEvents {
			held.Do(func() { hold = true; close(arrived) })
		}
		if hold {
			return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
		}
		return billingtest.Fault{}
	})
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	first := billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour), Value: 10, Attempt: 1}
	second := first
	second.Value, second.Attempt = 25, 2
	w := e.usageWorker(e.biller())
	job := func(u billing.Usage) *river.Job[riverbilling.UsageArgs] {
		return &river.Job[riverbilling.UsageArgs]{
			JobRow: &rivertype.JobRow{ID: int64(u.Attempt), Attempt: 1, Queue: riverbilling.DefaultQueue},
			Args:   riverbilling.UsageArgs{Usage: u},
		}
	}
	firstDone := make(chan error, 1)
	go func() { firstDone <- w.Work(context.Background(), job(first)) }()
	<-arrived
	err := w.Work(context.Background(), job(second))
	var snoozed *river.JobSnoozeError
	if !errors.As(err, &snoozed) || snoozed.Duration <= 0 || snoozed.Duration > time.Minute {
		t.Errorf("second total's job while the first is sent = %v; want a snooze of at most a minute", err)
	}
	if n := e.sends("cus_1"); n != 0 {
		t.Errorf("%d meter events answered while the first is held, want none: the second waits", n)
	}
	close(release)
	if err := <-firstDone; err != nil {
		t.Fatalf("first total's job = %v", err)
	}
	if err := w.Work(context.Background(), job(second)); err != nil {
		t.Errorf("second total's job once the first is delivered = %v, want nil", err)
	}
	if got := e.srv.MeterTotal("seats", "cus_1", start, start.Add(time.Hour)); got != 25 {
		t.Errorf("window total %v at Stripe, want 25, the newest", got)
	}
	if n := e.srv.MeterEvents("seats", "cus_1"); n != 2 {
		t.Errorf("%d meter events, want 2: each total once", n)
	}
}
