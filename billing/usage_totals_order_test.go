package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
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

// A run stopped while a window's second total is at Stripe (committed
// there, its answer not back): the third total, waiting for it, is handed
// back unsent, and the next run settles the second from Stripe's answer
// to its key and then sends the third, so the meter ends with the newest
// and counts each total once. Counted at the fake.
func TestRunUsageStoppedWhileTheSecondTotalIsAtStripeEndsWithTheNewest(t *testing.T) {
	for _, conc := range []int{1, 16} {
		t.Run(fmt.Sprint(conc), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.srv.CreateMeter("hourly", "sum", "hour")
			start := hourAgo()
			reports := []billing.Usage{windowTotal("cus_1", start, 100, 1), windowTotal("cus_1", start, 200, 2), windowTotal("cus_1", start, 300, 3)}
			arrived, release := make(chan struct{}), make(chan struct{})
			var once sync.Once
			var mu sync.Mutex
			var keys []string // each total is sent only once the one before it is settled
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method != http.MethodPost || r.Path != meterEvents {
					return billingtest.Fault{}
				}
				mu.Lock()
				if !slices.Contains(keys, r.IdempotencyKey) {
					keys = append(keys, r.IdempotencyKey)
				}
				isSecond := len(keys) >= 2 && keys[1] == r.IdempotencyKey
				mu.Unlock()
				if !isSecond {
					return billingtest.Fault{}
				}
				hold := false
				once.Do(func() { hold = true; close(arrived) })
				if hold {
					return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
				}
				return billingtest.Fault{}
			})
			ctx, cancel := context.WithCancel(context.Background())
			go func() { <-arrived; cancel() }()
			_, err := e.b.RunUsage(ctx, slicesSeq(reports), &billing.RunOptions{Concurrency: conc})
			close(release)
			if !errors.Is(err, context.Canceled) {
				t.Errorf("RunUsage = %v; want stopped", err)
			}
			if got := e.srv.MeterEvents("hourly", "cus_1"); got != 2 {
				t.Errorf("%d meter events after the stopped run, want 2: the first total, and the second, held", got)
			}
			e.srv.SetScript(nil)
			for run := 1; run <= 3; run++ {
				sum, err := e.b.RunUsage(context.Background(), slicesSeq(reports), &billing.RunOptions{Concurrency: conc})
				if err == nil && sum.Complete() {
					break
				}
				t.Logf("run %d: %+v, %v (%v)", run, sum.Progress, err, sum.Failures)
				if run == 3 {
					t.Fatalf("3 runs after the stopped one, and still not complete")
				}
			}
			if got := e.srv.MeterTotal("hourly", "cus_1", start, start.Add(time.Hour)); got != 300 {
				t.Errorf("the meter keeps %v, want the newest total 300", got)
			}
			if got := e.srv.MeterEvents("hourly", "cus_1"); got != 3 {
				t.Errorf("%d meter events, want 3: each total once", got)
			}
		})
	}
}
