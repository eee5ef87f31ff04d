package billing_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
)

// TestSimulationRefunds plays the scenarios of TestSimulation (the same
// seeds, rounds, runners, crashes, lost answers, faults, clock jumps
// across Stripe's key window, key rotations, API switches and second
// scope) with refunds after the charges: each step charges its customers
// as TestSimulation's does, then refunds them for the period by refund
// ids the application asks for one after the other. Each customer and
// period has three to five refunds: partial ones, two of the same amount
// under two ids, one that with those before it comes to more than the
// payment (which billonce must refuse, ErrInvalid, before Stripe sees it)
// and, for some, one of exactly what is left. Calls are repeated as an
// application repeats them: a second click, at once or after the first
// answer; a queue that delivers again every refund not settled yet, and
// now and then one that is; another runner in the same round. Some
// customers pay, and are refunded, by a bank debit (Server.SettleLater):
// their refunds are pending for hours, settle by themselves or fail at
// the bank at the end of a round, and a person then refunds again under a
// new id. A clean Biller reconciles at the end of some rounds, and
// Stripe's events reach a webhook handler at the end of every round.
// Another writer holds a charge's or a refund's write at Stripe across a
// key rotation (rotate-in-flight, see sim_others_test.go).
//
// After settling (the charges as TestSimulation settles them, then every
// refund asked for again, a day later again, until nothing is pending),
// the refunds are counted at the fake: each refund id refunded at most
// once (by its metadata billonce_refund, and by its key), at its amount,
// and exactly once when a call reported it made; a refund a call reported
// done (not processing) is succeeded or pending at Stripe; a payment's
// refunds that did not fail never come to more than it, nor does its
// amount_refunded, and Stripe never refused a refund billonce sent. The
// charges are checked as TestSimulation checks them, and the refunds'
// claims against the fake: a succeeded claim names its refund, a failed
// one names none that moved money, none is left unsettled; and a period
// whose payment claim is succeeded is never refused as having no payment
// to refund once settled.
//
// BILLONCE_SIM_SEEDS and BILLONCE_SIM_SEED choose the seeds as for
// TestSimulation.
func TestSimulationRefunds(t *testing.T) {
	t.Parallel()
	simTest(t, simRefunds)
}

const (
	simRefundsEndpoint = "refunds"                  // a refund claim's endpoint
	simRefundMeta      = "billonce_refund"          // the refund id in a refund's metadata
	simRefundFailure   = "expired_or_canceled_card" // why the bank returns a refund
	simAgainSuffix     = "-again"                   // a person's new id for a refund that failed
	simMaxRefundDelay  = 8 * time.Hour              // the longest a bank debit customer's refund stays pending
)

// simRefundReq is one refund the application asks for.
type simRefundReq struct {
	id     string
	amount int64
	past   bool // with the refunds asked for before it, more than the payment
	fails  bool // the bank returns it if it is still pending at the end of a round
	again  bool // a person's, after the refund it stands for failed
}

// simRefundID names a refund: its customer, its payment's period and its
// refund id.
type simRefundID struct{ customer, period, id string }

func (id simRefundID) String() string { return id.customer + "/" + id.period + " " + id.id }

// simRefundOutcome is what a Refund call reported.
type simRefundOutcome int

const (
	simRefundUnsettled  simRefundOutcome = iota // an error that settles nothing: a crash, an unknown outcome, a claim held elsewhere
	simRefundNotPaid                            // ErrInvalid: no payment to refund in the Biller's scope, yet or at all
	simRefundProcessing                         // made, pending at the bank
	simRefundDone                               // made: Created, Replayed, AlreadyBilled or Reconciled, not processing
	simRefundRefused                            // ErrInvalid: more than is left of the payment
	simRefundFailed                             // ErrDeclined: refused by Stripe, or returned by the bank
)

var simRefundOutcomeNames = [...]string{"unsettled", "not paid", "processing", "done", "refused", "failed"}

// settles reports whether o settles a refund for the application, whose
// queue then stops delivering it.
func (o simRefundOutcome) settles() bool {
	return o == simRefundDone || o == simRefundRefused || o == simRefundFailed
}

