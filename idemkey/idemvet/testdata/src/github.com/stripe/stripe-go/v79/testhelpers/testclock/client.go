package testclock

import stripe "github.com/stripe/stripe-go/v79"

type TestClockParams struct {
	stripe.Params `form:"*"`
}

func New(p *TestClockParams) (*stripe.Charge, error) { return nil, nil }
