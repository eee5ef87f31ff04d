package billing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// A refund Stripe reported succeeded fails later (its customer's bank
// returned it): nothing is refunded by its id, so its claim fails and the
// failure is reported, the refund id answers ErrDeclined instead of a
// receipt, and its amount is refundable again under a new id.
func TestSucceededRefundThatFailsLaterFailsItsClaim(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	pay := paidFor(t, h.env, "cus_f")
	ctx := context.Background()
	r, err := h.b.Refund(ctx, "cus_f", period, "rma-f", 1000)
	wantHow(t, r, err, billing.Created)
	if r.Processing {
		t.Fatalf("receipt %+v, want a succeeded refund", r)
	}
	if err := h.srv.Settle(r.StripeID, "failed", "lost_or_stolen_card"); err != nil {
		t.Fatal(err)
	}
	h.deliverAll()
	if got := refunded(h.env, pay); got != 0 {
		t.Fatalf("Stripe holds %d refunded, want 0 once the refund failed", got)
	}
	again, err := h.b.Refund(ctx, "cus_f", period, "rma-f", 1000)
	if !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("refund again after Stripe failed it: %+v, %v; want ErrDeclined (Stripe holds it failed)", again, err)
	}
	c, err := h.store.Get(ctx, r.Key.String())
	if err != nil || c.State != claim.StateFailed || c.FailureCode != "lost_or_stolen_card" {
		t.Fatalf("refund claim %+v, %v; want failed with lost_or_stolen_card", c, err)
	}
	var reported bool
	for _, ev := range h.observed() {
		reported = reported || ev.Kind == billing.EventSettled && ev.Key == r.Key.String() && errors.Is(ev.Err, billing.ErrDeclined)
	}
	if !reported {
		t.Fatalf("the failed refund was not reported: %+v", h.observed())
	}
	r2, err := h.b.Refund(ctx, "cus_f", period, "rma-f2", amount)
	wantHow(t, r2, err, billing.Created)
	if got := refunded(h.env, pay); got != amount {
		t.Fatalf("Stripe holds %d refunded, want the whole %d", got, amount)
	}
}
