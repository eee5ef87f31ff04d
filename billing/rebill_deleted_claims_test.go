package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
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
	pis := h.declinedThrough("cus_1", 2)
	first, second := pis[0], pis[1]
	h.wantCompletionRefused(first) // the re-bill canceled it
	h.deleteClaims("cus_1", 1)
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
	third := h.declinedThrough("cus_1", 3)[2]
	h.deleteClaims("cus_1", 1, 2)
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

// With attempt 1's failed claim deleted by hand and attempt 2's left, the
// decline Charge reports is re-billed as it says, with attempt 3: the
// re-bill follows attempt 2, cancels its declined PaymentIntent and pays
// the period once. Charge and Run then report the period billed by
// attempt 3, though attempt 1 has no claim.
func TestRebillAfterAnEarlierClaimWasDeletedFollowsTheLatestDecline(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	second := h.declinedThrough("cus_1", 2)[1]
	h.deleteClaims("cus_1", 1)
	h.advance(25 * time.Hour)
	h.srv.Honor("cus_1")
	_, err := h.b.Charge(ctx, "cus_1", period, nil)
	var ce *billing.ChargeError
	if !errors.As(err, &ce) || !errors.Is(err, billing.ErrDeclined) || ce.Attempt != 2 {
		t.Fatalf("Charge = %v, want declined at attempt 2", err)
	}
	r, err := h.b.Rebill(ctx, "cus_1", period, ce.Attempt+1, nil)
	if err != nil || r.Attempt != 3 {
		t.Fatalf("Rebill(%d) = %+v, %v; want attempt 3 paid", ce.Attempt+1, r, err)
	}
	h.wantCompletionRefused(second) // the re-bill canceled it
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s, want once", n, period)
	}
	if r, err := h.b.Charge(ctx, "cus_1", period, nil); err != nil || r.Outcome != billing.AlreadyBilled || r.Attempt != 3 {
		t.Errorf("Charge after the re-bill = %+v, %v; want already billed by attempt 3", r, err)
	}
	sum, err := h.b.Run(ctx, period, billing.Customers("cus_1"), nil)
	if err != nil || sum.AlreadyBilled != 1 || len(sum.Failures) != 0 {
		t.Errorf("Run after the re-bill = %+v, %v; want cus_1 already billed", sum, err)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s after Charge and Run, want once", n, period)
	}
}

// Attempt 1 of a period is declined, and a dunning job's re-bill (attempt
// 2, which cancels attempt 1's PaymentIntent first) is declined too, but
// the job dies before Stripe's answer. A person deletes attempt 1's
// failed claim. Once Stripe has forgotten the keys, Reconcile finds
// attempt 2's PaymentIntent by Stripe's search, declined, and fails its
// claim. A Charge of the period then claims attempt 1 afresh, and its
// answer is lost; meanwhile the customer completes attempt 2's
// PaymentIntent on session, and its success event arrives while attempt 1's
// new claim holds the period. That PaymentIntent pays the period: once
// attempt 1's new claim is declined, attempt 2's claim must record it as
// paid, a Charge must not answer that the period was declined, and the
// re-bill a declined period invites must not charge again. Counted at the
// fake.
func TestARebillsPaymentIntentCompletedAfterAttempt1WasDeletedAndChargedAfreshPaysThePeriod(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	lost := h.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
	searchDown := func(on bool) {
		h.srv.SetScript(nil)
		if on {
			h.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if strings.HasSuffix(r.Path, "/search") {
					return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
				}
				return billingtest.Fault{}
			})
		}
	}
	first := h.declinedForAuthentication("cus_1")
	k2, err := h.b.Key("cus_1", period, 2)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.FailNext(billingtest.Match{IdempotencyKey: k2.String()}, billingtest.Fault{Kind: billingtest.FaultCut})
	searchDown(true)
	if _, err := lost.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("the dunning job's Rebill(2), its answer lost = %v; want ErrOutcomeUnknown", err)
	}
	searchDown(false)
	ps := h.srv.Payments()
	second := ps[len(ps)-1]
	if second.ID == first || second.Metadata[billing.MetaKey] != k2.String() || second.Status != "requires_payment_method" {
		t.Fatalf("the last payment is %s (%s, key %s), want the re-bill's declined PaymentIntent", second.ID, second.Status, second.Metadata[billing.MetaKey])
	}
	h.wantCompletionRefused(first) // the re-bill canceled it
	h.deleteClaims("cus_1", 1)
	h.advance(25 * time.Hour) // Stripe has forgotten both keys
	if _, err := h.b.Reconcile(ctx, nil); err != nil {
		t.Fatalf("Reconcile = %v", err)
	}
	if c2 := h.claimOf2("cus_1", 2); c2.State != claim.StateFailed || c2.StripeID != second.ID {
		t.Fatalf("attempt 2's claim after Reconcile = %s %s (%s); want failed by its PaymentIntent %s", c2.State, c2.StripeID, c2.LastError, second.ID)
	}
	// A Charge of the period claims attempt 1 afresh (or is refused), its
	// answer lost; the customer completes attempt 2's PaymentIntent, and
	// its events arrive.
	h.srv.FailNext(billingtest.Match{IdempotencyKey: h.key("cus_1")}, billingtest.Fault{Kind: billingtest.FaultCut})
	searchDown(true)
	_, freshErr := lost.Charge(ctx, "cus_1", period, nil)
	searchDown(false)
	h.completeOnSession(second.ID)
	h.deliverAll()
	_, resumeErr := h.b.Charge(ctx, "cus_1", period, nil)
	if errors.Is(resumeErr, billing.ErrDeclined) {
		t.Errorf("Charge after attempt 2's PaymentIntent paid the period = %v; want no decline", resumeErr)
	}
	if c2 := h.claimOf2("cus_1", 2); c2.State != claim.StateSucceeded || c2.StripeID != second.ID {
		t.Errorf("attempt 2's claim = %s %s (%s); want succeeded by its PaymentIntent %s, which paid the period (Charge of attempt 1 afresh = %v, then %v)",
			c2.State, c2.StripeID, c2.LastError, second.ID, freshErr, resumeErr)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 paid %d times for %s; want once, by %s", n, period, second.ID)
	}
	h.srv.Honor("cus_1")
	r, err := h.b.Rebill(ctx, "cus_1", period, 3, nil)
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s after Rebill(3) = %+v, %v; want once, by %s", n, period, r, err, second.ID)
	}
}

