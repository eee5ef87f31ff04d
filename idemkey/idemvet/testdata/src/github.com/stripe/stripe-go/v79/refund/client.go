package refund

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.RefundParams) (*stripe.Refund, error)            { return nil, nil }
func (c Client) Get(id string, p *stripe.RefundParams) (*stripe.Refund, error) { return nil, nil }

func New(p *stripe.RefundParams) (*stripe.Refund, error) { return Client{}.New(p) }