func simRefundOutcomeOf(r billing.Receipt, err error) simRefundOutcome {
	var m *claim.MismatchError
	var ce *billing.ChargeError
	switch {
	case err == nil && r.Processing:
		return simRefundProcessing
	case err == nil:
		return simRefundDone
	case errors.Is(err, billing.ErrInvalid) && errors.As(err, &m) && m.Field == "refund":
		return simRefundRefused
	case errors.Is(err, billing.ErrInvalid) && !errors.As(err, &m):
		return simRefundNotPaid
	case errors.As(err, &ce) && errors.Is(err, billing.ErrDeclined):
		return simRefundFailed
	}
	return simRefundUnsettled
}

// simRefunder is a refund scenario's refunds: what is asked for, drawn
// from the seed by a random stream of its own (the scenario's plan stays
// TestSimulation's), and what the calls reported.
type simRefunder struct {
	// Drawn with the world, read-only after.
	delay map[string]time.Duration        // bank debit customers: how long their payments and refunds are pending
	reqs  map[[2]string][]simRefundReq    // by customer and period, in the order they are asked for
	cron  []bool                          // by round: a clean Biller reconciles at its end
	order [][2]string                     // the customers and periods, sorted
	fails map[simRefundID]bool            // the refunds the bank returns
	plan  map[[2]string]map[string]string // by customer and period: refund id → its description, for the trace

	mu      sync.Mutex
	next    map[[2]string]int            // the first next of reqs are asked for
	asked   map[[2]string][]simRefundReq // what is asked for, a person's new ids among them, in order
	amounts map[simRefundID]int64        // every refund asked for
	last    map[simRefundID]simRefundOutcome
	done    map[simRefundID]bool // a call reported it done, not processing
	made    map[simRefundID]bool // a call reported it made: done or processing
	again   map[simRefundID]bool // failed, and asked for again under a new id
}

// refundWorld draws the scenario's refunds and makes its bank debit
// customers' payments and refunds settle later.
func (w *simWorld) refundWorld() {
	rng := rand.New(rand.NewPCG(w.plan.seed, 0x2ef0_d5e5_5eed))
	r := &simRefunder{delay: map[string]time.Duration{}, reqs: map[[2]string][]simRefundReq{}, fails: map[simRefundID]bool{},
		plan: map[[2]string]map[string]string{}, next: map[[2]string]int{}, asked: map[[2]string][]simRefundReq{},
		amounts: map[simRefundID]int64{}, last: map[simRefundID]simRefundOutcome{}, done: map[simRefundID]bool{},
		made: map[simRefundID]bool{}, again: map[simRefundID]bool{}}
	for _, c := range w.plan.customers {
		if rng.IntN(100) < 35 {
			r.delay[c] = time.Hour + time.Duration(rng.IntN(int((simMaxRefundDelay-time.Hour)/time.Minute)+1))*time.Minute
			w.srv.SettleLater(c, billingtest.Async{After: r.delay[c]})
		}
		for _, p := range w.plan.periods {
			cp := [2]string{c, p}
			r.order = append(r.order, cp)
			r.reqs[cp] = simRefundReqs(rng, w.plan.prices[c].Amount, r.delay[c] > 0)
			r.plan[cp] = map[string]string{}
			for _, q := range r.reqs[cp] {
				id := simRefundID{c, p, q.id}
				r.amounts[id] = q.amount
				r.fails[id] = q.fails
				r.plan[cp][q.id] = fmt.Sprintf("%d%s%s", q.amount, simIf(q.past, " past the payment"), simIf(q.fails, ", returned by the bank"))
			}
		}
	}
	for range w.plan.rounds {
		r.cron = append(r.cron, rng.IntN(100) < 35)
	}
	w.rf = r
	for _, c := range w.plan.customers {
		if d := r.delay[c]; d > 0 {
			w.logf("%s pays and is refunded by bank debit: pending for %s", c, simDur(d))
		}
	}
	for _, cp := range r.order {
		var parts []string
		for _, q := range r.reqs[cp] {
			parts = append(parts, q.id+" "+r.plan[cp][q.id])
		}
		w.logf("refunds of %s/%s: %s", cp[0], cp[1], strings.Join(parts, "; "))
	}
}

