package billing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A pending refund whose event never arrives is settled by Reconcile's
// read of it: succeeded, or failed and reported, as Stripe holds it.
func TestPendingRefundIsSettledByReconcilesRead(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fails=%v", fail), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			pay := paidFor(t, e, "cus_o")
			code := ""
			if fail {
				code = "expired_or_canceled_card"
			}
			e.srv.SettleLater("cus_o", billingtest.Async{After: time.Hour, FailureCode: code})
			ctx := context.Background()
			r, err := e.b.Refund(ctx, "cus_o", period, "rma-o", 1500)
			wantHow(t, r, err, billing.Created)
			if !r.Processing {
				t.Fatalf("receipt %+v, want Processing", r)
			}
			e.advance(2 * time.Hour) // on both clocks; Stripe settles the refund
			sum, err := e.b.Reconcile(ctx, nil)
			c, gerr := e.store.Get(ctx, r.Key.String())
			if gerr != nil {
				t.Fatal(gerr)
			}
			want, held := claim.StateSucceeded, int64(1500)
			if fail {
				want, held = claim.StateFailed, 0
			}
			if c.State != want || refunded(e, pay) != held {
				t.Fatalf("refund claim %s after Reconcile (%+v, %v); Stripe holds %d refunded; want %s and %d", c.State, sum, err, refunded(e, pay), want, held)
			}
			again, err := e.b.Refund(ctx, "cus_o", period, "rma-o", 1500)
			if fail != errors.Is(err, billing.ErrDeclined) || !fail && (again.Processing || again.StripeID != r.StripeID) {
				t.Fatalf("refund again after Reconcile: %+v, %v", again, err)
			}
		})
	}
}
