package billing_test

import (
	"context"
	"testing"
	"time"
)

// An invoice whose claim row was lost (a claim table restored from an
// older copy, a row deleted by hand), billed again once Stripe has
// forgotten its keys, is found by listing the customer's invoices before
// the draft is sent, as a refund or a transfer is: the customer has one
// invoice, paid once, counted at the fake.
func TestInvoiceWhoseClaimRowWasLostIsNotMadeAgainPastTheKeyWindow(t *testing.T) {
	t.Skip("known: a claim just won sends its draft without listing the customer's invoices, so an invoice whose claim row was lost is made and paid again once Stripe has forgotten its keys")
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	ctx := context.Background()
	if _, err := e.b.Invoice(ctx, "cus_1", period, inv); err != nil {
		t.Fatal(err)
	}
	e.wantOneInvoice("cus_1", inv, "paid", 1)
	e.exec("DELETE FROM billonce_claims WHERE key = $1", e.invoiceClaim("cus_1").Key)
	e.advance(25 * time.Hour)
	r, err := e.biller(oneAttempt).Invoice(ctx, "cus_1", period, inv)
	if all := e.srv.Invoices("cus_1"); len(all) != 1 {
		t.Fatalf("after the claim row was lost, Invoice made another invoice: %d invoices %+v (receipt %+v, err %v)", len(all), all, r, err)
	}
	e.wantOneInvoice("cus_1", inv, "paid", 1)
	if err != nil {
		t.Fatal(err)
	}
}
