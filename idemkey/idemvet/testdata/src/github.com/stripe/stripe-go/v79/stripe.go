// Package stripe is a stub of stripe-go's root package for the analyzer's tests.
package stripe

import "context"

type Params struct {
	Context        context.Context
	IdempotencyKey *string
	Metadata       map[string]string
}

func (p *Params) SetIdempotencyKey(s string) { p.IdempotencyKey = &s }
func (p *Params) AddMetadata(k, v string)    {}

type ChargeParams struct {
	Params      `form:"*"`
	Amount      *int64
	Description *string
	Currency    *string
	Customer    *string
}

type PaymentIntentParams struct {
	Params   `form:"*"`
	Amount   *int64
	Customer *string
}

type PaymentIntentConfirmParams struct {
	Params `form:"*"`
}

type Charge struct{ ID string }
type PaymentIntent struct{ ID string }

func String(s string) *string { return &s }
func Int64(n int64) *int64    { return &n }

type Error struct{ HTTPStatusCode int }

func (e *Error) Error() string { return "stripe" }
