package billing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// TestSimulationUsage plays the scenarios of TestSimulation (the same
// seeds, rounds, runners, crashes, faults, clock jumps, key rotations and
// second scope) with usage reports instead of charges: each customer has
// three hourly windows of usage per period, reported by ReportUsage one by
// one, by RunUsage over many customers, or again with the next attempt
// after Stripe rejected them. Some customers also report a window's
// running totals to a meter that keeps the newest event of each hour, one
// total after the other, and some a window from 34 days ago while Stripe
// still takes it. Other writers act meanwhile (see sim_others_test.go): a
// key rotated while a meter event is held at Stripe, another program's
// rejected event with the identifier of a report delivered a day before,
// a reporter on a moved grid, the totals' claim rows restored from an
// older copy. A customer whose card the scenario makes
// decline has its meter events rejected instead (Server.RejectUsage), and
// the error reports reach a webhook handler at the end of every round. The
// fake's identifier window and key window move with the claim table's
// clock, so clock jumps carry resends past both.
//
// After settling (faults off, rejections lifted for the customers the
// scenario re-reports, every event aggregated, clean runs before and after
// a further day), the meter is checked at the fake: every window of every
// customer still reported counted exactly once, as one event, with one
// succeeded claim; a window whose event was rejected counted zero times,
// with its claims failed; no other event. A window's totals end at the
// newest total the application holds a receipt for (or a later one sent
// without a receipt), never an older one; a window from 34 days ago counts
// once with a succeeded claim, or not at all without one; no
// reconciliation of the settle phase stops.
//
// BILLONCE_SIM_SEEDS and BILLONCE_SIM_SEED choose the seeds as for
// TestSimulation.
func TestSimulationUsage(t *testing.T) {
	t.Parallel()
	simTest(t, simUsage)
}

const (
	simMeter         = "api_calls"
	simRejectCode    = "meter_event_customer_not_found"
	simUsageWindows  = 3 // per customer and period
	simMaxUsageTries = 6 // attempts of a window the settle phase makes
)

// simHooks is the webhook endpoint of a scenario whose outcomes arrive by
// webhook (usage and invoices).
type simHooks struct {
	hook      http.Handler // of a Biller that never crashes
	delivered int          // events of the fake delivered so far
	redeliver []billingtest.Event
}

// usageWorld creates the meter and places the windows: whole hours that
// ended before the scenario began, on the wall clock that Biller checks
// windows against. The fake's clock only moves on from there, so the
// events are never in its future.
func (w *simWorld) usageWorld() {
	w.srv.CreateMeter(simMeter, "sum", "")
	n := len(w.plan.periods) * simUsageWindows
	now := time.Now().UTC().Truncate(time.Hour)
	w.usageBase = now.Add(-time.Duration(n+1) * time.Hour)
	// Billonce takes a window up to 34 days old on its own clock, which
	// stays near the wall clock; Stripe, up to 35 days on the fake's,
	// which moves with the scenario: a day and two hours in, it refuses
	// this window.
	w.oldBase = now.Add(-34*24*time.Hour + 2*time.Hour)
	if len(w.others.totals) > 0 {
		w.srv.CreateMeter(simTotalsMeter, "sum", "hour")
	}
	if w.others.on[simForeignMeterEvent] {
		w.srv.RejectUsage(simGoneCustomer, "meter_event_customer_not_found")
	}
}

// reports returns the usage reports of customer for period, attempt 0.
func (w *simWorld) reports(customer, period string) []billing.Usage {
	i := slices.Index(w.plan.periods, period)
	out := make([]billing.Usage, simUsageWindows)
	for k := range out {
		start := w.usageBase.Add(time.Duration(i*simUsageWindows+k) * time.Hour)
		out[k] = billing.Usage{Customer: customer, Meter: simMeter, Kind: billing.Increments,
			Start: start, End: start.Add(time.Hour), Value: w.plan.prices[customer].Amount/10 + int64(k)}
	}
	return out
}

