package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// Attempts 1 and 2 of a period are declined for authentication, and a
// person deletes attempt 1's failed claim by hand (after canceling its
// PaymentIntent, as the README says), leaving attempt 2's failed claim and
// its declined PaymentIntent. A day later, once the card works, a Charge of the period
// claims attempt 1 afresh and pays, although attempt 2's PaymentIntent can
// still be completed: when its customer completes it, the period is paid
// twice. A Charge must not bill a period whose later attempt is failed.
func TestChargeAfterAnEarlierClaimWasDeletedDoesNotBillWhileALaterAttemptIsDeclined(t *testing.T) {
	t.Skip("known: the claim statement refuses a period failed under another scope, not one whose attempt 1 claim was deleted by hand while a later attempt of the same scope is failed; Charge then bills attempt 1 afresh without canceling the later attempt's PaymentIntent")
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	first := h.declinedForAuthentication("cus_1")
	if _, err := h.b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Rebill(2) = %v, want declined", err)
	}
	ps := h.srv.Payments()
	second := ps[len(ps)-1].ID
	if second == first {
		t.Fatalf("Rebill(2) made no PaymentIntent of its own")
	}
	h.wantCompletionRefused(first) // the re-bill canceled it
	if _, err := h.pool.Exec(ctx, "DELETE FROM billonce_claims WHERE key = $1", h.key("cus_1")); err != nil {
		t.Fatal(err)
	}
	h.advance(25 * time.Hour) // Stripe has forgotten attempt 1's key
	h.srv.Honor("cus_1")
	_, chargeErr := h.b.Charge(ctx, "cus_1", period, nil)
	if pi, err := h.confirmOnSession(second); err == nil && pi.Status == "succeeded" {
		h.deliverAll()
	}
	if n := h.count("cus_1"); n > 1 {
		t.Errorf("cus_1 paid %d times for %s (Charge after attempt 1's claim was deleted = %v); want at most once", n, period, chargeErr)
	}
}
