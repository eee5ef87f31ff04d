package main

import (
	"iter"
	"strconv"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// byInvoice bills each item by one Stripe invoice with one line of its
// price, instead of a charge: billing.Item.Invoice. The invoice is charged
// to the customer's default payment method as soon as it is final.
func byInvoice(items iter.Seq2[billing.Item, error], period string) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for it, err := range items {
			if err == nil && it.Price != nil {
				it = billing.Item{Customer: it.Customer, Invoice: &billing.Invoice{
					Currency: it.Price.Currency,
					Lines:    []billing.InvoiceLine{{Description: "Plan, billing period " + period, Amount: it.Price.Amount}},
				}}
			}
			if !yield(it, err) {
				return
			}
		}
	}
}

// checkInvoices counts the customers' invoices at the fake for period.
// Every customer the runs billed must have exactly one invoice, paid or
// open (a declined payment leaves it open for Stripe to collect), with
// each of its lines once and nothing else; nobody may have more than one.
func checkInvoices(fake *billingtest.Server, period string, items iter.Seq2[billing.Item, error], billed int) *ledger {
	l := &ledger{}
	for it, err := range items {
		if err != nil {
			break
		}
		l.Customers++
		var mine []billingtest.Invoice
		for _, in := range fake.Invoices(it.Customer) {
			if in.Metadata[billing.MetaPeriod] == period {
				mine = append(mine, in)
			}
		}
		switch {
		case len(mine) == 0:
			l.NotCharged++
		case len(mine) > 1:
			l.MoreThanOnce++
		case !linesOnce(mine[0], it.Invoice):
			l.WrongLines++
		default:
			l.Once++
		}
	}
	l.OK = l.MoreThanOnce == 0 && l.WrongLines == 0 && l.Once == billed
	return l
}

// linesOnce reports whether in is paid or open and holds each line of
// want once, at its amount, and no other.
func linesOnce(in billingtest.Invoice, want *billing.Invoice) bool {
	if (in.Status != "paid" && in.Status != "open") || want == nil || len(in.Lines) != len(want.Lines) {
		return false
	}
	seen := map[string]bool{}
	for _, l := range in.Lines {
		i, err := strconv.Atoi(l.Metadata["billonce_line"])
		if err != nil || i < 0 || i >= len(want.Lines) || seen[l.Metadata["billonce_line"]] || l.Amount != want.Lines[i].Amount {
			return false
		}
		seen[l.Metadata["billonce_line"]] = true
	}
	return true
}
