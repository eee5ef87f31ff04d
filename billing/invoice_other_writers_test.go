package billing_test

import (
	"context"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// A void invoice that other code holding the key made for the customer,
// carrying the claim's billonce_key metadata, is no proof that the claim's
// own invoice was voided: the claim's draft was never made (the draft's
// request was refused before Stripe ran it). The resume bills the period
// with an invoice of its own, or leaves the claim for a person; it never
// fails the claim on another writer's void invoice, which skips the period.
func TestInvoiceResumeDoesNotFailOnAnotherWritersVoidInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	if n := len(e.srv.Invoices("cus_1")); n != 0 {
		t.Fatalf("%d invoices after the refused draft, want 0", n)
	}
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	items := &invoiceitem.Client{B: ic.B, Key: ic.Key}
	if _, err := items.New(&stripe.InvoiceItemParams{Customer: stripe.String("cus_1"), Invoice: stripe.String(other.ID), Amount: stripe.Int64(1290), Currency: stripe.String("usd"), Params: stripe.Params{IdempotencyKey: stripe.String("other-item-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.FinalizeInvoice(other.ID, &stripe.InvoiceFinalizeInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-finalize-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.VoidInvoice(other.ID, &stripe.InvoiceVoidInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-void-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	_, err = e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	c := e.invoiceClaim("cus_1")
	if c.State == claim.StateFailed {
		t.Fatalf("claim failed (%v) on invoice %s, which the claim never made; the period is skipped", err, c.StripeID)
	}
	var paid int
	for _, in := range e.srv.Invoices("cus_1") {
		paid += in.Payments
	}
	if err == nil && paid != 1 {
		t.Fatalf("success reported, %d payments at the fake", paid)
	}
}

// An invoice other code holding the key made and had paid for the
// customer, carrying the claim's billonce_key metadata and even the
// claim's total, but none of its lines, is not the claim's: billonce's
// draft was never made (its request was refused before Stripe ran it).
// The resume does not report the period paid on it.
func TestInvoiceResumeDoesNotTakeAnotherWritersPaidInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	items := &invoiceitem.Client{B: ic.B, Key: ic.Key}
	if _, err := items.New(&stripe.InvoiceItemParams{Customer: stripe.String("cus_1"), Invoice: stripe.String(other.ID), Amount: stripe.Int64(1290), Currency: stripe.String("usd"), Description: stripe.String("Another product"), Params: stripe.Params{IdempotencyKey: stripe.String("other-item-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.FinalizeInvoice(other.ID, &stripe.InvoiceFinalizeInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-finalize-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.Pay(other.ID, &stripe.InvoicePayParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-pay-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if err == nil && r.StripeID == other.ID {
		t.Fatalf("receipt %+v: the period reported paid by invoice %s, which carries none of the claim's lines", r, other.ID)
	}
	var ownPaid int
	for _, in := range e.srv.Invoices("cus_1") {
		if in.ID != other.ID {
			ownPaid += in.Payments
		}
	}
	if err == nil && ownPaid != 1 {
		t.Fatalf("success reported with %d payments of the claim's own invoice", ownPaid)
	}
}

// A draft that other code holding the key made for the customer in the
// invoice's currency, carrying the claim's billonce_key metadata but no
// line, and deleted, is no proof that the claim's own draft was deleted:
// billonce's draft was never made (its request was stopped before it was
// sent). The resume bills the period with an invoice of its own, or
// leaves the claim for a person; it does not fail the claim.
func TestInvoiceResumeDoesNotFailOnAnotherWritersDeletedDraft(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ic.Del(other.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if c := e.invoiceClaim("cus_1"); c.State == claim.StateFailed {
		t.Fatalf("claim failed on another writer's deleted draft %s, though billonce made no invoice (%d at the fake): err %v", other.ID, len(e.srv.Invoices("cus_1")), err)
	}
}
