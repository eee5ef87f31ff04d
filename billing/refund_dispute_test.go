package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing"
)

// A disputed payment is not refunded: Stripe refuses (charge_disputed),
// whether or not billonce heard of the dispute, and the refund's claim
// fails with what to do; nothing is refunded.
func TestRefundOfADisputedPaymentIsRefusedAndRefundsNothing(t *testing.T) {
	t.Parallel()
	for _, heard := range []bool{false, true} {
		name := "dispute not delivered"
		if heard {
			name = "dispute delivered"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.Charges, nil)
			pay := paidFor(t, h.env, "cus_d")
			if _, err := h.srv.Dispute(pay, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			if heard {
				h.deliverAll()
			}
			ctx := context.Background()
			_, err := h.b.Refund(ctx, "cus_d", period, "rma-d", 1000)
			if !errors.Is(err, billing.ErrDeclined) || !strings.Contains(err.Error(), "disputed") {
				t.Fatalf("refund of a disputed payment: %v, want ErrDeclined saying it is disputed", err)
			}
			_, err = h.b.Refund(ctx, "cus_d", period, "rma-d", 1000)
			if !errors.Is(err, billing.ErrDeclined) {
				t.Fatalf("the same refund again: %v, want ErrDeclined", err)
			}
			if got := refundsOf(h.env, pay); len(got) != 0 {
				t.Fatalf("Stripe holds refunds %+v of a disputed payment", got)
			}
		})
	}
}
