package charge

import stripe "github.com/stripe/stripe-go"

func New(p *stripe.ChargeParams) (*stripe.Charge, error) { return nil, nil }