// simRefundReqs draws the refunds of a payment of price: a partial one,
// another of the same amount (or not), maybe a third, then one that comes
// to more than the payment with them, and maybe one of exactly what they
// leave. A bank debit customer's refunds are returned by the bank now and
// then.
func simRefundReqs(rng *rand.Rand, price int64, bankDebit bool) []simRefundReq {
	part := func(lo, hi int) int64 { return max(10, price*int64(lo+rng.IntN(hi-lo+1))/100/10*10) }
	first := part(10, 30)
	second := first // two items of one price returned
	if rng.IntN(100) < 40 {
		second = part(5, 20)
	}
	reqs := []simRefundReq{{id: "rma-1", amount: first}, {id: "rma-2", amount: second}}
	if rng.IntN(100) < 50 {
		reqs = append(reqs, simRefundReq{id: "rma-3", amount: part(5, 15)})
	}
	var sum int64
	for _, q := range reqs {
		sum += q.amount
	}
	reqs = append(reqs, simRefundReq{id: "rma-past", amount: price - sum + 1 + rng.Int64N(100), past: true})
	if rng.IntN(100) < 50 {
		reqs = append(reqs, simRefundReq{id: "rma-rest", amount: price - sum})
	}
	for i := range reqs {
		reqs[i].fails = bankDebit && !reqs[i].past && rng.IntN(100) < 40
	}
	return reqs
}

// refundCrashStep says which writes and claims a crash of a refund
// scenario's step falls on: a refund's, half the time, any of the step's
// otherwise (a Run's charges come first).
func (w *simWorld) refundCrashStep(round, op int) string {
	if rand.New(rand.NewPCG(w.plan.seed, uint64(round*simRunnerCount+op)^0x2ef0)).IntN(2) == 0 {
		return "refund"
	}
	return ""
}

// label names the refund keys of customer's period paid by the payment
// key pay (attempt) under scope.
func (r *simRefunder) label(labels map[string]string, scope string, pay idemkey.Key, customer, period string, attempt int) {
	for _, q := range r.reqs[[2]string{customer, period}] {
		for _, id := range []string{q.id, q.id + simAgainSuffix} {
			if k, err := idemkey.For(cmp.Or(scope, billing.DefaultScope), pay.String(), "refund", id); err == nil {
				labels[k.String()] = fmt.Sprintf("%s/%s#%d%s refund %s", customer, period, attempt, scopeTag(scope), id)
			}
		}
	}
}

// simRefundCall is one Refund call of a step, and why it is made.
type simRefundCall struct {
	req simRefundReq
	why string
}

// pick chooses the refunds a step asks for of cp: every one asked for
// and not settled yet, delivered again; now and then one that is; then
// the next one or two.
func (r *simRefunder) pick(rng *rand.Rand, cp [2]string) []simRefundCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	var calls []simRefundCall
	for _, q := range r.asked[cp] {
		if !r.last[simRefundID{cp[0], cp[1], q.id}].settles() {
			calls = append(calls, simRefundCall{q, "delivered again"})
		}
	}
	dup, n := rng.IntN(100) < 30, 1+rng.IntN(2)
	if asked := r.asked[cp]; dup && len(asked) > 0 {
		if q := asked[rng.IntN(len(asked))]; r.last[simRefundID{cp[0], cp[1], q.id}].settles() {
			calls = append(calls, simRefundCall{q, "delivered again once settled"})
		}
	}
	for ; n > 0 && r.next[cp] < len(r.reqs[cp]); n-- {
		q := r.reqs[cp][r.next[cp]]
		r.next[cp]++
		r.asked[cp] = append(r.asked[cp], q)
		calls = append(calls, simRefundCall{q, "asked for"})
	}
	return calls
}

// askAll asks for every refund of cp not asked for yet, as the settle
// phase does, and returns those asked for and not settled, in order.
func (r *simRefunder) askAll(cp [2]string) []simRefundCall {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ; r.next[cp] < len(r.reqs[cp]); r.next[cp]++ {
		r.asked[cp] = append(r.asked[cp], r.reqs[cp][r.next[cp]])
	}
	var calls []simRefundCall
	for _, q := range r.asked[cp] {
		if !r.last[simRefundID{cp[0], cp[1], q.id}].settles() {
			calls = append(calls, simRefundCall{q, "delivered again"})
		}
	}
	return calls
}

