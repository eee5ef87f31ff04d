package billing_test

import (
	"context"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// runGoroutines returns the stacks of the goroutines running a Run's code:
// its workers, its recorder and its feeder's claims.
func runGoroutines() []string {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			buf = buf[:n]
			break
		}
		buf = make([]byte, 2*len(buf))
	}
	var out []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if strings.Contains(g, "billing.(*Biller).run") || strings.Contains(g, "billing.(*recorder)") ||
			strings.Contains(g, "billing.(*feeder)") {
			out = append(out, g)
		}
	}
	return out
}

// A Config.Price that panics in the middle of a Run, recovered by the
// caller as net/http and job runners do, reaches the caller as the same
// panic, and the Run leaves nothing behind: no goroutine of its own, and
// no claim held by a lease. The next run bills everyone exactly once.
func TestRunPriceThatPanicsEndsTheRun(t *testing.T) {
	const panicAt = 37
	type pricePanic struct{ customer string }
	ids := customers(80)
	for _, batched := range []bool{true, false} {
		name := "run"
		if batched {
			name = "batched run"
		}
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			var store claim.Store = wrapStore(e.store)
			if batched {
				store = e.store
			}
			var calls atomic.Int32
			b := e.biller(func(c *billing.Config) {
				c.Claims = store
				c.Price = func(ctx context.Context, customer, period string) (billing.Price, error) {
					if calls.Add(1) == panicAt {
						panic(pricePanic{customer})
					}
					return flatPrice(amount)(ctx, customer, period)
				}
			})
			var recovered any
			func() {
				defer func() { recovered = recover() }()
				_, _ = b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{BatchSize: 10, Concurrency: 4})
			}()
			if p, ok := recovered.(pricePanic); !ok || p.customer != ids[panicAt-1] {
				t.Fatalf("recovered %v; want Config.Price's panic for %s", recovered, ids[panicAt-1])
			}
			// The Run's goroutines end; a request already sent may still
			// be answered and recorded.
			for len(runGoroutines()) > 0 { // a goroutine left running is the test binary's timeout, with its stack
				time.Sleep(10 * time.Millisecond)
			}
			var held int
			if err := e.pool.QueryRow(context.Background(),
				`SELECT count(*) FROM billonce_claims WHERE state = 'pending' AND lease_until > now()`).Scan(&held); err != nil {
				t.Fatal(err)
			}
			if held > 0 {
				t.Fatalf("%d claims still leased to the Run that panicked", held)
			}
			sum, err := e.biller().Run(context.Background(), period, billing.Customers(ids...), nil)
			if err != nil || !sum.Complete() {
				t.Fatalf("next run: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, ids)
		})
	}
}
