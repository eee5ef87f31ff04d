package invoice

import stripe "github.com/stripe/stripe-go/v79"

type Client struct{ Key string }

func (c Client) New(p *stripe.InvoiceParams) (*stripe.Invoice, error)               { return nil, nil }
func (c Client) Get(id string, p *stripe.InvoiceParams) (*stripe.Invoice, error)    { return nil, nil }
func (c Client) Update(id string, p *stripe.InvoiceParams) (*stripe.Invoice, error) { return nil, nil }
func (c Client) AddLines(id string, p *stripe.InvoiceAddLinesParams) (*stripe.Invoice, error) {
	return nil, nil
}
func (c Client) FinalizeInvoice(id string, p *stripe.InvoiceFinalizeInvoiceParams) (*stripe.Invoice, error) {
	return nil, nil
}
func (c Client) Pay(id string, p *stripe.InvoicePayParams) (*stripe.Invoice, error) { return nil, nil }
func (c Client) SendInvoice(id string, p *stripe.InvoiceSendInvoiceParams) (*stripe.Invoice, error) {
	return nil, nil
}
func (c Client) VoidInvoice(id string, p *stripe.InvoiceVoidInvoiceParams) (*stripe.Invoice, error) {
	return nil, nil
}

func New(p *stripe.InvoiceParams) (*stripe.Invoice, error) { return Client{}.New(p) }
func FinalizeInvoice(id string, p *stripe.InvoiceFinalizeInvoiceParams) (*stripe.Invoice, error) {
	return Client{}.FinalizeInvoice(id, p)
}
