// Package helpers builds Stripe params in one package; its callers are in
// another, so what the analyzer learns here travels as facts.
package helpers

import (
	"context"

	"github.com/google/uuid"
	stripe "github.com/stripe/stripe-go/v79"
)

// ChargeParams turns key into the idempotency key.
func ChargeParams(ctx context.Context, customer, key string) *stripe.ChargeParams {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.Context = ctx
	if key != "" {
		p.IdempotencyKey = stripe.String(key)
	}
	return p
}

// NewKey returns a new value every call.
func NewKey() string { return uuid.NewString() }

// Op is one charge, its key made when it is built.
type Op struct {
	Customer string
	Key      string
}

// NewOp returns an operation with a new random key every call.
func NewOp(customer string) Op { return Op{Customer: customer, Key: uuid.NewString()} }

// NewOpFor returns an operation keyed by its identity.
func NewOpFor(customer, period string) *Op {
	return &Op{Customer: customer, Key: "charge:" + customer + ":" + period}
}

// PlainChargeParams builds params without a key.
func PlainChargeParams(customer string) *stripe.ChargeParams {
	return &stripe.ChargeParams{Customer: stripe.String(customer)}
}