// opReports are the reports a runner's step makes of customer for period:
// its windows, and the window from 34 days ago while Stripe takes it.
func (w *simWorld) opReports(customer, period string) []billing.Usage {
	out := w.reports(customer, period)
	if u, ok := w.oldReport(customer); ok && period == w.plan.periods[0] && w.now() < simOldUntil {
		out = append(out, u)
	}
	return out
}

// reportsOf yields the reports of customers for period: those of a
// runner's step (ops), or the windows alone.
func (w *simWorld) reportsOf(customers []string, period string, ops bool) iter.Seq2[billing.Usage, error] {
	return func(yield func(billing.Usage, error) bool) {
		for _, c := range customers {
			us := w.reports(c, period)
			if ops {
				us = w.opReports(c, period)
			}
			for _, u := range us {
				if !yield(u, nil) {
					return
				}
			}
		}
	}
}

// simUsagePeriod is the claim period of a report (see ReportUsage): its
// meter, the minute its window starts, and its kind (for a window total,
// with its attempt).
func simUsagePeriod(u billing.Usage) string {
	if u.Kind == billing.WindowTotals {
		return fmt.Sprintf("usage %s %s total %d", u.Meter, u.Start.Format(time.RFC3339), max(u.Attempt, 1))
	}
	return fmt.Sprintf("usage %s %s increment", u.Meter, u.Start.Format(time.RFC3339))
}

// usageStep runs one runner's step of a usage scenario: a charge reports
// the customer's windows one by one, a run reports many customers' at
// once, a re-bill reports again with the next attempt a window whose
// report Stripe rejected.
func (w *simWorld) usageStep(ctx context.Context, b *billing.Biller, op simOp) (string, []error) {
	switch op.kind {
	case simRun:
		sum, err := b.RunUsage(ctx, w.reportsOf(op.run, op.period, true), &billing.RunOptions{Concurrency: op.conc, BatchSize: op.batch})
		out, errs := simSummary(sum, err), append(sum.Failures, err)
		// Window totals go one at a time, each after the one before.
		for _, c := range op.run {
			if ctx.Err() != nil {
				break
			}
			if t, err, ok := w.reportTotal(ctx, b, w.runners[op.runner].cfg.Scope, c, op.period); ok {
				out, errs = out+"; "+c+" "+t, append(errs, err)
			}
		}
		return out, errs
	case simReconcile:
		sum, err := b.Reconcile(ctx, nil)
		return simSummary(sum, err), append(sum.Failures, err)
	}
	var outs []string
	var errs []error
	for _, u := range w.opReports(op.customer, op.period) {
		var out string
		var err error
		for try := 0; try < 2 && ctx.Err() == nil; try++ {
			var r billing.Receipt
			r, err = b.ReportUsage(ctx, u)
			out = simIf(try > 0, fmt.Sprintf("attempt %d ", u.Attempt)) + simUsageReceipt(r, err)
			var fe *billing.ChargeError
			if op.kind != simRebill || !errors.As(err, &fe) || !errors.Is(err, billing.ErrDeclined) {
				break
			}
			u.Attempt = fe.Attempt + 1
		}
		outs, errs = append(outs, out), append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	if ctx.Err() == nil {
		if out, err, ok := w.reportTotal(ctx, b, w.runners[op.runner].cfg.Scope, op.customer, op.period); ok {
			outs, errs = append(outs, out), append(errs, err)
		}
	}
	return "report " + strings.Join(outs, "; "), errs
}

func simUsageReceipt(r billing.Receipt, err error) string {
	if err != nil {
		return simErr(err)
	}
	return r.Outcome.String()
}

// deliverWebhooks delivers the fake's new events, and those refused
// before, to the webhook endpoint, as Stripe does, after every round.
func (w *simWorld) deliverWebhooks(ctx context.Context) {
	u := &w.hooks
	if u.hook == nil {
		b := w.clean(w.plan.initial[0])
		if b == nil {
			return
		}
		h, err := b.Webhook(billing.WebhookConfig{Secret: whsec})
		if err != nil {
			w.harnessf("webhook handler: %v", err)
			return
		}
		u.hook = h
	}
	evs := w.srv.Events()
	todo := append(u.redeliver, evs[u.delivered:]...)
	u.delivered, u.redeliver = len(evs), nil
	for _, ev := range todo {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/stripe/webhook", bytes.NewReader(ev.Body))
		req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, whsec, time.Now()))
		rec := httptest.NewRecorder()
		u.hook.ServeHTTP(rec, req)
		answer := strings.TrimSpace(rec.Body.String())
		if rec.Code != http.StatusOK {
			u.redeliver = append(u.redeliver, ev)
		}
		if rec.Code != http.StatusOK || strings.HasPrefix(answer, "applied") {
			w.logf("  webhook %s %s: %d %s", ev.ID, ev.Type, rec.Code, answer)
		}
	}
}

