// Package stripe stubs stripe-go v82's root package and its stripe.Client.
package stripe

import "context"

type Params struct {
	Context        context.Context
	IdempotencyKey *string
}

func (p *Params) SetIdempotencyKey(s string) { p.IdempotencyKey = &s }

type ChargeCreateParams struct {
	Params   `form:"*"`
	Amount   *int64
	Customer *string
}

type CustomerCreateParams struct {
	Params `form:"*"`
	Email  *string
}

type TestHelpersRefundExpireParams struct {
	Params `form:"*"`
}

type InvoiceFinalizeInvoiceParams struct {
	Params `form:"*"`
}

type BillingMeterEventAdjustmentCreateParams struct {
	Params    `form:"*"`
	EventName *string
}

type Charge struct{ ID string }
type Customer struct{ ID string }
type Refund struct{ ID string }
type Invoice struct{ ID string }
type BillingMeterEventAdjustment struct{ ID string }

type v1ChargeService struct{}

func (c v1ChargeService) Create(ctx context.Context, p *ChargeCreateParams) (*Charge, error) {
	return nil, nil
}
func (c v1ChargeService) Retrieve(ctx context.Context, id string, p *ChargeCreateParams) (*Charge, error) {
	return nil, nil
}

type v1CustomerService struct{}

func (c v1CustomerService) Create(ctx context.Context, p *CustomerCreateParams) (*Customer, error) {
	return nil, nil
}

type v1TestHelpersRefundService struct{}

func (c v1TestHelpersRefundService) Expire(ctx context.Context, id string, p *TestHelpersRefundExpireParams) (*Refund, error) {
	return nil, nil
}

type v1InvoiceService struct{}

func (c v1InvoiceService) FinalizeInvoice(ctx context.Context, id string, p *InvoiceFinalizeInvoiceParams) (*Invoice, error) {
	return nil, nil
}

type v1BillingMeterEventAdjustmentService struct{}

func (c v1BillingMeterEventAdjustmentService) Create(ctx context.Context, p *BillingMeterEventAdjustmentCreateParams) (*BillingMeterEventAdjustment, error) {
	return nil, nil
}

type Client struct {
	V1Charges                      *v1ChargeService
	V1Customers                    *v1CustomerService
	V1TestHelpersRefunds           *v1TestHelpersRefundService
	V1Invoices                     *v1InvoiceService
	V1BillingMeterEventAdjustments *v1BillingMeterEventAdjustmentService
}

func NewClient(key string) *Client { return &Client{} }

func String(s string) *string { return &s }
func Int64(n int64) *int64    { return &n }
