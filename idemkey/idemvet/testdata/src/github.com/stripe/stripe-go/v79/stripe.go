// Package stripe is a stub of stripe-go's root package for the analyzer's tests.
package stripe

import "context"

type Params struct {
	Context        context.Context
	IdempotencyKey *string
	Metadata       map[string]string
}

func (p *Params) SetIdempotencyKey(s string) { p.IdempotencyKey = &s }
func (p *Params) AddMetadata(k, v string)    {}

type ChargeParams struct {
	Params      `form:"*"`
	Amount      *int64
	Description *string
	Currency    *string
	Customer    *string
}

type PaymentIntentParams struct {
	Params   `form:"*"`
	Amount   *int64
	Customer *string
}

type PaymentIntentConfirmParams struct {
	Params `form:"*"`
}

type Charge struct{ ID string }
type PaymentIntent struct{ ID string }

func String(s string) *string { return &s }
func Int64(n int64) *int64    { return &n }

type Error struct{ HTTPStatusCode int }

func (e *Error) Error() string { return "stripe" }

type InvoiceParams struct {
	Params   `form:"*"`
	Customer *string
}

type InvoiceAddLinesParams struct {
	Params `form:"*"`
}

type InvoiceFinalizeInvoiceParams struct {
	Params `form:"*"`
}

type InvoicePayParams struct {
	Params `form:"*"`
}

type InvoiceSendInvoiceParams struct {
	Params `form:"*"`
}

type InvoiceVoidInvoiceParams struct {
	Params `form:"*"`
}

type InvoiceItemParams struct {
	Params   `form:"*"`
	Customer *string
	Invoice  *string
	Amount   *int64
}

type BillingMeterEventParams struct {
	Params     `form:"*"`
	EventName  *string
	Identifier *string
	Payload    map[string]string
}

type BillingMeterEventAdjustmentParams struct {
	Params    `form:"*"`
	EventName *string
}

type Invoice struct{ ID string }
type InvoiceItem struct{ ID string }
type BillingMeterEvent struct{ Identifier string }
type BillingMeterEventAdjustment struct{ ID string }

type RefundParams struct {
	Params `form:"*"`
	Amount *int64
	Charge *string
}

type CreditNoteParams struct {
	Params  `form:"*"`
	Invoice *string
	Amount  *int64
}

type TransferParams struct {
	Params      `form:"*"`
	Amount      *int64
	Destination *string
}

type PayoutParams struct {
	Params `form:"*"`
	Amount *int64
}

type Refund struct{ ID string }
type CreditNote struct{ ID string }
type Transfer struct{ ID string }
type Payout struct{ ID string }
