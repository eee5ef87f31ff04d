package billing_test

import (
	"context"
	"fmt"
	"testing"
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
