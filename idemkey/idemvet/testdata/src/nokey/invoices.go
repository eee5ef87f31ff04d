package nokey

import (
	"context"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"github.com/stripe/stripe-go/v79/billing/metereventadjustment"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	stripe82 "github.com/stripe/stripe-go/v82"
)

// Every step of an invoice, and every meter event write: a step retried
// with a new key makes a second draft, a duplicated line, or usage counted
// twice.

var invoices invoice.Client

// ---- reported ----

func invoiceSteps(customer, id string) {
	invoices.New(&stripe.InvoiceParams{Customer: stripe.String(customer)}) // want `invoices.New sends a Stripe write without an idempotency key: .* makes a second invoice object`
	invoices.AddLines(id, &stripe.InvoiceAddLinesParams{})                 // want `invoices.AddLines sends a Stripe write without an idempotency key`
	invoices.FinalizeInvoice(id, &stripe.InvoiceFinalizeInvoiceParams{})   // want `invoices.FinalizeInvoice sends a Stripe write without an idempotency key`
	invoices.Pay(id, nil)                                                  // want `invoices.Pay sends a Stripe write without an idempotency key`
	invoices.SendInvoice(id, &stripe.InvoiceSendInvoiceParams{})           // want `invoices.SendInvoice sends a Stripe write without an idempotency key`
	invoices.VoidInvoice(id, &stripe.InvoiceVoidInvoiceParams{})           // want `invoices.VoidInvoice sends a Stripe write without an idempotency key`
	invoice.New(&stripe.InvoiceParams{Customer: stripe.String(customer)})  // want `invoice.New sends a Stripe write`
	invoice.FinalizeInvoice(id, nil)                                       // want `invoice.FinalizeInvoice sends a Stripe write`
}

func invoiceLine(customer, id string) error {
	p := &stripe.InvoiceItemParams{Customer: stripe.String(customer), Invoice: stripe.String(id)}
	p.Amount = stripe.Int64(100)
	_, err := invoiceitem.New(p) // want `invoiceitem.New sends a Stripe write without an idempotency key: .* makes a second invoiceitem object`
	return err
}

func meterEvent(customer string) error {
	_, err := meterevent.New(&stripe.BillingMeterEventParams{ // want `meterevent.New sends a Stripe write without an idempotency key: .* makes a second meterevent object`
		EventName: stripe.String("api_calls"), Identifier: stripe.String(customer + ":2026-09-01T10:00"),
		Payload: map[string]string{"stripe_customer_id": customer, "value": "1"},
	})
	return err
}

func meterAdjustment(c metereventadjustment.Client) error {
	_, err := c.New(&stripe.BillingMeterEventAdjustmentParams{EventName: stripe.String("api_calls")}) // want `c.New sends a Stripe write without an idempotency key: .* makes a second metereventadjustment object`
	return err
}

func v82Invoice(ctx context.Context, sc *stripe82.Client, id string) {
	sc.V1Invoices.FinalizeInvoice(ctx, id, nil)                                                        // want `sc.V1Invoices.FinalizeInvoice sends a Stripe write without an idempotency key: .* makes a second invoice object`
	sc.V1BillingMeterEventAdjustments.Create(ctx, &stripe82.BillingMeterEventAdjustmentCreateParams{}) // want `sc.V1BillingMeterEventAdjustments.Create sends a Stripe write without an idempotency key: .* makes a second metereventadjustment object`
}

// ---- not reported ----

func invoiceStepsKeyed(customer, id, key string) {
	p := &stripe.InvoiceFinalizeInvoiceParams{}
	p.SetIdempotencyKey(key + ":finalize")
	invoices.FinalizeInvoice(id, p)
	invoices.Pay(id, &stripe.InvoicePayParams{Params: stripe.Params{IdempotencyKey: stripe.String(key + ":pay")}})
	invoices.Update(id, &stripe.InvoiceParams{}) // an update sets the same values again
	invoices.Get(id, nil)
}

func meterEventKeyed(customer, key string) error {
	p := &stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"), Identifier: stripe.String(key)}
	p.IdempotencyKey = stripe.String(key)
	_, err := meterevent.New(p)
	return err
}
