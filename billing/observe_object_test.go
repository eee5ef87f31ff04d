package billing_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// Every event about a claim names the claim's key and the kind of write
// the claim is about, by Stripe's name of its object: the Stripe calls and the outcome of a
// charge, a payment intent, an invoice, a usage report, a refund, a credit
// note, a transfer and a payout, and the webhook deliveries and updates
// that settle them later, a refund's as "refund" and the refunded
// payment's as "charge".
func TestEveryKindsEventsNameItsObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	rec := &recorder{}
	e := newEnv(t, func(c *billing.Config) { c.Observe = rec.observe })
	e.srv.CreateMeter("api_calls", "sum", "")
	acct := e.srv.CreateAccount()
	e.srv.SetBalance("", "usd", 100_000)
	e.srv.SetBalance(acct, "usd", 100_000)

	objects := map[string]string{} // claim key -> the Object its events carry
	step := func(what, object string, do func() (billing.Receipt, error)) billing.Receipt {
		t.Helper()
		r, err := do()
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		objects[r.Key.String()] = object
		calls, outcomes := 0, 0
		for _, ev := range rec.take() {
			switch ev.Kind {
			case billing.EventStripeCall:
				calls++
			case billing.EventOutcome:
				outcomes++
			}
			if ev.Object != object || ev.Key != r.Key.String() {
				t.Errorf("%s: %v event of key %s names object %q; want %q of the claim's key %s", what, ev.Kind, ev.Key, ev.Object, object, r.Key)
			}
		}
		if calls == 0 || outcomes != 1 {
			t.Errorf("%s: %d Stripe calls and %d outcomes; want calls and one outcome", what, calls, outcomes)
		}
		return r
	}
	pay := step("charge", "charge", func() (billing.Receipt, error) { return e.b.Charge(ctx, "cus_c", period, nil) })
	step("invoice", "invoice", func() (billing.Receipt, error) { return e.b.Invoice(ctx, "cus_i", period, threeLines()) })
	step("usage report", "meter_event", func() (billing.Receipt, error) { return e.b.ReportUsage(ctx, usage("cus_u", 42)) })
	step("credit note", "credit_note", func() (billing.Receipt, error) { return e.b.Refund(ctx, "cus_i", period, "cn-1", 100) })
	step("transfer", "transfer", func() (billing.Receipt, error) { return e.b.Transfer(ctx, acct, period, usd, nil) })
	step("payout", "payout", func() (billing.Receipt, error) { return e.b.Payout(ctx, acct, period, usd, nil) })
	e.srv.SettleLater("cus_c", billingtest.Async{After: time.Hour})
	refund := step("refund", "refund", func() (billing.Receipt, error) { return e.b.Refund(ctx, "cus_c", period, "rma-1", 1000) })
	if !refund.Processing {
		t.Fatalf("refund %+v; want it processing, settled later", refund)
	}
	if got := refunded(e, pay.StripeID); got != 1000 || len(e.srv.Movements("transfer")) != 1 || len(movementsTo(e, "payout", acct)) != 1 {
		t.Fatalf("Stripe holds %d refunded, transfers %+v, payouts %+v; want one of each", got, e.srv.Movements("transfer"), movementsTo(e, "payout", acct))
	}

	// Stripe settles the refund; every event it sent is delivered.
	e.srv.Advance(2 * time.Hour)
	e.srv.SettleNow()
	handler, err := e.b.Webhook(billing.WebhookConfig{Secret: whsec})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range e.srv.Events() {
		req := httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(ev.Body))
		req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, whsec, time.Now()))
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("delivering %s %s: %d %s", ev.ID, ev.Type, w.Code, w.Body)
		}
	}
	var refundSettled, refundApplied, paymentRefunded bool
	for _, ev := range rec.take() {
		want := objects[ev.Key]
		switch {
		case ev.Kind == billing.EventWebhook && ev.Result == "ignored", ev.Kind == billing.EventWebhook && ev.Key == "":
			want = "" // no claim known
		case ev.Key == "" || want == "":
			t.Errorf("%v event %+v is about no claim billonce made", ev.Kind, ev)
			continue
		}
		if ev.Object != want {
			t.Errorf("%v event (result %q) of key %s names object %q; want %q", ev.Kind, ev.Result, ev.Key, ev.Object, want)
		}
		refundSettled = refundSettled || ev.Kind == billing.EventSettled && ev.Key == refund.Key.String() && ev.State == "succeeded"
		refundApplied = refundApplied || ev.Kind == billing.EventWebhook && ev.Key == refund.Key.String() && ev.Result == "applied"
		paymentRefunded = paymentRefunded || ev.Kind == billing.EventRefunded && ev.Key == pay.Key.String()
	}
	if !refundSettled || !refundApplied || !paymentRefunded {
		t.Errorf("refund settled %v, its delivery applied %v, its payment refunded %v; want all reported", refundSettled, refundApplied, paymentRefunded)
	}
}

// A charge made with the PaymentIntents API is a "payment_intent".
func TestPaymentIntentEventsNameTheirObject(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newEnv(t, func(c *billing.Config) { c.API, c.Observe = billing.PaymentIntents, rec.observe })
	r, err := e.b.Charge(context.Background(), "cus_p", period, nil)
	wantHow(t, r, err, billing.Created)
	got := rec.take()
	checkEvents(t, "payment intent", "cus_p", got, want{kind: billing.EventStripeCall, attempt: 1}, want{kind: billing.EventOutcome, outcome: billing.Created})
	for _, ev := range got {
		if ev.Object != "payment_intent" {
			t.Errorf("%v event names object %q; want payment_intent", ev.Kind, ev.Object)
		}
	}
	wantCount(t, e, "cus_p", 1)
}
