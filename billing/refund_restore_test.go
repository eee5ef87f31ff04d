package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A refund's claim row lost (the claim table restored from a copy taken
// before the refund), the same refund id asked for again past Stripe's
// key window: Stripe has forgotten the key, so only a look at the
// payment's refunds can tell the refund was made. It must not be made
// twice.
func TestRefundWhoseClaimRowWasLostIsNotMadeAgainPastTheKeyWindow(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *billing.Config) { c.API = api })
			pay := paidFor(t, e, "cus_b")
			ctx := context.Background()
			r, err := e.b.Refund(ctx, "cus_b", period, "rma-b", 800)
			wantHow(t, r, err, billing.Created)
			e.exec("DELETE FROM billonce_claims WHERE key = $1", r.Key.String())
			e.srv.Advance(25 * time.Hour)
			again, err := e.b.Refund(ctx, "cus_b", period, "rma-b", 800)
			if got := refundsOf(e, pay); len(got) != 1 || refunded(e, pay) != 800 {
				t.Fatalf("Stripe holds refunds %+v of %s (%d refunded), want the one refund %s of 800; the call again: %+v, %v",
					got, pay, refunded(e, pay), r.StripeID, again, err)
			}
			if err != nil || again.StripeID != r.StripeID {
				t.Fatalf("refund again: %+v, %v; want the receipt of %s", again, err, r.StripeID)
			}
		})
	}
}

// Refund claims lost (a table restored from a copy taken before them),
// refunds asked for under new ids: the claim table no longer counts the
// refunds Stripe holds, so Stripe's own limit is what stops them; a
// refund past what Stripe holds as left fails its claim, and Stripe never
// holds more refunded than the payment.
func TestRefundsWhoseClaimRowsWereLostNeverRefundMoreThanThePayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_n")
	ctx := context.Background()
	r, err := e.b.Refund(ctx, "cus_n", period, "rma-1", 2000)
	wantHow(t, r, err, billing.Created)
	e.exec("DELETE FROM billonce_claims WHERE refund_of IS NOT NULL")
	e.srv.Advance(25 * time.Hour)
	if _, err := e.b.Refund(ctx, "cus_n", period, "rma-2", 2000); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("refund past what Stripe holds as left: %v, want ErrDeclined", err)
	}
	r3, err := e.b.Refund(ctx, "cus_n", period, "rma-3", 500)
	wantHow(t, r3, err, billing.Created)
	if got := refunded(e, pay); got != amount || len(refundsOf(e, pay)) != 2 {
		t.Fatalf("Stripe holds %d refunded in %+v, want %d in two refunds", got, refundsOf(e, pay), amount)
	}
}
