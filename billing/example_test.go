package billing_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Charge a customer while Stripe's answer is lost on the way back: the retry
// carries the same key, Stripe replays the charge it made, and a second call
// finds it recorded. The fake Stripe counts one charge.
func Example() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()

	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,                         // omit in production
		Claims:    claim.NewMemory(claim.Config{}), // claim.NewPostgres in production
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// Stripe commits the charge, then the connection drops.
	srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := biller.Charge(ctx, "cus_1", "2026-09", nil)
	fmt.Println(r.Outcome, r.Amount, r.Currency, err)

	r, err = biller.Charge(ctx, "cus_1", "2026-09", nil)
	fmt.Println(r.Outcome, err)
	fmt.Println("charges at Stripe:", srv.CountPeriod("cus_1", "2026-09"))
	// Output:
	// replayed 2500 usd <nil>
	// already billed <nil>
	// charges at Stripe: 1
}

// Bill a whole period. A declined card is counted and recorded, not retried;
// running again charges nobody twice.
func ExampleBiller_Run() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{Declines: map[string]string{"cus_3": "insufficient_funds"}})
	defer srv.Close()
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,
		Claims:    claim.NewMemory(claim.Config{}),
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 900, Currency: "eur"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	customers := billing.Customers("cus_1", "cus_2", "cus_3", "cus_4")

	sum, err := biller.Run(ctx, "2026-09", customers, nil)
	fmt.Printf("created %d, declined %d, complete %v, err %v\n", sum.Created, sum.Declined, sum.Complete(), err)
	var ce *billing.ChargeError
	if errors.Is(sum.Failures[0], billing.ErrDeclined) && errors.As(sum.Failures[0], &ce) {
		fmt.Println(ce.Customer, ce.DeclineCode)
	}

	sum, _ = biller.Run(ctx, "2026-09", customers, nil)
	fmt.Printf("rerun: created %d, already billed %d\n", sum.Created, sum.AlreadyBilled)
	fmt.Println("charges at Stripe:", srv.Stats().Paid)
	// Output:
	// created 3, declined 1, complete false, err <nil>
	// cus_3 insufficient_funds
	// rerun: created 0, already billed 3
	// charges at Stripe: 3
}

// Classify tells, from a stripe-go error, whether a call may be retried with
// the same idempotency key.
func ExampleClassify() {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	charges := charge.Client{B: backend, Key: "sk_test_example"}
	newCharge := func(key string, amount int64) error {
		p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
		p.SetIdempotencyKey(key)
		_, err := charges.New(p)
		return err
	}

	srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	fmt.Println("429 lock_timeout:", billing.Classify(newCharge("key-1", 500)))
	srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: billingtest.FaultInFlight})
	fmt.Println("409 in flight:", billing.Classify(newCharge("key-1", 500)))
	_ = newCharge("key-1", 500)
	fmt.Println("same key, other amount:", billing.Classify(newCharge("key-1", 700)))
	srv.Decline("cus_1", "")
	fmt.Println("declined:", billing.Classify(newCharge("key-2", 500)))
	// Output:
	// 429 lock_timeout: again
	// 409 in flight: after 1s
	// same key, other amount: stop
	// declined: stop
}
