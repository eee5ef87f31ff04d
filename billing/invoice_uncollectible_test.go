package billing_test

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// markedUncollectible is the invoice.marked_uncollectible event Stripe
// sends once its retries of ev's invoice have failed (the fake does not
// model the status): ev's invoice, now uncollectible, signed as Stripe
// would.
func markedUncollectible(t *testing.T, ev billingtest.Event) billingtest.Event {
	t.Helper()
	var body map[string]any
	if err := json.Unmarshal(ev.Body, &body); err != nil {
		t.Fatal(err)
	}
	body["id"], body["type"] = ev.ID+"_uncollectible", "invoice.marked_uncollectible"
	body["data"].(map[string]any)["object"].(map[string]any)["status"] = "uncollectible"
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	return billingtest.Event{ID: ev.ID + "_uncollectible", Type: "invoice.marked_uncollectible", ObjectID: ev.ObjectID, Created: ev.Created, Body: b}
}

// An invoice marked uncollectible (Stripe does it when its retries fail,
// if the account says so) can still be paid: the customer pays it from
// the hosted invoice page, or Stripe is told to retry it. It still bills
// the period, and the period stays held by its claim: a charge of the
// period is refused until a person voids the invoice. A claim failed by
// the event frees the period, and the next charge bills the customer a
// second time once the invoice is paid.
func TestUncollectibleInvoiceKeepsThePeriod(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	h.srv.Decline("cus_1", "insufficient_funds")
	r, err := h.b.Invoice(ctx, "cus_1", period, threeLines())
	if err != nil || !r.Processing {
		t.Fatalf("declined invoice = %+v, %v; want a processing receipt", r, err)
	}
	var failed billingtest.Event
	for _, ev := range h.srv.Events() {
		if ev.Type == "invoice.payment_failed" && ev.ObjectID == r.StripeID {
			failed = ev
		}
	}
	if failed.ID == "" {
		t.Fatal("no invoice.payment_failed event")
	}
	h.deliver(markedUncollectible(t, failed))
	if c := h.invoiceClaim("cus_1"); c.State == claim.StateFailed {
		t.Errorf("claim after invoice.marked_uncollectible = %s (%s), want it to hold the period", c.State, c.LastError)
	}
	h.srv.Honor("cus_1")
	_, _ = h.b.Charge(ctx, "cus_1", period, nil) // the next run, or a person re-billing a failed period
	pp := &stripe.InvoicePayParams{}
	pp.IdempotencyKey = stripe.String("hosted-page-" + r.StripeID)
	if _, err := h.invoices().Pay(r.StripeID, pp); err != nil { // the customer pays the invoice
		t.Fatal(err)
	}
	billed := h.count("cus_1")
	for _, in := range h.srv.Invoices("cus_1") {
		if in.Status == "paid" {
			billed++
		}
	}
	if billed != 1 {
		t.Errorf("customer billed %d times for the period (%d charges, invoice paid), want once", billed, h.count("cus_1"))
	}
}
