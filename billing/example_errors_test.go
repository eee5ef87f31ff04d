package billing_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Every error of a charge is a *billing.ChargeError. errors.Is tells its
// kind; the fields say which charge, and what Stripe said.
func ExampleChargeError() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{Declines: map[string]string{"cus_2": "insufficient_funds"}})
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

	for _, customer := range []string{"cus 1", "cus_2"} {
		_, err := biller.Charge(ctx, customer, "2026-09", nil)
		var ce *billing.ChargeError
		errors.As(err, &ce)
		switch {
		case errors.Is(err, billing.ErrInvalid):
			fmt.Printf("%q: invalid input, nothing sent\n", ce.Customer)
		case errors.Is(err, billing.ErrDeclined):
			fmt.Printf("%s: declined (%s); re-bill deliberately as attempt %d\n", ce.Customer, ce.DeclineCode, ce.Attempt+1)
			var se *stripe.Error // Stripe's own answer, for its request id, param and doc URL
			if errors.As(err, &se) {
				fmt.Printf("Stripe answered %d %s in request %s\n", se.HTTPStatusCode, se.Code, ce.RequestID)
			}
			srv.Honor(customer) // the customer has a new card
			r, err := biller.Rebill(ctx, customer, "2026-09", ce.Attempt+1, nil)
			fmt.Println("rebill:", r.Outcome, r.Attempt, err)
		}
	}
	// Output:
	// "cus 1": invalid input, nothing sent
	// cus_2: declined (insufficient_funds); re-bill deliberately as attempt 2
	// Stripe answered 402 card_declined in request req_00000000000001
	// rebill: created 2 <nil>
}

// A service builds its Biller once, at start-up, and makes it the default;
// the rest of the code calls billing.Charge.
func ExampleSetDefault() {
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
	billing.SetDefault(biller)
	defer billing.SetDefault(nil)

	// Anywhere in the service:
	r, err := billing.Charge(context.Background(), "cus_123", "2026-09")
	fmt.Println(r.Outcome, r.Amount, err)
	// Output: created 2500 <nil>
}
