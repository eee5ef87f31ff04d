package billing_test

import (
	"context"
	"errors"
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
