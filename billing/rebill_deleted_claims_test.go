package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// Attempts 1 and 2 of a period are declined for authentication, and a
// person deletes attempt 1's failed claim by hand, leaving attempt 2's
// failed claim and its declined PaymentIntent. A day later, once the card
// works, a Charge of the period must not claim attempt 1 afresh and pay:
// attempt 2's PaymentIntent can still be completed, and when its customer
// completes it the period would be paid twice. Charge reports the
// period declined at attempt 2, as it does with attempt 1's claim in
// place.
func TestChargeAfterAnEarlierClaimWasDeletedDoesNotBillWhileALaterAttemptIsDeclined(t *testing.T) {
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
	var ce *billing.ChargeError
	if !errors.As(chargeErr, &ce) || !errors.Is(chargeErr, billing.ErrDeclined) || ce.Attempt != 2 {
		t.Errorf("Charge after attempt 1's claim was deleted = %v, want declined at attempt 2", chargeErr)
	}
	if pi, err := h.confirmOnSession(second); err == nil && pi.Status == "succeeded" {
		h.deliverAll()
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s (Charge after attempt 1's claim was deleted = %v); want once, by attempt 2's PaymentIntent", n, period, chargeErr)
	}
}

// With attempts 1 and 2 declined and their failed claims deleted by hand,
// attempt 3's failed claim holds the period: Charge reports it declined at
// attempt 3 and pays nothing, and a re-bill of attempt 2 is not claimed
// either. Attempt 3's PaymentIntent, completed by its customer, is the
// period's one payment.
func TestChargeAfterEarlierClaimsWereDeletedReportsTheLatestDecline(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	h.declinedForAuthentication("cus_1")
	for a := 2; a <= 3; a++ {
		if _, err := h.b.Rebill(ctx, "cus_1", period, a, nil); !errors.Is(err, billing.ErrDeclined) {
			t.Fatalf("Rebill(%d) = %v, want declined", a, err)
		}
	}
	ps := h.srv.Payments()
	third := ps[len(ps)-1].ID
	for a := 1; a <= 2; a++ {
		k, err := h.b.Key("cus_1", period, a)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := h.pool.Exec(ctx, "DELETE FROM billonce_claims WHERE key = $1", k.String()); err != nil {
			t.Fatal(err)
		}
	}
	h.advance(25 * time.Hour)
	h.srv.Honor("cus_1")
	_, chargeErr := h.b.Charge(ctx, "cus_1", period, nil)
	var ce *billing.ChargeError
	if !errors.As(chargeErr, &ce) || !errors.Is(chargeErr, billing.ErrDeclined) || ce.Attempt != 3 {
		t.Errorf("Charge after attempts 1 and 2's claims were deleted = %v, want declined at attempt 3", chargeErr)
	}
	if n := h.count("cus_1"); n != 0 {
		t.Fatalf("cus_1 paid %d times before attempt 3's PaymentIntent was completed, want 0", n)
	}
	h.completeOnSession(third)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s, want once, by attempt 3's PaymentIntent", n, period)
	}
}
