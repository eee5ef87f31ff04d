package riverbilling_test

import (
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
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