// settleUsage ends a usage scenario as settle ends a charge scenario, and
// aggregates every event and delivers every error report before each
// clean pass reads the claims.
func (w *simWorld) settleUsage(ctx context.Context) {
	plan := w.plan
	w.logf("settle at %s with %s", simAt(w.now()), plan.final)
	w.srv.SetScript(nil)
	for _, c := range plan.rebill {
		w.srv.RejectUsage(c, "")
	}
	w.quiet(0)
	w.move(ctx, plan.settleJump, "before settling")
	w.srv.AggregateNow()
	w.deliverWebhooks(ctx)
	w.settleUsageWith(ctx, w.clean(plan.final), "final config")
	w.restoreRows(ctx, "once every total is reported")
	w.quiet(0)
	w.move(ctx, 25*time.Hour, "past every key and identifier window")
	w.reconcileEach(ctx)
	w.retryFirstTotals(ctx, w.clean(plan.final))
	w.srv.AggregateNow()
	w.deliverWebhooks(ctx)
	w.settleUsageWith(ctx, w.clean(plan.final), "final config, a day later")
}

func (w *simWorld) settleUsageWith(ctx context.Context, b *billing.Biller, what string) {
	if b == nil {
		return
	}
	sum, err := b.Reconcile(ctx, nil)
	w.settleReconciled(what+": reconcile", sum, err)
	for _, p := range w.plan.periods {
		sum, err := b.RunUsage(ctx, w.reportsOf(w.plan.active, p, false), &billing.RunOptions{Concurrency: 4})
		w.logf("  %s: run %s: %s", what, p, simSummary(sum, err))
		w.noteHeld(sum.Failures...)
	}
	for _, c := range w.others.totals {
		if !slices.Contains(w.plan.active, c) {
			continue
		}
		for _, p := range w.plan.periods {
			for range simTotalRevisions {
				out, err, ok := w.reportTotal(ctx, b, w.plan.final.Scope, c, p)
				if !ok {
					break
				}
				w.noteHeld(err)
				w.logf("  %s: report %s %s %s", what, c, p, out)
				if err != nil {
					break
				}
			}
		}
	}
	w.srv.AggregateNow()
	w.deliverWebhooks(ctx)
	for _, c := range w.plan.rebill {
		if !slices.Contains(w.plan.active, c) {
			continue
		}
		for _, p := range w.plan.periods {
			for _, u := range w.reports(c, p) {
				b := b
				for range simMaxUsageTries {
					_, err := b.ReportUsage(ctx, u)
					w.noteHeld(err)
					if other, ok := simDeclinedUnder(err); ok {
						// Rejected under another scope: the person reports
						// it again from that scope's Biller, as the error says.
						if b = w.cleanIn(other); b == nil {
							break
						}
						w.logf("  %s: %s %s was rejected under scope %q: reported again from there", what, c, u.Start.Format("15:04"), other)
						_, err = b.ReportUsage(ctx, u)
						w.noteHeld(err)
					}
					var fe *billing.ChargeError
					if !errors.As(err, &fe) || !errors.Is(err, billing.ErrDeclined) {
						break
					}
					u.Attempt = fe.Attempt + 1
					r, err := b.ReportUsage(ctx, u)
					w.logf("  %s: report %s %s again, attempt %d: %s", what, c, u.Start.Format("15:04"), u.Attempt, simUsageReceipt(r, err))
					w.noteHeld(err)
					if err == nil {
						break
					}
				}
			}
		}
	}
	w.srv.AggregateNow()
	w.deliverWebhooks(ctx)
}

