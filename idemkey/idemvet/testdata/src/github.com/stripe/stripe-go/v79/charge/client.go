package charge

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.ChargeParams) (*stripe.Charge, error)                { return nil, nil }
func (c Client) Get(id string, p *stripe.ChargeParams) (*stripe.Charge, error)     { return nil, nil }
func (c Client) Update(id string, p *stripe.ChargeParams) (*stripe.Charge, error)  { return nil, nil }
func (c Client) Capture(id string, p *stripe.ChargeParams) (*stripe.Charge, error) { return nil, nil }

func New(p *stripe.ChargeParams) (*stripe.Charge, error) { return Client{}.New(p) }
