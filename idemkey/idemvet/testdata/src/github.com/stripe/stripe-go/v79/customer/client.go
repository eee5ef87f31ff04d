package customer

import stripe "github.com/stripe/stripe-go/v79"

type CustomerParams struct {
	stripe.Params `form:"*"`
	Email         *string
}

func New(p *CustomerParams) (*stripe.Charge, error) { return nil, nil }
