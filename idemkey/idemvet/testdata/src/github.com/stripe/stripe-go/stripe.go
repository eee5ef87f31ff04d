// Package stripe stubs stripe-go before modules (+incompatible, no /vN).
package stripe

type Params struct{ IdempotencyKey *string }

func (p *Params) SetIdempotencyKey(s string) { p.IdempotencyKey = &s }

type ChargeParams struct {
	Params   `form:"*"`
	Customer *string
}

type Charge struct{ ID string }

func String(s string) *string { return &s }