// record notes what a call of id reported. A refund made or failed
// stays so: Stripe's refund is there, or failed for good.
func (r *simRefunder) record(id simRefundID, o simRefundOutcome) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if last := r.last[id]; last != simRefundDone && last != simRefundFailed {
		r.last[id] = o
	}
	switch o {
	case simRefundDone:
		r.done[id], r.made[id] = true, true
	case simRefundProcessing:
		r.made[id] = true
	}
}

// askAgain is what a person does once a refund failed: ask for it again,
// once, under a new id.
func (r *simRefunder) askAgain(cp [2]string, q simRefundReq) (simRefundReq, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	id := simRefundID{cp[0], cp[1], q.id}
	if q.again || r.again[id] {
		return simRefundReq{}, false
	}
	r.again[id] = true
	nq := simRefundReq{id: q.id + simAgainSuffix, amount: q.amount, again: true}
	r.asked[cp] = append(r.asked[cp], nq)
	r.amounts[simRefundID{cp[0], cp[1], nq.id}] = nq.amount
	return nq, true
}

func (r *simRefunder) amountOf(id simRefundID) (int64, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	a, ok := r.amounts[id]
	return a, ok
}

// refundStep runs one runner's step of a refund scenario: the charge
// scenario's step, then refunds of the customers it charged, or of some
// of a run's.
func (w *simWorld) refundStep(ctx context.Context, b *billing.Biller, op simOp) (string, []error) {
	out, errs := w.chargeStep(ctx, b, op)
	rng := rand.New(rand.NewPCG(w.plan.seed, uint64(w.round*simRunnerCount+op.runner)<<8|0x2e))
	var customers []string
	switch op.kind {
	case simRun:
		for _, c := range op.run {
			if rng.IntN(100) < 50 {
				customers = append(customers, c)
			}
		}
	case simCharge, simRebill:
		customers = []string{op.customer}
	}
	for _, c := range customers {
		if ctx.Err() != nil {
			break
		}
		out += "; " + c + " " + w.refundCustomer(ctx, b, rng, [2]string{c, op.period})
	}
	return out, errs
}

// refundCustomer makes the Refund calls of a step for cp: those pick
// chooses, some clicked twice (after the first answer, or at once), and a
// person's new id for each refund that failed.
func (w *simWorld) refundCustomer(ctx context.Context, b *billing.Biller, rng *rand.Rand, cp [2]string) string {
	calls := w.rf.pick(rng, cp)
	var outs []string
	for i := 0; i < len(calls) && ctx.Err() == nil; i++ {
		c := calls[i]
		click := c.why == "asked for" && rng.IntN(100) < 30
		atOnce := click && rng.IntN(100) < 40
		var o simRefundOutcome
		var out string
		switch {
		case atOnce:
			var wg sync.WaitGroup
			var got [2]simRefundOutcome
			var texts [2]string
			for k, why := range []string{c.why, "a second click at once"} {
				wg.Go(func() { got[k], texts[k] = w.callRefund(ctx, b, cp, simRefundCall{c.req, why}) })
			}
			wg.Wait()
			o, out = max(got[0], got[1]), texts[0]+" | at once "+texts[1]
		case click:
			o, out = w.callRefund(ctx, b, cp, c)
			o2, out2 := w.callRefund(ctx, b, cp, simRefundCall{c.req, "a second click"})
			o, out = max(o, o2), out+", again "+out2
		default:
			o, out = w.callRefund(ctx, b, cp, c)
		}
		outs = append(outs, out)
		if o == simRefundFailed {
			if nq, ok := w.rf.askAgain(cp, c.req); ok {
				w.count("refunds failed, asked for again under a new id", 1)
				calls = append(calls, simRefundCall{nq, "a person's new id"})
			}
		}
	}
	if len(outs) == 0 {
		return "nothing to refund"
	}
	return "refunds " + strings.Join(outs, "; ")
}

