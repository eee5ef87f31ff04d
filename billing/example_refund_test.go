package billing_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Refund part of a payment twice, under two ids: an operator's second
// click on the first refund, with its answer lost, is the same refund, and
// a refund of more than is left is refused before anything is sent.
func ExampleBiller_Refund() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,
		Claims:    claim.NewMemory(claim.Config{}),
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := biller.Charge(ctx, "cus_1", "2026-09", nil); err != nil {
		fmt.Println(err)
		return
	}

	// Stripe refunds, then the connection drops; the retry is replayed.
	srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/refunds"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := biller.Refund(ctx, "cus_1", "2026-09", "rma-1001", 1000)
	fmt.Println(r.Outcome, r.Amount, r.Currency, err)
	r, err = biller.Refund(ctx, "cus_1", "2026-09", "rma-1001", 1000) // the second click
	fmt.Println(r.Outcome, err)
	r, err = biller.Refund(ctx, "cus_1", "2026-09", "rma-1002", 1000) // another refund, the same amount
	fmt.Println(r.Outcome, err)

	_, err = biller.Refund(ctx, "cus_1", "2026-09", "rma-1003", 1000)
	fmt.Println(errors.Is(err, billing.ErrInvalid))
	fmt.Println("refunds at Stripe:", len(srv.Movements("refund")))
	// Output:
	// replayed 1000 usd <nil>
	// already billed <nil>
	// created <nil>
	// true
	// refunds at Stripe: 2
}
