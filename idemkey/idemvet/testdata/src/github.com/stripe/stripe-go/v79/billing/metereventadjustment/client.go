package metereventadjustment

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.BillingMeterEventAdjustmentParams) (*stripe.BillingMeterEventAdjustment, error) {
	return nil, nil
}

func New(p *stripe.BillingMeterEventAdjustmentParams) (*stripe.BillingMeterEventAdjustment, error) {
	return Client{}.New(p)
}
