package main

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// The invoice rows bill one line for the period on one invoice; the fake
// counts the lines the customer is billed for: those of its open and paid
// invoices.
const lineDescription = "Team plan, " + period

func countBilledLines(fake *billingtest.Server, customer string) int {
	n := 0
	for _, inv := range fake.Invoices(customer) {
		if inv.Status == "open" || inv.Status == "paid" {
			n += len(inv.Lines)
		}
	}
	return n
}

func invoiceScenarios() []scenario {
	return []scenario{
		{
			id:        "invoice-restart",
			name:      "invoice steps without keys; the job starts over after a lost answer",
			customers: []string{"cus_inv_restart"},
			naive:     naiveInvoiceRestart,
			billonce:  billonceInvoiceRestart,
			count:     countBilledLines,
		},
		{
			id:        "invoice-sweep",
			name:      "line created pending, swept with another pending item",
			customers: []string{"cus_inv_sweep"},
			naive:     naiveInvoiceSweep,
			billonce:  billonceInvoiceSweep,
			count:     countBilledLines,
		},
	}
}

// invoiceClients are plain stripe-go clients on the fake.
func (e *env) invoiceClients() (*invoice.Client, *invoiceitem.Client) {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.stripe.URL),
		HTTPClient:        &http.Client{Transport: newTransport(), Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quiet{},
	})
	return &invoice.Client{B: b, Key: secretKey}, &invoiceitem.Client{B: b, Key: secretKey}
}

func invoiceOf() *billing.Invoice {
	return &billing.Invoice{Currency: currency, Lines: []billing.InvoiceLine{{Description: lineDescription, Amount: amount}}}
}

// naiveInvoice is the whole job as many services write it: draft, line,
// finalize, pay, each step sent as it comes, with no key. include makes
// the line pending first and lets the draft sweep the customer's pending
// items in.
func naiveInvoice(ctx context.Context, e *env, customer string, include bool) error {
	invoices, items := e.invoiceClients()
	ip := &stripe.InvoiceItemParams{Customer: stripe.String(customer), Amount: stripe.Int64(amount),
		Currency: stripe.String(currency), Description: stripe.String(lineDescription)}
	ip.Context = ctx
	if include {
		if _, err := items.New(ip); err != nil {
			return err
		}
	}
	params := &stripe.InvoiceParams{Customer: stripe.String(customer), Currency: stripe.String(currency)}
	params.Context = ctx
	if include {
		params.PendingInvoiceItemsBehavior = stripe.String("include")
	}
	inv, err := invoices.New(params)
	if err != nil {
		return err
	}
	if !include {
		ip.Invoice = stripe.String(inv.ID)
		if _, err := items.New(ip); err != nil {
			return err
		}
	}
	fp := &stripe.InvoiceFinalizeInvoiceParams{}
	fp.Context = ctx
	if _, err := invoices.FinalizeInvoice(inv.ID, fp); err != nil {
		return err
	}
	pp := &stripe.InvoicePayParams{}
	pp.Context = ctx
	_, err = invoices.Pay(inv.ID, pp)
	return err
}

// ---- invoices: the job starts over ----

// cutFirstFinalize returns a fault script that commits the first
// finalization the fake sees and cuts its answer.
func cutFirstFinalize() func(billingtest.Request) billingtest.Fault {
	var done atomic.Bool
	return func(r billingtest.Request) billingtest.Fault {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/finalize") && done.CompareAndSwap(false, true) {
			return billingtest.Fault{Kind: billingtest.FaultCut}
		}
		return billingtest.Fault{}
	}
}

// naiveInvoiceRestart loses the answer to the finalization; the job
// failed, so the queue runs it again from the start: a second invoice.
func naiveInvoiceRestart(ctx context.Context, e *env) error {
	e.stripe.SetScript(cutFirstFinalize())
	for run := 1; run <= 2; run++ {
		err := naiveInvoice(ctx, e, "cus_inv_restart", false)
		e.logf("unsafe: run %d: %v", run, err)
		if err == nil {
			break
		}
	}
	return nil
}

func billonceInvoiceRestart(ctx context.Context, e *env) error {
	e.stripe.SetScript(cutFirstFinalize())
	tune := func(c *billing.Config, cc *claim.Config) { cc.Lease = time.Second; c.Retry.MaxAttempts = 1 }
	for run := 1; run <= 2; run++ {
		b, err := e.biller(ctx, "invoices-run-"+strconv.Itoa(run), tune)
		if err != nil {
			return err
		}
		r, err := b.Invoice(ctx, "cus_inv_restart", period, invoiceOf())
		e.logf("billonce: run %d: %s %s, err=%v", run, r.Outcome, r.StripeID, err)
		if err == nil {
			break
		}
		time.Sleep(1100 * time.Millisecond) // the lease of the run that gave up
	}
	return nil
}

// ---- invoices: pending items swept ----

// naiveInvoiceSweep creates the period's line as a pending item and the
// invoice with pending_invoice_items_behavior=include: the customer's
// other pending item, meant for a later invoice, is swept in and billed
// now.
func naiveInvoiceSweep(ctx context.Context, e *env) error {
	e.stripe.AddPendingItem("cus_inv_sweep", 4900, currency) // another team's one-off fee, for next month
	err := naiveInvoice(ctx, e, "cus_inv_sweep", true)
	e.logf("unsafe: invoiced with include: %v", err)
	return nil
}

func billonceInvoiceSweep(ctx context.Context, e *env) error {
	e.stripe.AddPendingItem("cus_inv_sweep", 4900, currency)
	b, err := e.biller(ctx, "invoices-0", nil)
	if err != nil {
		return err
	}
	r, err := b.Invoice(ctx, "cus_inv_sweep", period, invoiceOf())
	e.logf("billonce: %s %s, err=%v", r.Outcome, r.StripeID, err)
	return nil
}
