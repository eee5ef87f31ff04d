package paymentintent

import stripe "github.com/stripe/stripe-go/v79"

func New(p *stripe.PaymentIntentParams) (*stripe.PaymentIntent, error) { return nil, nil }
func Confirm(id string, p *stripe.PaymentIntentConfirmParams) (*stripe.PaymentIntent, error) {
	return nil, nil
}
func Get(id string, p *stripe.PaymentIntentParams) (*stripe.PaymentIntent, error) { return nil, nil }
