package payout

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.PayoutParams) (*stripe.Payout, error)            { return nil, nil }
func (c Client) Get(id string, p *stripe.PayoutParams) (*stripe.Payout, error) { return nil, nil }

func New(p *stripe.PayoutParams) (*stripe.Payout, error) { return Client{}.New(p) }
