package billing_test

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// TestSimulationInvoices plays the scenarios of TestSimulation with
// invoices instead of charges: each customer is billed for each period by
// one invoice of one to three lines (Config.Invoice), by Invoice one
// customer at a time or by Run over many. Crashes fall on any of an
// invoice's writes (the draft, each line, the finalization, the payment),
// where they lose Stripe's answer or the runner dies before recording it;
// the fake also drops connections without a byte. A customer whose card
// the scenario makes decline keeps an open invoice. Invoice events reach
// a webhook handler at the end of every round. Other writers act meanwhile
// (see sim_others_test.go): a key rotated while an invoice's write is held
// at Stripe, a person adding an item to a draft, marking an open invoice
// paid outside Stripe or voiding it, or duplicating an invoice, metadata
// and all.
//
// After settling as TestSimulation does, the fake's invoices are checked:
// every customer and period billed has exactly one invoice, paid (or open
// for a declined card), each of its lines present once at its amount,
// finalized once and paid at most once, named by its one claim; no
// customer or period has any other invoice. What people did is theirs: an
// invoice a person voided leaves the period unbilled, its claim failed (or
// pending for a person); one a person marked paid is paid once; a draft
// with an item a person added is never finalized by billonce, and its claim
// waits for a person; copies a person made are not billonce's. No
// reconciliation of the settle phase stops.
//
// BILLONCE_SIM_SEEDS and BILLONCE_SIM_SEED choose the seeds as for
// TestSimulation.
func TestSimulationInvoices(t *testing.T) {
	t.Parallel()
	simTest(t, simInvoices)
}

// invoiceOf is the invoice customer is billed for a period: one to three
// lines in the customer's currency.
func (p *simPlan) invoiceOf(_ context.Context, customer, period string) (billing.Invoice, error) {
	pr, ok := p.prices[customer]
	if !ok {
		return billing.Invoice{}, fmt.Errorf("no price for %s", customer)
	}
	all := []billing.InvoiceLine{{Description: "Plan", Amount: pr.Amount}, {Description: "Seats", Amount: pr.Amount/5 + 10},
		{Description: "Support", Amount: 40}}
	return billing.Invoice{Currency: pr.Currency, Description: "Billing period " + period,
		Lines: all[:1+int(pr.Amount/100)%len(all)]}, nil
}

// invoiceStep runs one runner's step of an invoice scenario: a charge or
// a re-bill invoices one customer, a run many.
func (w *simWorld) invoiceStep(ctx context.Context, b *billing.Biller, op simOp) (string, []error) {
	switch op.kind {
	case simRun:
		sum, err := b.Run(ctx, op.period, billing.Customers(op.run...), &billing.RunOptions{Concurrency: op.conc, BatchSize: op.batch})
		return simSummary(sum, err), append(sum.Failures, err)
	case simReconcile:
		sum, err := b.Reconcile(ctx, nil)
		return simSummary(sum, err), append(sum.Failures, err)
	}
	r, err := b.Invoice(ctx, op.customer, op.period, nil)
	out := simReceipt(r, err)
	if err == nil && r.Processing {
		out += " (open)"
	}
	return "invoice: " + out, []error{err}
}

// settleInvoices ends an invoice scenario as settle ends a charge
// scenario, delivering the events before each clean pass.
func (w *simWorld) settleInvoices(ctx context.Context) {
	plan := w.plan
	w.logf("settle at %s with %s", simAt(w.now()), plan.final)
	w.srv.SetScript(nil)
	for _, c := range plan.rebill {
		w.srv.Honor(c)
	}
	w.quiet(0)
	w.move(ctx, plan.settleJump, "before settling")
	w.deliverWebhooks(ctx)
	w.settleInvoicesWith(ctx, w.clean(plan.final), "final config")
	w.quiet(0)
	w.move(ctx, 25*time.Hour, "past every key window")
	w.reconcileEach(ctx)
	w.deliverWebhooks(ctx)
	w.settleInvoicesWith(ctx, w.clean(plan.final), "final config, a day later")
}

func (w *simWorld) settleInvoicesWith(ctx context.Context, b *billing.Biller, what string) {
	if b == nil {
		return
	}
	sum, err := b.Reconcile(ctx, nil)
	w.settleReconciled(what+": reconcile", sum, err)
	for _, p := range w.plan.periods {
		sum, err := b.Run(ctx, p, billing.Customers(w.plan.active...), &billing.RunOptions{Concurrency: 4})
		w.logf("  %s: run %s: %s", what, p, simSummary(sum, err))
		w.noteHeld(sum.Failures...)
	}
	w.deliverWebhooks(ctx)
}

