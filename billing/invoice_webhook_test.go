package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoiceitem"

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

// An invoice event moves invoice claims only. An invoice whose metadata
// names a charge's key (anyone with the account's API key can make one,
// and keys are in every charge's metadata) must not settle the charge's
// pending claim: paid, it would record a charge that never reached Stripe
// as billed; voided, it would fail one that went through, and the re-bill
// a failed claim invites would charge the customer twice.
func TestInvoiceEventNamingAChargeLeavesIt(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	b := h.biller(oneAttempt)
	// cus_1's charge went through with its answer lost; cus_2's never
	// reached Stripe. Both claims are pending with an unknown outcome.
	h.lostAnswer(b, "cus_1")
	h.srv.FailNext(billingtest.Match{Customer: "cus_2"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := b.Charge(ctx, "cus_2", period, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("charge with a 5xx = %v, want ErrOutcomeUnknown", err)
	}
	forge := func(customer string, void bool) {
		t.Helper()
		p := &stripe.InvoiceParams{Customer: stripe.String(customer), AutoAdvance: stripe.Bool(false)}
		p.IdempotencyKey = stripe.String("forged-" + customer)
		p.AddMetadata(billing.MetaKey, h.key(customer))
		in, err := h.invoices().New(p)
		if err != nil {
			t.Fatal(err)
		}
		if void {
			ip := &stripe.InvoiceItemParams{Customer: stripe.String(customer), Invoice: stripe.String(in.ID), Amount: stripe.Int64(1), Currency: stripe.String("usd")}
			ip.IdempotencyKey = stripe.String("forged-item-" + customer)
			if _, err := (&invoiceitem.Client{B: h.invoices().B, Key: secretKey}).New(ip); err != nil {
				t.Fatal(err)
			}
		}
		fp := &stripe.InvoiceFinalizeInvoiceParams{}
		fp.IdempotencyKey = stripe.String("forged-finalize-" + customer)
		if _, err := h.invoices().FinalizeInvoice(in.ID, fp); err != nil { // empty: paid at once
			t.Fatal(err)
		}
		if void {
			vp := &stripe.InvoiceVoidInvoiceParams{}
			vp.IdempotencyKey = stripe.String("forged-void-" + customer)
			if _, err := h.invoices().VoidInvoice(in.ID, vp); err != nil {
				t.Fatal(err)
			}
		}
		for _, ev := range h.eventsOf(in.ID) {
			h.deliver(ev)
		}
	}
	forge("cus_1", true)
	forge("cus_2", false)
	for _, customer := range []string{"cus_1", "cus_2"} {
		if c := h.claimOf(customer); c.State != claim.StatePending {
			t.Errorf("%s: charge claim after invoice events naming its key = %s (%s), want it left pending", customer, c.State, c.LastError)
		}
	}
	for _, customer := range []string{"cus_1", "cus_2"} {
		// The next run, and the dunning process re-billing a declined period.
		if _, err := h.b.Charge(ctx, customer, period, nil); errors.Is(err, billing.ErrDeclined) {
			_, _ = h.b.Rebill(ctx, customer, period, 2, nil)
		}
		if _, err := h.b.Reconcile(ctx, nil); err != nil {
			t.Error(err)
		}
		if n := h.count(customer); n != 1 {
			t.Errorf("%s: %d charges for the period, want 1", customer, n)
		}
	}
}
