package usehelpers

import (
	"context"
	"helpers"

	backoff "github.com/cenkalti/backoff/v4"
	"github.com/stripe/stripe-go/v79/charge"
)

var charges charge.Client

func retried(ctx context.Context, customer string) error {
	return backoff.Retry(func() error {
		_, err := charges.New(helpers.ChargeParams(ctx, customer, helpers.NewKey())) // want `this function literal runs once per attempt of backoff.Retry, and it is made by helpers.NewKey\(\) \(which returns uuid.NewString\(\)\) inside it`
		return err
	}, backoff.NewExponentialBackOff())
}

func shared(ctx context.Context, customers []string) {
	key := helpers.NewKey()
	for _, c := range customers {
		charges.New(helpers.ChargeParams(ctx, c, key)) // want `the same idempotency key key is sent for every element of the range loop`
	}
}

func fine(ctx context.Context, customer, period string) {
	charges.New(helpers.ChargeParams(ctx, customer, "charge:"+customer+":"+period))
}

func keylessFromHelper(customer string) {
	charges.New(helpers.PlainChargeParams(customer)) // want `charges.New sends a Stripe write without an idempotency key`
}

func keyedAfterHelper(customer, period string) {
	p := helpers.PlainChargeParams(customer)
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	charges.New(p)
}
