package billing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A payout's events move its claim only when they come from its account:
// the same payout.failed as the platform's or another account's, with the
// claim's key and payout id, changes nothing.
func TestPayoutEventOfAnotherAccountDoesNotFailItsClaim(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	acct := h.srv.CreateAccount()
	h.srv.SetBalance(acct, "usd", 100_000)
	ctx := context.Background()
	r, err := h.b.Payout(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Created)
	h.srv.Advance(10 * 24 * time.Hour)
	h.srv.SettleNow()
	h.deliverAll()
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
		t.Fatalf("claim %s after payout.paid, want succeeded", c.State)
	}
	if err := h.srv.Settle(r.StripeID, "failed", "account_closed"); err != nil {
		t.Fatal(err)
	}
	var failed []billingtest.Event
	for _, ev := range h.eventsOf(r.StripeID) {
		if ev.Type == "payout.failed" {
			failed = append(failed, ev)
		}
	}
	if len(failed) != 1 || failed[0].Account != acct {
		t.Fatalf("events %+v, want one payout.failed on %s", failed, acct)
	}
	for _, other := range []string{"", h.srv.CreateAccount()} {
		ev := failed[0]
		ev.ID += "_as_" + other
		ev.Body = []byte(strings.Replace(strings.Replace(string(ev.Body), `"account":"`+acct+`"`, `"account":"`+other+`"`, 1), failed[0].ID, ev.ID, 1))
		if body := h.deliver(ev); body != "otherpayment" {
			t.Fatalf("payout.failed on account %q: answered %q, want otherpayment", other, body)
		}
		if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
			t.Fatalf("claim %s after a payout.failed of account %q, want succeeded", c.State, other)
		}
	}
	h.deliver(failed[0])
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateFailed {
		t.Fatalf("claim %s after its own account's payout.failed, want failed", c.State)
	}
	if n := len(movementsTo(h.env, "payout", acct)); n != 1 {
		t.Fatalf("%d payouts, want 1", n)
	}
}
