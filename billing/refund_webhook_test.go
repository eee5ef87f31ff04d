package billing_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// refundEvent builds a signable event about a refund, as Stripe would
// send it, whatever its id and metadata say.
func refundEvent(t *testing.T, id, typ, refundID, of, status, key string, amt int64, created time.Time) billingtest.Event {
	t.Helper()
	obj := map[string]any{"id": refundID, "object": "refund", "amount": amt, "currency": "usd", "charge": of, "status": status,
		"created": created.Unix(), "failure_reason": "lost_or_stolen_card", "metadata": map[string]string{billing.MetaKey: key}}
	body, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": billingtest.APIVersion,
		"created": created.Unix(), "type": typ, "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": obj}})
	if err != nil {
		t.Fatal(err)
	}
	return billingtest.Event{ID: id, Type: typ, ObjectID: refundID, Created: created, Body: body}
}

// Events that name a refund's or a payment's key about something else (a
// refund event naming the payment's key, even with the payment's id; a
// charge event naming the refund's key, even with the refund's id; another
// refund carrying the refund's key) move neither claim: billonce's answers
// stay Stripe's, the payment paid and the refund pending, then succeeded.
func TestRefundAndPaymentClaimsMoveOnlyByEventsAboutTheirOwnObject(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	pay := paidFor(t, h.env, "cus_e")
	payKey := h.key("cus_e")
	h.srv.SettleLater("cus_e", billingtest.Async{After: time.Hour})
	ctx := context.Background()
	r, err := h.b.Refund(ctx, "cus_e", period, "rma-e", 1000)
	wantHow(t, r, err, billing.Created)
	if !r.Processing {
		t.Fatalf("receipt %+v, want Processing", r)
	}
	now := time.Now()
	for _, ev := range []billingtest.Event{
		refundEvent(t, "evt_x1", "charge.refund.updated", "re_foreign", pay, "failed", payKey, amount, now),
		refundEvent(t, "evt_x2", "refund.failed", pay, pay, "failed", payKey, amount, now),
		chargeEvent(t, "evt_x3", "charge.failed", r.StripeID, "failed", r.Key.String(), "cus_e", now),
		chargeEvent(t, "evt_x4", "charge.succeeded", r.StripeID, "succeeded", r.Key.String(), "cus_e", now),
		refundEvent(t, "evt_x5", "charge.refund.updated", "re_foreign", pay, "failed", r.Key.String(), 1000, now),
		refundEvent(t, "evt_x6", "refund.updated", "re_foreign", pay, "succeeded", r.Key.String(), 1000, now),
	} {
		h.deliver(ev)
	}
	if c, err := h.store.Get(ctx, payKey); err != nil || c.State != claim.StateSucceeded {
		t.Fatalf("payment claim after foreign events: %+v, %v; want succeeded", c, err)
	}
	if c, err := h.store.Get(ctx, r.Key.String()); err != nil || c.State != claim.StateProcessing {
		t.Fatalf("refund claim after foreign events: %+v, %v; want processing", c, err)
	}
	again, err := h.b.Refund(ctx, "cus_e", period, "rma-e", 1000)
	wantHow(t, again, err, billing.AlreadyBilled)
	if !again.Processing {
		t.Fatalf("again: %+v, want Processing", again)
	}
	h.srv.Advance(2 * time.Hour)
	h.srv.SettleNow()
	h.deliverAll()
	done, err := h.b.Refund(ctx, "cus_e", period, "rma-e", 1000)
	wantHow(t, done, err, billing.AlreadyBilled)
	if done.Processing || refunded(h.env, pay) != 1000 || len(refundsOf(h.env, pay)) != 1 {
		t.Fatalf("after settling: %+v; Stripe holds %+v", done, refundsOf(h.env, pay))
	}
}
