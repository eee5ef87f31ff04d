package invoiceitem

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.InvoiceItemParams) (*stripe.InvoiceItem, error) { return nil, nil }

func New(p *stripe.InvoiceItemParams) (*stripe.InvoiceItem, error) { return Client{}.New(p) }
