package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A window's totals given to one RunUsage in order are all sent, each
// after the one before it, so that the meter ends with the newest: the run
// waits for an earlier total of the window instead of leaving the later
// ones pending for the next run.
func TestRunUsageSendsEveryTotalOfAWindowInOneRun(t *testing.T) {
	t.Skip("known: RunUsage sends only the first total of a window per run; the later totals are counted Pending (in progress elsewhere) and need one more run each")
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("hourly", "sum", "hour")
	start := hourAgo()
	total := func(v int64, attempt int) billing.Usage {
		return billing.Usage{Customer: "cus_1", Meter: "hourly", Kind: billing.WindowTotals,
			Start: start, End: start.Add(time.Hour), Value: v, Attempt: attempt}
	}
	sum, err := e.b.RunUsage(context.Background(), slicesSeq([]billing.Usage{total(100, 1), total(150, 2), total(200, 3)}), nil)
	if err != nil || !sum.Complete() {
		t.Errorf("RunUsage = %+v, %v (%v); want complete", sum.Progress, err, sum.Failures)
	}
	if got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour)); got != 200 {
		t.Errorf("the meter keeps %v for the window, want the newest total 200", got)
	}
}