// With attempts 1 to 3 declined and attempt 2's failed claim deleted by
// hand, Charge names the latest decline, attempt 3's, so that the re-bill
// it advises is attempt 4, which pays the period once: naming attempt 1
// would advise attempt 2, which the claim store answers with attempt 3's
// decline, for ever.
func TestChargeNamesTheLatestDeclineAcrossADeletedAttempt(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	h.declinedThrough("cus_1", 3)
	h.deleteClaims("cus_1", 2)
	h.srv.Honor("cus_1")
	_, err := h.b.Charge(ctx, "cus_1", period, nil)
	var ce *billing.ChargeError
	if !errors.As(err, &ce) || !errors.Is(err, billing.ErrDeclined) || ce.Attempt != 3 {
		t.Fatalf("Charge with attempt 2's claim deleted = %v, want declined at attempt 3", err)
	}
	if r, err := h.b.Rebill(ctx, "cus_1", period, ce.Attempt+1, nil); err != nil || r.Attempt != 4 {
		t.Fatalf("Rebill(%d) = %+v, %v; want attempt 4 paid", ce.Attempt+1, r, err)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s, want once", n, period)
	}
}

// declinedThrough has customer's period declined for authentication at
// attempts 1 to n (Charge, then Rebill 2 to n) and returns each attempt's
// declined PaymentIntent, attempt 1's first.
func (h *hookEnv) declinedThrough(customer string, n int) []string {
	h.tb.Helper()
	pis := []string{h.declinedForAuthentication(customer)}
	for a := 2; a <= n; a++ {
		if _, err := h.b.Rebill(context.Background(), customer, period, a, nil); !errors.Is(err, billing.ErrDeclined) {
			h.tb.Fatalf("Rebill(%d) = %v, want declined", a, err)
		}
		ps := h.srv.Payments()
		if id := ps[len(ps)-1].ID; id != pis[len(pis)-1] {
			pis = append(pis, id)
		} else {
			h.tb.Fatalf("Rebill(%d) made no PaymentIntent of its own", a)
		}
	}
	return pis
}

// deleteClaims deletes the claims of customer's period at attempts, as a
// person does by hand.
func (h *hookEnv) deleteClaims(customer string, attempts ...int) {
	h.tb.Helper()
	for _, a := range attempts {
		k, err := h.b.Key(customer, period, a)
		if err != nil {
			h.tb.Fatal(err)
		}
		if _, err := h.pool.Exec(context.Background(), "DELETE FROM billonce_claims WHERE key = $1", k.String()); err != nil {
			h.tb.Fatal(err)
		}
	}
}
