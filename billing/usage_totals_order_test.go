package billing_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A window's totals given to RunUsage out of order, or one of them twice:
// whatever the order and the concurrency, the meter ends with the newest
// total once a run leaves nothing pending (a total listed twice in one
// batch is refused as invalid input, the other copy sent), each total is
// counted once, and no run leaves nothing pending while the meter keeps an
// older total.
// Counted at the fake.
func TestRunUsageGivenAWindowsTotalsOutOfOrderEndsWithTheNewest(t *testing.T) {
	t.Parallel()
	for _, order := range [][]int{{3, 2, 1}, {1, 3, 2}, {2, 1, 3}, {1, 2, 2, 3}, {1, 1, 2, 3, 3}, {3, 1, 2, 1}} {
		for _, conc := range []int{1, 16} {
			t.Run(fmt.Sprint(order, conc), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t)
				e.srv.CreateMeter("hourly", "sum", "hour")
				start := hourAgo()
				var reports []billing.Usage
				for _, a := range order {
					reports = append(reports, windowTotal("cus_1", start, int64(100*a), a))
				}
				for run := 1; run <= 4; run++ {
					sum, err := e.b.RunUsage(context.Background(), slicesSeq(reports), &billing.RunOptions{Concurrency: conc, BatchSize: 2})
					got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour))
					if err == nil && sum.Pending == 0 && sum.Declined == 0 && sum.Created+sum.AlreadyBilled >= 3 {
						if got != 300 {
							t.Fatalf("run %d leaves nothing pending (%+v), and the meter keeps %v, want the newest total 300", run, sum.Progress, got)
						}
						if n := e.srv.MeterEvents("hourly", "cus_1"); n != 3 {
							t.Errorf("%d meter events, want 3: each total once", n)
						}
						return
					}
					t.Logf("run %d: %+v, %v (%v); the meter keeps %v", run, sum.Progress, err, sum.Failures, got)
				}
				t.Errorf("4 runs and still a total pending")
			})
		}
	}
}
