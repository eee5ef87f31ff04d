package usehelpers

import (
	"helpers"

	backoff "github.com/cenkalti/backoff/v4"
	stripe "github.com/stripe/stripe-go/v79"
)

// Keys made in another package and handed over in a struct.

func structInRetry(customer string) error {
	return backoff.Retry(func() error {
		op := helpers.NewOp(customer)
		p := &stripe.ChargeParams{Customer: stripe.String(op.Customer)}
		p.IdempotencyKey = stripe.String(op.Key) // want `this function literal runs once per attempt of backoff.Retry, and it is made by helpers.NewOp\(\) \(which returns uuid.NewString\(\) in Key\) inside it`
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

func structStable(customer, period string) error {
	return backoff.Retry(func() error {
		op := helpers.NewOpFor(customer, period)
		p := &stripe.ChargeParams{Customer: stripe.String(op.Customer)}
		p.IdempotencyKey = stripe.String(op.Key)
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

// Known limit: a struct filled in after it is built is not followed.
func structFilledLater(customer string) error {
	return backoff.Retry(func() error {
		var op helpers.Op
		op.Customer = customer
		op.Key = helpers.NewKey()
		p := &stripe.ChargeParams{Customer: stripe.String(op.Customer)}
		p.IdempotencyKey = stripe.String(op.Key)
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}
