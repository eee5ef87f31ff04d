package billing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
)

// The payment a refund refunds is the period's paid attempt, whichever
// API made it: a Biller switched to the other API refunds it, and the
// same refund id from either is one refund.
func TestRefundAfterTheAPISwitchedIsOneRefundOfThePayment(t *testing.T) {
	t.Parallel()
	for _, apis := range [][2]billing.API{{billing.Charges, billing.PaymentIntents}, {billing.PaymentIntents, billing.Charges}} {
		t.Run(string(apis[0])+" then "+string(apis[1]), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *billing.Config) { c.API = apis[0] })
			pay := paidFor(t, e, "cus_s")
			ctx := context.Background()
			other := e.biller(func(c *billing.Config) { c.API = apis[1] })
			r, err := other.Refund(ctx, "cus_s", period, "rma-s", 700)
			wantHow(t, r, err, billing.Created)
			again, err := e.b.Refund(ctx, "cus_s", period, "rma-s", 700)
			wantHow(t, again, err, billing.AlreadyBilled)
			if got := refundsOf(e, pay); len(got) != 1 || got[0].ID != r.StripeID || refunded(e, pay) != 700 {
				t.Fatalf("Stripe holds refunds %+v of %s, want the one refund %s of 700", got, pay, r.StripeID)
			}
		})
	}
}

// A period declined and paid by a re-bill: the refund refunds the
// re-bill's payment, once, and nothing of the declined attempt.
func TestRefundOfAPeriodARebillPaidRefundsTheRebillsPayment(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *billing.Config) { c.API = api })
			ctx := context.Background()
			e.srv.Decline("cus_rb", "card_declined")
			if _, err := e.b.Charge(ctx, "cus_rb", period, nil); !errors.Is(err, billing.ErrDeclined) {
				t.Fatalf("declined charge: %v", err)
			}
			e.srv.Honor("cus_rb")
			paid, err := e.b.Rebill(ctx, "cus_rb", period, 2, nil)
			wantHow(t, paid, err, billing.Created)
			for range 2 {
				r, err := e.b.Refund(ctx, "cus_rb", period, "rma-rb", amount)
				if err != nil {
					t.Fatalf("refund of the re-bill's payment: %v", err)
				}
				if r.Amount != amount {
					t.Fatalf("receipt %+v", r)
				}
			}
			if got := refundsOf(e, paid.StripeID); len(got) != 1 || refunded(e, paid.StripeID) != amount || len(e.srv.Movements("refund")) != 1 {
				t.Fatalf("Stripe holds refunds %+v, want the one refund of %s's %d", e.srv.Movements("refund"), paid.StripeID, amount)
			}
			if _, err := e.b.Refund(ctx, "cus_rb", period, "rma-rb2", 1); !errors.Is(err, billing.ErrInvalid) {
				t.Fatalf("a refund past the refunded payment: %v, want ErrInvalid", err)
			}
		})
	}
}
