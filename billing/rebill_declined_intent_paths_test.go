package billing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/paymentintent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// More paths of a re-bill that follows a PaymentIntent declined off
// session: the Biller switched APIs since, the PaymentIntent its customer
// completed failed as it settled, the cancel's first try was lost and the
// customer completed the PaymentIntent before the next call.

// Attempt 1 was declined under the PaymentIntents API; the Biller now uses
// the Charges API. The re-bill's charge cannot be completed later, but
// attempt 1's PaymentIntent still can: it is canceled before the re-bill's
// key is sent. Counted at the fake.
func TestRebillUnderTheChargesAPICancelsThePaymentIntentAnEarlierAttemptDeclined(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	charges := h.biller(func(c *billing.Config) { c.API = billing.Charges })
	r, err := charges.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("Rebill(2) under the Charges API = %+v, %v; want created", r, err)
	}
	if cs := h.cancels(pi); len(cs) != 1 {
		t.Errorf("cancels of attempt 1's PaymentIntent %s: %d, want 1", pi, len(cs))
	}
	h.wantCompletionRefused(pi)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
}

// The customer completed the declined PaymentIntent on session with a bank
// debit, so a re-bill answered already billed, processing; the debit then
// failed as it settled, and the PaymentIntent needs a payment method
// again. The next re-bill cancels it, and bills the period once, whatever
// the customer does with the PaymentIntent afterwards. Counted at the fake.
func TestRebillAfterTheCompletedIntentFailedAsItSettledCancelsItAndBillsOnce(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	h.srv.SettleLater("cus_1", billingtest.Async{After: time.Hour, FailureCode: "insufficient_funds"})
	if got, err := h.confirmOnSession(pi); err != nil || got.Status != stripe.PaymentIntentStatusProcessing {
		t.Fatalf("the customer completing %s on session = %+v, %v; want processing", pi, got, err)
	}
	r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.AlreadyBilled || !r.Processing || r.StripeID != pi {
		t.Fatalf("Rebill(2) while %s is processing = %+v, %v; want already billed, processing", pi, r, err)
	}
	h.srv.Advance(time.Hour)
	h.deliverAll()
	if got := h.srv.Final()[pi]; got != "requires_payment_method" {
		t.Fatalf("%s is %s after its debit failed, want requires_payment_method", pi, got)
	}
	if n := h.count("cus_1"); n != 0 {
		t.Fatalf("%d payments after the debit failed, want 0", n)
	}
	h.srv.SettleLater("cus_1", billingtest.Async{})
	r, err = h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("Rebill(2) after the debit failed = %+v, %v; want created", r, err)
	}
	// The customer tries again on session (a new request, so a new key).
	p := &stripe.PaymentIntentConfirmParams{}
	p.SetIdempotencyKey("on-session-again-" + pi)
	if got, err := (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).Confirm(pi, p); err == nil {
		t.Errorf("the customer completing %s again after the re-bill = %s; want it refused, the PaymentIntent canceled", pi, got.Status)
	}
	if got := h.srv.Final()[pi]; got != "canceled" {
		t.Errorf("%s is %s after the re-bill, want canceled", pi, got)
	}
	h.srv.Advance(time.Hour)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
	if c := h.claimOf2("cus_1", 2); c.State != claim.StateSucceeded {
		t.Errorf("attempt 2 = %s (%s), want succeeded", c.State, c.LastError)
	}
}