// checkInvoices checks the fake's invoices against the claim table after
// settling.
func (w *simWorld) checkInvoices(ctx context.Context) []simViolation {
	_, byPeriod, ok := w.claimsByPeriod(ctx)
	if !ok {
		return nil
	}
	out := w.settleViolations()
	var cust, per string // of the violations added
	add := func(kind, format string, args ...any) {
		out = append(out, simViolation{Kind: kind, Cause: w.cause(cust, per), Detail: fmt.Sprintf(format, args...)})
	}
	invs := make(map[[2]string][]billingtest.Invoice)
	for _, in := range w.srv.Invoices("") {
		if w.is(w.ow.foreign, in.ID) {
			w.count("invoices other writers made", 1)
			continue
		}
		cp := [2]string{in.Customer, in.Metadata[billing.MetaPeriod]}
		invs[cp] = append(invs[cp], in)
	}
	for _, cust = range w.plan.customers {
		billed := slices.Contains(w.plan.active, cust)
		declined := slices.Contains(w.plan.declined, cust)
		for _, per = range w.plan.periods {
			cp := [2]string{cust, per}
			at := cust + "/" + per
			got, cs := invs[cp], byPeriod[cp]
			delete(invs, cp)
			var states []string
			for _, c := range cs {
				states = append(states, c.State+simIf(c.StripeID != "", " "+c.StripeID))
			}
			// An invoice a person voided billed nothing: its claim is
			// failed, or pending for a person. The period may stay
			// unbilled, or be billed by another product's claim.
			got = slices.DeleteFunc(got, func(in billingtest.Invoice) bool {
				if in.Status != "void" || !w.is(w.ow.voided, in.ID) {
					return false
				}
				i := slices.IndexFunc(cs, func(c simClaim) bool { return c.StripeID == in.ID })
				if i < 0 || (cs[i].State != string(claim.StateFailed) && cs[i].State != string(claim.StatePending)) {
					add("unrecorded invoice", "%s: %s, voided by hand, is not named by a failed or pending claim: claims %v", at, in.ID, states)
				}
				w.count("invoices voided by hand", 1)
				return true
			})
			if len(got) == 0 && len(invs[cp]) == 0 && slices.ContainsFunc(cs, func(c simClaim) bool { return w.is(w.ow.voided, c.StripeID) }) {
				w.count("periods left unbilled by a void by hand", 1)
				continue
			}
			switch {
			case len(got) > 1:
				var ids []string
				for _, in := range got {
					ids = append(ids, fmt.Sprintf("%s (%s, %d lines)", in.ID, in.Status, len(in.Lines)))
				}
				add("two invoices", "%s: %s; claims %v", at, strings.Join(ids, ", "), states)
				continue
			case len(got) == 0 && billed:
				add("missing", "%s has no invoice; claims %v", at, states)
				continue
			case len(got) == 0:
				continue // no longer billed, and never started
			}
			in := got[0]
			want, _ := w.plan.invoiceOf(ctx, cust, per)
			var foreign []string
			for _, l := range in.Lines {
				if w.is(w.ow.items, l.Item) {
					foreign = append(foreign, fmt.Sprintf("%s of %d", l.Item, l.Amount))
				}
			}
			// A draft left for a person after another writer acted (with
			// a person's item, say: billonce does not bill what it did not
			// write), which settling reported.
			held := in.Status == "draft" && in.Finalizations == 0 && w.heldFor(cust, per)
			switch {
			case len(foreign) > 0 && in.Finalizations > 0:
				add("foreign line billed", "%s: %s is %s with the items %v a person added, and its claim records billonce's total; claims %v",
					at, in.ID, in.Status, foreign, states)
			case held:
				w.count("invoices left for a person, as drafts", 1)
			case in.Status == "paid" && in.Payments == 1:
				w.count("invoices paid", 1)
				if in.PaidOutOfBand {
					w.count("invoices marked paid by hand", 1)
				}
			case in.Status == "open" && in.Payments == 0 && declined:
				w.count("invoices open, the card declined", 1)
			default:
				add("invoice state", "%s: %s is %s, finalized %d times, paid %d times; claims %v", at, in.ID, in.Status, in.Finalizations, in.Payments, states)
			}
			if in.Finalizations != 1 && !held {
				add("invoice state", "%s: %s finalized %d times", at, in.ID, in.Finalizations)
			}
			lines := make(map[int]int)
			for _, l := range in.Lines {
				if w.is(w.ow.items, l.Item) {
					continue
				}
				i, err := strconv.Atoi(l.Metadata["billonce_line"])
				switch {
				case err != nil || i < 0 || i >= len(want.Lines):
					add("unknown line", "%s: %s has a line %s of %d, index %q", at, in.ID, l.ID, l.Amount, l.Metadata["billonce_line"])
					continue
				case l.Amount != want.Lines[i].Amount || l.Currency != want.Currency || l.Metadata[billing.MetaKey] != in.Metadata[billing.MetaKey]:
					add("wrong line", "%s: %s line %d is %d %s, want %d %s", at, in.ID, i, l.Amount, l.Currency, want.Lines[i].Amount, want.Currency)
				}
				lines[i]++
			}
			for i := range want.Lines {
				switch n := lines[i]; {
				case n == 0 && !held:
					add("missing line", "%s: %s has no line %d", at, in.ID, i)
				case n > 1:
					add("duplicated line", "%s: %s has line %d %d times", at, in.ID, i, n)
				}
			}
			var named []simClaim
			for _, c := range cs {
				if c.Key == in.Metadata[billing.MetaKey] {
					named = append(named, c)
				}
			}
			wantState := []string{string(claim.StateSucceeded)}
			switch {
			case held:
				wantState = []string{string(claim.StatePending)}
			case in.Status == "open":
				wantState = []string{string(claim.StateProcessing)}
			}
			if len(named) != 1 || !slices.Contains(wantState, named[0].State) || named[0].StripeID != in.ID {
				add("unrecorded invoice", "%s: %s (%s) is not named by one %s claim: claims %v", at, in.ID, in.Status, strings.Join(wantState, " or "), states)
			}
		}
	}
	for cp, got := range invs {
		cust, per = cp[0], cp[1]
		add("unknown invoice", "%s/%s: %d invoices", cp[0], cp[1], len(got))
	}
	for _, e := range w.srv.Log() {
		if e.Method == "POST" && simCreate(e.Path) && !simOtherRequest(e.IdempotencyKey) {
			w.count("invoice writes", 1)
		}
	}
	for _, n := range w.srv.Stats().Faults {
		w.count("faults", int(n))
	}
	return out
}
