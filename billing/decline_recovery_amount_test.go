package billing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// A PaymentIntent declined off session whose amount another writer
// changed (the dashboard, other code holding the key) before its customer
// completed it on session: what was paid is not the claim's amount, so the
// period is not reported billed for it, and nothing more is sent. Counted
// at the fake.

// paidFor returns what customer's succeeded payments moved, in all.
func (e *env) paidFor(customer string) int64 {
	var sum int64
	for _, p := range e.srv.Payments() {
		if p.Customer == customer && p.Paid {
			sum += p.Amount
		}
	}
	return sum
}

// The decline's answer was lost; before billonce resumes its key, the
// PaymentIntent's amount is lowered to 1 and its customer completes it.
// Stripe replays the decline, and a read shows the PaymentIntent
// succeeded, for 1: the claim's 2500 were not paid.
func TestReplayedDeclineOfAnIntentCompletedForAnotherAmountNeedsAPerson(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	b, declined := h.declineAnswerLost("cus_1")
	pi, want := declined.ID, declined.Amount
	if err := h.srv.UpdateIntentAmount(pi, 1); err != nil {
		t.Fatal(err)
	}
	h.completeOnSession(pi)
	for _, call := range []struct {
		name string
		do   func() (billing.Receipt, error)
	}{
		{"Charge", func() (billing.Receipt, error) { return b.Charge(ctx, "cus_1", period, nil) }},
		{"Rebill(2)", func() (billing.Receipt, error) { return b.Rebill(ctx, "cus_1", period, 2, nil) }},
	} {
		r, err := call.do()
		if err == nil {
			t.Errorf("%s after %s was paid for 1 = %+v (%s for %d); want it not reported billed for %d", call.name, pi, r, r.Outcome, r.Amount, want)
		}
	}
	if got := h.paidFor("cus_1"); got != 1 {
		t.Errorf("cus_1 paid %d for %s; want only the 1 its customer paid, nothing sent again", got, period)
	}
	if c := h.claimOf("cus_1"); c.State == claim.StateSucceeded {
		t.Errorf("attempt 1's claim is succeeded by %s, which paid 1, not its %d", c.StripeID, c.Amount)
	}
}

// The decline was recorded; the PaymentIntent's amount is then lowered to
// 1 and its customer completes it. The re-bill's cancel finds it
// succeeded, for 1: the period is not reported billed for the claim's
// 2500, and the re-bill sends nothing.
func TestRebillFindingTheDeclinedIntentCompletedForAnotherAmountNeedsAPerson(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	if err := h.srv.UpdateIntentAmount(pi, 1); err != nil {
		t.Fatal(err)
	}
	h.completeOnSession(pi)
	for range 2 {
		r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
		if !errors.Is(err, billing.ErrNeedsReconciliation) {
			t.Errorf("Rebill(2) after %s was paid for 1 = %+v (%s for %d), %v; want ErrNeedsReconciliation", pi, r, r.Outcome, r.Amount, err)
		}
	}
	if sent := h.sentWith(h.keyOf("cus_1", 2)); len(sent) != 0 {
		t.Errorf("the re-bill's key was sent: %+v", sent)
	}
	if got := h.paidFor("cus_1"); got != 1 {
		t.Errorf("cus_1 paid %d for %s; want only the 1 its customer paid", got, period)
	}
}

// The declined PaymentIntent is completed by other code holding the key
// with capture_method manual, and only 1 of its 2500 captured: Stripe
// reports it succeeded, for its amount 2500 but amount_received 1. Its
// success event does not settle the failed claim, and the re-bill that
// follows sends nothing and needs a person. Counted at the fake.
func TestDeclinedIntentCapturedInPartIsNotReportedBilled(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	if err := h.srv.CaptureIntentPartly(pi, 1); err != nil {
		t.Fatal(err)
	}
	h.deliverAll()
	if c := h.claimOf("cus_1"); c.State != claim.StateFailed {
		t.Errorf("attempt 1's claim is %s by %s, which received 1 of its %d; want it failed still", c.State, c.StripeID, c.Amount)
	}
	r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("Rebill(2) after %s received 1 = %+v (%s for %d), %v; want ErrNeedsReconciliation", pi, r, r.Outcome, r.Amount, err)
	}
	if sent := h.sentWith(h.keyOf("cus_1", 2)); len(sent) != 0 {
		t.Errorf("the re-bill's key was sent: %+v", sent)
	}
}