// The re-bill's cancel got a 5xx before Stripe ran it, and before the next
// call the customer completed the PaymentIntent on session: the next
// re-bill's cancel is refused, the PaymentIntent pays the period, and the
// re-bill sends nothing. Counted at the fake.
func TestRebillWhoseDeclinedIntentWasCompletedAfterALostCancelSendsNothing(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	h.srv.FailNext(billingtest.Match{Path: "/v1/payment_intents/" + pi + "/cancel"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	b := h.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
	if _, err := b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("Rebill with the cancel lost = %v; want ErrOutcomeUnknown", err)
	}
	h.completeOnSession(pi)
	r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != pi || r.Attempt != 1 {
		t.Fatalf("Rebill(2) = %+v, %v; want attempt 1's receipt, already billed by %s", r, err, pi)
	}
	if sent := h.sentWith(h.keyOf("cus_1", 2)); len(sent) != 0 {
		t.Errorf("the re-bill's key was sent: %+v", sent)
	}
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
	h.wantBilledBy("cus_1", pi)
}

// Customers complete their declined PaymentIntents on session while their
// periods are re-billed, each at the same moment as its re-bill: whichever
// Stripe runs first, the cancel or the completion, every period is paid
// exactly once, and the re-bill answers which payment paid it. Counted at
// the fake.
func TestRebillRacingTheCustomersCompletionPaysEachPeriodOnce(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	const n = 12
	pis := map[string]string{}
	for i := range n {
		cus := fmt.Sprintf("cus_%d", i)
		pis[cus] = h.declinedForAuthentication(cus)
		h.srv.Honor(cus)
	}
	type answer struct {
		r   billing.Receipt
		err error
	}
	answers := make(map[string]answer, n)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for cus, pi := range pis {
		wg.Add(2)
		go func() {
			defer wg.Done()
			r, err := h.b.Rebill(ctx, cus, period, 2, nil)
			mu.Lock()
			answers[cus] = answer{r, err}
			mu.Unlock()
		}()
		go func() {
			defer wg.Done()
			h.confirmOnSession(pi) // refused if the cancel came first
		}()
	}
	wg.Wait()
	h.deliverAll()
	for cus, pi := range pis {
		a := answers[cus]
		if n := h.count(cus); n != 1 {
			t.Errorf("%s paid %d times for %s; want once (Rebill = %+v, %v)", cus, n, period, a.r, a.err)
			continue
		}
		switch {
		case a.err != nil:
			t.Errorf("%s: Rebill = %v", cus, a.err)
		case a.r.Outcome == billing.AlreadyBilled && a.r.StripeID == pi:
			h.wantBilledBy(cus, pi)
		case a.r.Outcome == billing.Created:
			h.wantBilledBy(cus, a.r.StripeID)
			h.wantCompletionRefused(pi)
		default:
			t.Errorf("%s: Rebill = %+v; want created, or attempt 1's %s already billed", cus, a.r, pi)
		}
	}
}

// Re-bill 2 canceled attempt 1's PaymentIntent and was declined; re-bill 3
// comes two days later, when Stripe has forgotten the first cancel's key:
// its cancel of attempt 1's PaymentIntent runs again, is refused as the
// PaymentIntent is canceled already, and re-bill 3 cancels attempt 2's and
// bills the period once. Counted at the fake.
func TestRebillDaysAfterTheFirstCancelBillsOnce(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi1 := h.declinedForAuthentication("cus_1")
	if _, err := h.b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Rebill(2) = %v; want declined", err)
	}
	ps := h.srv.Payments()
	pi2 := ps[len(ps)-1].ID
	h.srv.Advance(48 * time.Hour)
	h.advance(48 * time.Hour)
	h.srv.Honor("cus_1")
	r, err := h.b.Rebill(ctx, "cus_1", period, 3, nil)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("Rebill(3) two days later = %+v, %v; want created", r, err)
	}
	for _, pi := range []string{pi1, pi2} {
		if got := h.srv.Final()[pi]; got != "canceled" {
			t.Errorf("%s is %s, want canceled", pi, got)
		}
	}
	p := &stripe.PaymentIntentConfirmParams{}
	p.SetIdempotencyKey("on-session-later-" + pi1)
	if got, err := (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).Confirm(pi1, p); err == nil {
		t.Errorf("the customer completing %s after re-bill 3 = %s; want refused", pi1, got.Status)
	}
	h.wantCompletionRefused(pi2)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
}