// callRefund makes one Refund call and records what it reported.
func (w *simWorld) callRefund(ctx context.Context, b *billing.Biller, cp [2]string, c simRefundCall) (simRefundOutcome, string) {
	r, err := b.Refund(ctx, cp[0], cp[1], c.req.id, c.req.amount)
	o := simRefundOutcomeOf(r, err)
	if errors.Is(err, errSimCrashed) {
		return o, c.req.id + " crashed"
	}
	w.rf.record(simRefundID{cp[0], cp[1], c.req.id}, o)
	w.count("refund calls", 1)
	w.count("refund calls: "+c.why, 1)
	if err == nil && r.Outcome == billing.Reconciled {
		w.count("refund calls reported reconciled (found by listing the payment's refunds)", 1)
	}
	switch o {
	case simRefundDone:
		w.count("refund calls reported done", 1)
	case simRefundProcessing:
		w.count("refund calls reported processing", 1)
	case simRefundRefused:
		w.count("refund calls refused: more than is left of the payment", 1)
	case simRefundNotPaid:
		w.count("refund calls refused: no payment to refund in the scope", 1)
	case simRefundFailed:
		w.count("refund calls reported failed", 1)
	}
	var mm *claim.MismatchError
	if errors.As(err, &mm) && mm.Field != "refund" {
		// The application never changes a refund's amount: a refund
		// claim that contradicts its own call is billonce's.
		w.harnessf("refund %s/%s %s of %d: %v", cp[0], cp[1], c.req.id, c.req.amount, err)
	}
	out := simReceipt(r, err)
	if o == simRefundRefused || o == simRefundNotPaid {
		out = simRefundOutcomeNames[o]
	}
	return o, fmt.Sprintf("%s %s%s", c.req.id, out, simIf(r.Processing, " (pending)"))
}

// endRefundRound ends a round of a refund scenario: the bank returns the
// pending refunds it is to return, and a clean Biller reconciles when the
// plan says so.
func (w *simWorld) endRefundRound(ctx context.Context, round int) {
	w.returnRefunds("at the end of the round")
	if w.rf.cron[round] {
		w.cronReconcile(ctx)
	}
}

// cronReconcile is a job that reconciles between rounds: a clean Biller
// of the first runner's configuration.
func (w *simWorld) cronReconcile(ctx context.Context) {
	cfg := w.runners[0].cfg
	if b := w.clean(cfg); b != nil {
		sum, err := b.Reconcile(ctx, nil)
		w.count("reconciles between rounds", 1)
		w.logf("  cron, %s: reconcile: %s", cfg.where(), simSummary(sum, err))
	}
}

// returnRefunds fails, as their bank does, the pending refunds the plan
// has the bank return.
func (w *simWorld) returnRefunds(when string) {
	for _, m := range w.srv.Movements("refund") {
		id := simRefundOf(m)
		if m.Status != "pending" || !w.rf.fails[id] {
			continue
		}
		if err := w.srv.Settle(m.ID, "failed", simRefundFailure); err != nil {
			w.harnessf("returning refund %s: %v", m.ID, err)
			continue
		}
		w.count("refunds returned by the bank", 1)
		w.logf("  the bank returns refund %s (%s, %d %s) %s", m.ID, id, m.Amount, m.Currency, when)
	}
}

func simRefundOf(m billingtest.Movement) simRefundID {
	return simRefundID{m.Metadata[billing.MetaCustomer], m.Metadata[billing.MetaPeriod], m.Metadata[simRefundMeta]}
}