// checkUsage checks the meter at the fake against the claim table after
// settling.
func (w *simWorld) checkUsage(ctx context.Context) []simViolation {
	_, byWindow, ok := w.claimsByPeriod(ctx)
	if !ok {
		return nil
	}
	out := w.settleViolations()
	add := func(cust, period, kind, format string, args ...any) {
		out = append(out, simViolation{Kind: kind, Cause: w.cause(cust, period), Detail: fmt.Sprintf(format, args...)})
	}
	oldCounted := w.checkOthers(byWindow, add)
	for _, cust := range w.plan.customers {
		counted := oldCounted[cust]
		leftRejected := slices.Contains(w.plan.declined, cust) && !slices.Contains(w.plan.rebill, cust)
		billed := slices.Contains(w.plan.active, cust)
		for _, p := range w.plan.periods {
			for _, u := range w.reports(cust, p) {
				at := cust + " " + u.Start.Format("15:04")
				per := simUsagePeriod(u)
				add := func(kind, format string, args ...any) { add(cust, per, kind, format, args...) }
				cs := byWindow[[2]string{cust, per}]
				delete(byWindow, [2]string{cust, per})
				var states []string
				succeeded, unsettled := 0, 0
				for _, c := range cs {
					states = append(states, c.State)
					switch c.State {
					case string(claim.StateSucceeded):
						succeeded++
					case string(claim.StatePending):
						unsettled++
					}
				}
				total := w.srv.MeterTotal(simMeter, cust, u.Start, u.End)
				switch {
				case total == float64(u.Value):
					counted++
					w.count("windows counted once", 1)
					if succeeded != 1 {
						add("unrecorded usage", "%s: counted once at Stripe, but %d succeeded claims %v", at, succeeded, states)
					}
				case total == 0 && succeeded > 0:
					add("false success", "%s: %d succeeded claims %v, but Stripe counts nothing", at, succeeded, states)
				case total == 0 && unsettled > 0 && w.heldFor(cust, per):
					w.count("windows left for a person after another writer acted", 1)
					unsettled = 0
				case total == 0 && billed && !leftRejected:
					add("missing", "%s: Stripe counts nothing; claims %v", at, states)
				case total == 0:
					if len(cs) > 0 && unsettled == 0 {
						w.count("windows rejected, claims failed", 1)
					}
					if leftRejected && len(cs) > 0 && unsettled > 0 {
						add("rejection not recorded", "%s: its event was rejected, claims %v", at, states)
					}
				case total > float64(u.Value) && int64(total)%u.Value == 0:
					add("double count", "%s: counted %v times (total %v, value %d); claims %v", at, total/float64(u.Value), total, u.Value, states)
				default:
					add("wrong total", "%s: total %v, value %d; claims %v", at, total, u.Value, states)
				}
				if unsettled > 0 && billed {
					add("unsettled", "%s: claims %v after settling", at, states)
				}
			}
		}
		if n := w.srv.MeterEvents(simMeter, cust); n != counted {
			// The windows' own violations say what other writers did.
			out = append(out, simViolation{Kind: "extra events", Detail: fmt.Sprintf("%s: %d events counted at Stripe, %d windows counted once", cust, n, counted)})
		}
	}
	for cp, cs := range byWindow {
		add(cp[0], cp[1], "unknown claim", "%s %q: %d claims", cp[0], cp[1], len(cs))
	}
	w.countFake()
	return out
}

// countFake counts what the fake served: meter event requests, the
// duplicate-identifier answers among them, and the faults injected.
func (w *simWorld) countFake() {
	for _, e := range w.srv.Log() {
		if e.Method == http.MethodPost && e.Path == meterEvents && !simOtherRequest(e.IdempotencyKey) {
			w.count("meter event requests", 1)
			if e.Status == http.StatusBadRequest {
				w.count("meter events answered 400 (identifier taken)", 1)
			}
		}
	}
	for _, n := range w.srv.Stats().Faults {
		w.count("faults", int(n))
	}
}
