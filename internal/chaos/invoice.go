package chaos

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Invoice is the invoice customer i is billed by: one to three lines, the
// first at Price(i).
func Invoice(i int) billing.Invoice {
	p := Price(i)
	all := []billing.InvoiceLine{{Description: "Plan", Amount: p.Amount}, {Description: "Seats", Amount: p.Amount/5 + 10},
		{Description: "Support", Amount: 40}}
	return billing.Invoice{Currency: p.Currency, Lines: all[:1+i%len(all)]}
}

// InvoiceOf is Invoice as a billing.Config.Invoice: it finds the invoice
// of a customer by ID.
func InvoiceOf(_ context.Context, customer, _ string) (billing.Invoice, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(customer, "cus_"))
	if err != nil {
		return billing.Invoice{}, fmt.Errorf("no invoice for %q", customer)
	}
	return Invoice(i), nil
}

// CheckInvoices is Check for a run that bills by invoice: it closes the
// fake and checks its invoices against the claim table. Each customer must
// have exactly one invoice for period, with each of Invoice's lines once
// at its amount, finalized once, paid once with a succeeded claim naming
// it; a declined customer's invoice stays open, unpaid, with a processing
// claim. Any other invoice is a duplicate, any other claim a mismatch.
// Paid and Declined count the customers.
func (e *Env) CheckInvoices(ctx context.Context, period string) (Ledger, error) {
	e.Fake.Close()
	st := e.Fake.Stats()
	l := Ledger{Faults: st.Faults, Requests: st.Requests, Replays: st.Replays}
	claims, err := loadClaims(ctx, e.Pool, &l)
	if err != nil {
		return l, e.Errorf("reading claims: %w", err)
	}
	byCustomer := map[string][]billingtest.Invoice{}
	for _, in := range e.Fake.Invoices("") {
		if in.Metadata[billing.MetaPeriod] != period {
			l.problem(&l.Mismatches, "invoice %s of customer %s for period %q", in.ID, in.Customer, in.Metadata[billing.MetaPeriod])
			continue
		}
		byCustomer[in.Customer] = append(byCustomer[in.Customer], in)
	}
	for i := range e.s.Customers {
		c := CustomerID(i)
		k := key{period, c}
		cl := claims[k]
		delete(claims, k)
		invs := byCustomer[c]
		delete(byCustomer, c)
		switch {
		case len(invs) == 0:
			l.problem(&l.Missing, "customer %s has no invoice; claim state %q", c, cl.state)
			continue
		case len(invs) > 1:
			l.Duplicates += len(invs) - 1
			var ids []string
			for _, in := range invs {
				ids = append(ids, fmt.Sprintf("%s (%s, %d lines)", in.ID, in.Status, len(in.Lines)))
			}
			l.note("customer %s has %d invoices: %s", c, len(invs), strings.Join(ids, ", "))
			continue
		}
		in := invs[0]
		wantStatus, wantPayments, wantState := "paid", 1, string(claim.StateSucceeded)
		if e.Declined[c] {
			wantStatus, wantPayments, wantState = "open", 0, string(claim.StateProcessing)
		}
		if in.Status != wantStatus || in.Payments != wantPayments || in.Finalizations != 1 {
			l.problem(&l.Mismatches, "customer %s: invoice %s is %s, finalized %d times, paid %d times; want %s, 1, %d",
				c, in.ID, in.Status, in.Finalizations, in.Payments, wantStatus, wantPayments)
		}
		if cl.state != wantState || cl.stripeID != in.ID {
			l.problem(&l.Mismatches, "customer %s: claim %q names %q, want %s naming %s", c, cl.state, cl.stripeID, wantState, in.ID)
		}
		want := Invoice(i)
		seen := make([]int, len(want.Lines))
		for _, line := range in.Lines {
			n, err := strconv.Atoi(line.Metadata["billonce_line"])
			if err != nil || n < 0 || n >= len(want.Lines) || line.Amount != want.Lines[n].Amount {
				l.problem(&l.Mismatches, "customer %s: invoice %s has line %s of %d, index %q", c, in.ID, line.ID, line.Amount, line.Metadata["billonce_line"])
				continue
			}
			seen[n]++
		}
		for n, times := range seen {
			switch {
			case times == 0:
				l.problem(&l.Missing, "customer %s: invoice %s has no line %d", c, in.ID, n)
			case times > 1:
				l.Duplicates += times - 1
				l.note("customer %s: invoice %s has line %d %d times", c, in.ID, n, times)
			}
		}
		if e.Declined[c] {
			l.Declined++
		} else {
			l.Paid++
		}
		l.Reports += len(in.Lines)
	}
	for c, invs := range byCustomer {
		l.problem(&l.Mismatches, "%d invoices for unknown customer %s", len(invs), c)
	}
	for k, c := range claims {
		l.problem(&l.Mismatches, "claim for unknown customer %s, period %q (state %q)", k.customer, k.period, c.state)
	}
	if !l.OK() {
		l.Evidence = evidence(l.Problems, e.Fake.Log(), e.LogDir)
	}
	return l, nil
}
