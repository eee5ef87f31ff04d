package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// Other code holding the account's key makes an invoice of its own for
// the customer, copying an invoice claim's metadata, and pays it, while
// the claim's draft request (which never executed) left the claim pending
// without a draft. Past the key's window Stripe's search for the draft
// finds only that invoice. It is not the claim's: billonce's draft is
// a draft it made for the customer, and an invoice paid at another total
// is not one. Taken for the claim's, its invoice.paid settles the claim,
// and the period is reported billed while the customer was never billed
// billonce's lines: counted at the fake, a success needs billonce's own
// paid invoice.
func TestInvoiceDraftSearchIgnoresAnotherWritersInvoice(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	inv := threeLines()
	h.stopBefore(h.biller(oneAttempt), "cus_1", "draft", inv)
	key := h.invoiceClaim("cus_1").Key

	// The other code's invoice: its own item and total, billonce's metadata.
	np := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), AutoAdvance: stripe.Bool(false),
		PendingInvoiceItemsBehavior: stripe.String("exclude")}
	np.IdempotencyKey = stripe.String("other-code-invoice")
	np.Metadata = map[string]string{billing.MetaKey: key, billing.MetaCustomer: "cus_1", billing.MetaPeriod: period}
	other, err := h.invoices().New(np)
	if err != nil {
		t.Fatal(err)
	}
	h.addedByHand("cus_1", other.ID, 5000)
	fp := &stripe.InvoiceFinalizeInvoiceParams{}
	fp.IdempotencyKey = stripe.String("other-code-finalize")
	if _, err := h.invoices().FinalizeInvoice(other.ID, fp); err != nil {
		t.Fatal(err)
	}
	pp := &stripe.InvoicePayParams{}
	pp.IdempotencyKey = stripe.String("other-code-pay")
	if _, err := h.invoices().Pay(other.ID, pp); err != nil {
		t.Fatal(err)
	}

	h.advance(25 * time.Hour)
	r, err := h.biller(oneAttempt).Invoice(ctx, "cus_1", period, inv)
	for _, ev := range h.srv.Events() {
		if ev.Type == "invoice.paid" && ev.ObjectID == other.ID {
			h.deliver(ev) // Stripe's retry of it, or its first delivery
		}
	}
	r2, err2 := h.biller(oneAttempt).Invoice(ctx, "cus_1", period, inv)
	billed := 0
	for _, in := range h.srv.Invoices("cus_1") {
		if in.ID != other.ID && in.Status == "paid" && in.Metadata[billing.MetaKey] == key {
			billed++
		}
	}
	c := h.invoiceClaim("cus_1")
	if billed == 0 && (err2 == nil || c.State == claim.StateSucceeded) {
		t.Fatalf("billonce's lines were never invoiced (invoices %+v), yet the claim is %s with %s and the calls = (%+v, %v), (%+v, %v)",
			h.srv.Invoices("cus_1"), c.State, c.StripeID, r, err, r2, err2)
	}
	if billed > 1 {
		t.Fatalf("%d paid invoices of billonce's lines", billed)
	}
	if billed == 0 && !errors.Is(err2, billing.ErrNeedsReconciliation) {
		t.Errorf("with only another writer's invoice found, the call = %v, want ErrNeedsReconciliation", err2)
	}
}