// settleRefunds ends a refund scenario: the charges settle as
// TestSimulation's do, then clean Billers ask for every refund again,
// from the scope of its payment, until none is pending: once at once,
// again a day later (every refund's key window over, every pending refund
// settled or returned) after every configuration reconciled, and after
// each further wait for pending refunds.
func (w *simWorld) settleRefunds(ctx context.Context) {
	w.settle(ctx)
	w.logf("settle the refunds at %s", simAt(w.now()))
	w.refundEveryone(ctx, "final config")
	w.returnRefunds("while settling")
	w.quiet(0)
	w.move(ctx, 25*time.Hour, "past every refund's key window")
	w.deliverWebhooks(ctx)
	w.reconcileEach(ctx)
	for pass := 1; ; pass++ {
		pending := w.refundEveryone(ctx, fmt.Sprintf("final config, a day later, pass %d", pass))
		if pending == 0 || pass == 4 {
			return
		}
		w.returnRefunds("while settling")
		w.move(ctx, simMaxRefundDelay+time.Hour, fmt.Sprintf("until %d pending refunds settle", pending))
		w.deliverWebhooks(ctx)
		if b := w.clean(w.plan.final); b != nil {
			sum, err := b.Reconcile(ctx, nil)
			w.settleReconciled("final config: reconcile", sum, err)
		}
	}
}

// refundEveryone asks for every refund of every customer and period with
// a clean Biller of its payment's scope, and calls again each one not
// settled, a person's new ids among them. It returns how many calls
// left a refund unsettled: processing, or an error.
func (w *simWorld) refundEveryone(ctx context.Context, what string) (pending int) {
	claims, err := simListClaims(ctx, w.pool, w.table)
	if err != nil {
		w.harnessf("listing claims: %v", err)
		return 0
	}
	scopes := map[[2]string]string{}
	for _, c := range claims {
		if simPaymentClaim(c) && c.State == string(claim.StateSucceeded) {
			scopes[[2]string{c.Customer, c.Period}] = c.Scope
		}
	}
	billers := map[string]*billing.Biller{}
	counts := map[simRefundOutcome]int{}
	for _, cp := range w.rf.order {
		scope := cmp.Or(scopes[cp], billing.DefaultScope)
		if billers[scope] == nil {
			if billers[scope] = w.cleanIn(scope); billers[scope] == nil {
				return 0
			}
		}
		calls := w.rf.askAll(cp)
		for i := 0; i < len(calls); i++ {
			r, err := billers[scope].Refund(ctx, cp[0], cp[1], calls[i].req.id, calls[i].req.amount)
			w.noteHeld(err)
			o := simRefundOutcomeOf(r, err)
			w.rf.record(simRefundID{cp[0], cp[1], calls[i].req.id}, o)
			counts[o]++
			if o == simRefundUnsettled {
				w.logf("  %s: refund %s/%s %s: %s", what, cp[0], cp[1], calls[i].req.id, simErr(err))
			}
			if o == simRefundFailed {
				if nq, ok := w.rf.askAgain(cp, calls[i].req); ok {
					w.count("refunds failed, asked for again under a new id", 1)
					w.logf("  %s: refund %s/%s %s failed: a person refunds again as %s", what, cp[0], cp[1], calls[i].req.id, nq.id)
					calls = append(calls, simRefundCall{nq, "a person's new id"})
				}
			}
		}
	}
	var parts []string
	for o, n := range counts {
		parts = append(parts, fmt.Sprintf("%s×%d", simRefundOutcomeNames[o], n))
	}
	slices.Sort(parts)
	w.logf("  %s: refunds asked for again: %s", what, strings.Join(parts, ", "))
	return counts[simRefundProcessing] + counts[simRefundUnsettled]
}

