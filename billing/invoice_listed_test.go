package billing_test

import (
	"context"
	"fmt"
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
	p.Metadata = map[string]string{billing.MetaKey: key}
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	items := &invoiceitem.Client{B: ic.B, Key: ic.Key}
	if _, err := items.New(&stripe.InvoiceItemParams{Customer: stripe.String("cus_1"), Invoice: stripe.String(other.ID), Amount: stripe.Int64(1290), Currency: stripe.String("usd")}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.FinalizeInvoice(other.ID, &stripe.InvoiceFinalizeInvoiceParams{}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.VoidInvoice(other.ID, &stripe.InvoiceVoidInvoiceParams{}); err != nil {
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

// A customer with more invoices than one page of the list (other invoices
// made since billonce's, killed after its finalization) is listed to its
// end: the resume finds billonce's invoice and pays it, once.
func TestInvoiceKilledIsFoundPastTheFirstPageOfTheCustomersInvoices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.killedAt("finalize", inv)
	ic := e.invoices()
	for i := 0; i < 130; i++ {
		p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd")}
		p.Metadata = map[string]string{"n": fmt.Sprint(i)}
		if _, err := ic.New(p); err != nil {
			t.Fatal(err)
		}
	}
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if err != nil {
		t.Fatal(err)
	}
	var own int
	for _, in := range e.srv.Invoices("cus_1") {
		if in.Metadata[billing.MetaKey] != "" {
			own++
			if in.ID != r.StripeID || in.Payments != 1 || in.Finalizations != 1 {
				t.Fatalf("invoice %+v, receipt %+v", in, r)
			}
		}
	}
	if own != 1 {
		t.Fatalf("%d invoices carry the key, want 1", own)
	}
}
