package transfer

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.TransferParams) (*stripe.Transfer, error)            { return nil, nil }
func (c Client) Get(id string, p *stripe.TransferParams) (*stripe.Transfer, error) { return nil, nil }

func New(p *stripe.TransferParams) (*stripe.Transfer, error) { return Client{}.New(p) }
