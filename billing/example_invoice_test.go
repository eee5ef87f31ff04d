package billing_test

import (
	"context"
	"fmt"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A customer is billed for September by one invoice of two lines. The
// second call, as a retry or another replica would make it, finds the
// invoice billed and makes nothing more: the fake Stripe holds one
// invoice, finalized once and paid once.
func ExampleBiller_Invoice() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,
		Claims:    claim.NewMemory(claim.Config{}), // claim.NewPostgres in production
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	inv := &billing.Invoice{Currency: "eur", Description: "September 2026", Lines: []billing.InvoiceLine{
		{Description: "Team plan", Amount: 4900},
		{Description: "3 extra seats", Amount: 2700},
	}}
	for range 2 {
		r, err := biller.Invoice(ctx, "cus_123", "2026-09", inv)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println(r.Outcome, r.Amount, r.Currency)
	}
	for _, in := range srv.Invoices("cus_123") {
		fmt.Printf("%s: %d lines, finalized %d, paid %d\n", in.Status, len(in.Lines), in.Finalizations, in.Payments)
	}
	// Output:
	// created 7600 eur
	// already billed 7600 eur
	// paid: 2 lines, finalized 1, paid 1
}