// checkRefunds checks the charges as TestSimulation does, then counts the
// refunds at the fake after settling, and checks the refunds' claims
// against them.
func (w *simWorld) checkRefunds(ctx context.Context) []simViolation {
	out := w.check(ctx)
	claims, _, ok := w.claimsByPeriod(ctx)
	if !ok {
		return out
	}
	add := func(id simRefundID, kind, format string, args ...any) {
		out = append(out, simViolation{Kind: kind, Cause: w.cause(id.customer, id.period), Detail: fmt.Sprintf(format, args...)})
	}
	pays := map[string]billingtest.Payment{}
	for _, p := range w.srv.Payments() {
		pays[p.ID] = p
	}
	moves := w.srv.Movements("refund")
	byID := map[simRefundID][]billingtest.Movement{}
	byKey := map[string][]billingtest.Movement{}
	live := map[string]int64{} // by payment: what its refunds that did not fail come to
	describe := func(ms []billingtest.Movement) string {
		var s []string
		for _, m := range ms {
			s = append(s, fmt.Sprintf("%s (%s %d %s, key %s, at %s)", m.ID, m.Status, m.Amount, m.Currency, w.keyLabel(m.IdempotencyKey), simAt(m.Created.Sub(w.t0))))
		}
		return strings.Join(s, ", ")
	}
	for _, m := range moves {
		id := simRefundOf(m)
		w.count("refunds at Stripe", 1)
		if m.Status == "failed" || m.Status == "canceled" {
			w.count("refunds at Stripe, returned by the bank", 1)
		} else {
			live[m.Of] += m.Amount
		}
		want, known := w.rf.amountOf(id)
		if !known || m.Metadata[billing.MetaKey] == "" {
			add(id, "unknown refund", "%s refunds %s with metadata %v, a refund nobody asked for", m.ID, m.Of, m.Metadata)
			continue
		}
		byID[id] = append(byID[id], m)
		byKey[m.Metadata[billing.MetaKey]] = append(byKey[m.Metadata[billing.MetaKey]], m)
		if m.IdempotencyKey != m.Metadata[billing.MetaKey] {
			add(id, "refund key", "%s: sent with key %q, its metadata says %q", id, m.IdempotencyKey, m.Metadata[billing.MetaKey])
		}
		p := pays[m.Of]
		switch {
		case p.Customer != id.customer || p.Period != id.period || !p.Paid:
			add(id, "refund of another payment", "%s: %s refunds %s (%s %s/%s)", id, m.ID, m.Of, p.Status, p.Customer, p.Period)
		case m.Amount != want || m.Currency != p.Currency:
			add(id, "wrong amount", "%s: %s is %d %s, asked for %d %s", id, m.ID, m.Amount, m.Currency, want, p.Currency)
		}
	}
	// Each refund id refunded at most once, by its id and by its key.
	for _, id := range simSortedRefundIDs(byID) {
		if ms := byID[id]; len(ms) > 1 {
			add(id, "refunded twice", "%s: %d refunds at Stripe: %s", id, len(ms), describe(ms))
		}
	}
	for k, ms := range byKey {
		if len(ms) > 1 && simRefundOf(ms[0]) != simRefundOf(ms[len(ms)-1]) {
			add(simRefundOf(ms[0]), "refunded twice", "key %s: %d refunds of different ids: %s", w.keyLabel(k), len(ms), describe(ms))
		}
	}
	// A payment's refunds never come to more than it.
	for _, p := range pays {
		if live[p.ID] == 0 && p.AmountRefunded == 0 {
			continue
		}
		id := simRefundID{customer: p.Customer, period: p.Period}
		w.count("payments refunded", 1)
		if live[p.ID] == p.Amount {
			w.count("payments refunded in full", 1)
		}
		if live[p.ID] > p.Amount || p.AmountRefunded > p.Amount {
			add(id, "refunded past the payment", "%s (%d %s, %s/%s): its refunds come to %d, amount_refunded %d", p.ID, p.Amount, p.Currency,
				p.Customer, p.Period, live[p.ID], p.AmountRefunded)
		}
	}
	// No refund Stripe refused: billonce sends none past what is left.
	byClaimKey := map[string]simClaim{}
	for _, c := range claims {
		byClaimKey[c.Key] = c
	}
	for _, e := range w.srv.Log() {
		if e.Method == http.MethodGet && e.Path == "/v1/refunds" {
			w.count("refund listings", 1)
		}
		if e.Method != http.MethodPost || e.Path != "/v1/refunds" {
			continue
		}
		w.count("refund requests", 1)
		if e.Replayed {
			w.count("refund requests replayed by Stripe", 1)
		}
		if e.Status == http.StatusBadRequest {
			c := byClaimKey[e.IdempotencyKey]
			add(simRefundID{customer: c.Customer, period: c.Period}, "refund refused by Stripe", "POST /v1/refunds with key %s (claim %s %s) answered 400 at %s",
				w.keyLabel(e.IdempotencyKey), c.Period, c.State, simAt(e.Time.Sub(w.t0)))
		}
	}
	// What a call reported made is at Stripe, once.
	w.rf.mu.Lock()
	made, done := w.rf.made, w.rf.done
	w.rf.mu.Unlock()
	for _, id := range simSortedRefundIDs(made) {
		ms := byID[id]
		w.count("refund ids reported made", 1)
		switch {
		case len(ms) == 0:
			add(id, "reported refund missing", "%s: a call reported it %s, Stripe holds no refund of it", id, simIf(done[id], "done")+simIf(!done[id], "processing"))
		case len(ms) == 1 && done[id] && ms[0].Status != "succeeded" && ms[0].Status != "pending":
			add(id, "reported refund missing", "%s: a call reported it done, Stripe holds %s", id, describe(ms))
		}
	}
	// The refunds' claims against the fake.
	for _, c := range claims {
		if c.Endpoint != simRefundsEndpoint {
			continue
		}
		ms := byKey[c.Key]
		per, rid, _ := strings.Cut(c.Period, " refund ")
		id := simRefundID{c.Customer, per, rid}
		delete(byKey, c.Key)
		liveAt := slices.ContainsFunc(ms, func(m billingtest.Movement) bool { return m.Status == "succeeded" || m.Status == "pending" })
		switch c.State {
		case string(claim.StateSucceeded):
			if len(ms) != 1 || ms[0].Status != "succeeded" || ms[0].ID != c.StripeID || ms[0].Amount != c.Amount {
				add(id, "false success", "claim %s (%d %s) is succeeded as %s; Stripe holds %s", w.keyLabel(c.Key), c.Amount, c.Currency, c.StripeID, describe(ms))
			}
		case string(claim.StateFailed):
			if liveAt {
				add(id, "live refund recorded failed", "claim %s is failed; Stripe holds %s", w.keyLabel(c.Key), describe(ms))
			}
		default:
			if !w.refundHeld(id) {
				add(id, "unsettled refund", "claim %s is %s after settling; Stripe holds %s", w.keyLabel(c.Key), c.State, describe(ms))
			}
		}
	}
	for k, ms := range byKey {
		add(simRefundOf(ms[0]), "refund without claim", "%s: no claim has its key %s", describe(ms), w.keyLabel(k))
	}
	// Every refund asked for is settled for the application, and a
	// period paid has a payment to refund.
	paid := map[[2]string]bool{}
	for _, c := range claims {
		if simPaymentClaim(c) && c.State == string(claim.StateSucceeded) {
			paid[[2]string{c.Customer, c.Period}] = true
		}
	}
	w.rf.mu.Lock()
	for _, cp := range w.rf.order {
		for _, q := range w.rf.asked[cp] {
			id := simRefundID{cp[0], cp[1], q.id}
			switch o := w.rf.last[id]; {
			case (o == simRefundUnsettled || o == simRefundProcessing) && !w.refundHeld(id):
				out = append(out, simViolation{Kind: "unsettled refund", Cause: w.cause(id.customer, id.period),
					Detail: fmt.Sprintf("%s: its last call after settling reported %s", id, simRefundOutcomeNames[o])})
			case o == simRefundNotPaid && paid[cp]:
				out = append(out, simViolation{Kind: "payment not found", Cause: w.cause(id.customer, id.period),
					Detail: fmt.Sprintf("%s: its last call after settling found no payment to refund, yet the period's payment claim is succeeded", id)})
			}
		}
	}
	w.rf.mu.Unlock()
	return out
}

// refundHeld reports whether refund id is left for a person, as heldFor
// says of a period: the settle phase reported it (ErrNeedsReconciliation,
// whose period is the refund claim's) and another writer touched its
// payment's period.
func (w *simWorld) refundHeld(id simRefundID) bool {
	w.ow.mu.Lock()
	held := w.ow.held[[2]string{id.customer, id.period + " refund " + id.id}]
	w.ow.mu.Unlock()
	return held && w.cause(id.customer, id.period) != ""
}

func simSortedRefundIDs[V any](m map[simRefundID]V) []simRefundID {
	ids := make([]simRefundID, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.SortFunc(ids, func(a, b simRefundID) int { return strings.Compare(a.String(), b.String()) })
	return ids
}
