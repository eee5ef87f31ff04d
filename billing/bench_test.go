package billing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/retry"
)

// BenchmarkCharge is one Charge per iteration, each for a new customer:
// key, claim in PostgreSQL, one call to the fake Stripe, success recorded.
func BenchmarkCharge(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	b.ResetTimer()
	for i := range b.N {
		if _, err := e.b.Charge(ctx, fmt.Sprintf("cus_%09d", i), period, nil); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if n := e.srv.Stats().Paid; n != int64(b.N) {
		b.Fatalf("%d charges for %d customers", n, b.N)
	}
}

// BenchmarkChargeAlreadyRecorded is the cost of a repeated Charge: one
// claim round trip, no call to Stripe.
func BenchmarkChargeAlreadyRecorded(b *testing.B) {
	e := newEnv(b)
	ctx := context.Background()
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for range b.N {
		if _, err := e.b.Charge(ctx, "cus_1", period, nil); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkChargeAgainstRefusedPort is how long one Charge with the
// default retry policy and unreachable rules takes to give up on a port
// that refuses every connection: its last attempt starts within
// UnreachableAfter (10s) of its first, and the claim's bookkeeping comes
// on top. Each iteration is a new Biller, whose count of misses starts
// afresh, and takes seconds: run it with -benchtime=Nx.
func BenchmarkChargeAgainstRefusedPort(b *testing.B) {
	refused := func(c *billing.Config) {
		c.StripeURL = refusedURL(b)
		c.Retry = retry.Policy{} // the defaults, as in production
	}
	e := newEnv(b, refused)
	ctx := context.Background()
	var longest time.Duration
	for i := 0; b.Loop(); i++ {
		biller := e.biller(refused)
		start := time.Now()
		if _, err := biller.Charge(ctx, fmt.Sprintf("cus_%09d", i), period, nil); !errors.Is(err, billing.ErrStripeUnreachable) {
			b.Fatalf("Charge: %v; want ErrStripeUnreachable", err)
		}
		longest = max(longest, time.Since(start))
	}
	b.ReportMetric(longest.Seconds(), "longest-s")
}
