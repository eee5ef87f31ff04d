package nokey

import (
	"context"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	oldstripe "github.com/stripe/stripe-go"
	oldcharge "github.com/stripe/stripe-go/charge"

	stripe82 "github.com/stripe/stripe-go/v82"
)

// Writes through stripe-go's client types and older and newer import paths.

// ---- reported ----

func clientAPI(customer string) error {
	sc := client.New("sk_test", nil)
	_, err := sc.Charges.New(&stripe.ChargeParams{Customer: stripe.String(customer)}) // want `sc.Charges.New sends a Stripe write without an idempotency key`
	return err
}

// stripe-go before modules: github.com/stripe/stripe-go v70+incompatible.
func unversioned(customer string) error {
	_, err := oldcharge.New(&oldstripe.ChargeParams{Customer: oldstripe.String(customer)}) // want `oldcharge.New sends a Stripe write without an idempotency key`
	return err
}

// stripe-go v82's stripe.Client.
func v82Client(ctx context.Context, sc *stripe82.Client, customer string) error {
	_, err := sc.V1Charges.Create(ctx, &stripe82.ChargeCreateParams{Customer: stripe82.String(customer)}) // want `sc.V1Charges.Create sends a Stripe write without an idempotency key: .* makes a second charge object`
	return err
}

// Params declared without a literal.
func declared(customer string) error {
	var p stripe.ChargeParams
	p.Customer = stripe.String(customer)
	_, err := charges.New(&p) // want `charges.New sends a Stripe write without an idempotency key`
	return err
}

func allocated(customer string) error {
	p := new(stripe.ChargeParams)
	p.Customer = stripe.String(customer)
	_, err := charges.New(p) // want `charges.New sends a Stripe write without an idempotency key`
	return err
}

// ---- not reported ----

func clientAPIKeyed(customer, period string) error {
	sc := client.New("sk_test", nil)
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	_, err := sc.Charges.New(p)
	return err
}

func v82Keyed(ctx context.Context, sc *stripe82.Client, customer, period string) error {
	p := &stripe82.ChargeCreateParams{Customer: stripe82.String(customer)}
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	_, err := sc.V1Charges.Create(ctx, p)
	return err
}

// v82 reads, resources that bill nothing and test helpers.
func v82Others(ctx context.Context, sc *stripe82.Client, email string) {
	sc.V1Charges.Retrieve(ctx, "ch_1", nil)
	sc.V1Customers.Create(ctx, &stripe82.CustomerCreateParams{Email: stripe82.String(email)})
	sc.V1TestHelpersRefunds.Expire(ctx, "re_1", nil)
}

// The write is in a closure that runs after the key is set.
func keyedBeforeClosureRuns(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	send := func() error {
		_, err := charges.New(p)
		return err
	}
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	return send()
}

func declaredKeyed(customer, period string) error {
	var p stripe.ChargeParams
	p.Customer = stripe.String(customer)
	p.IdempotencyKey = stripe.String("charge:" + customer + ":" + period)
	_, err := charges.New(&p)
	return err
}
