package meterevent

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.BillingMeterEventParams) (*stripe.BillingMeterEvent, error) {
	return nil, nil
}

func New(p *stripe.BillingMeterEventParams) (*stripe.BillingMeterEvent, error) {
	return Client{}.New(p)
}
