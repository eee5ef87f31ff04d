package billing_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
)

// TestSimulationMoneyOut plays the scenarios of TestSimulation (the same
// seeds, rounds, runners, crashes, lost answers, faults, clock jumps
// across Stripe's key window, key rotations, API switches and second
// scope) with money going out to connected accounts after the charges:
// each step charges its customers as TestSimulation's does, then
// transfers to and pays out from connected accounts for the period, by
// Transfer and Payout calls (some clicked twice, at once or after the
// first answer, and every one not settled delivered again) or, in a Run
// step, by a Run of transfer and payout items. The platform's balance is
// now and then short of the transfers at first (Stripe refuses them,
// balance_insufficient) and is topped up at the end of a round; a person
// then transfers again under the next attempt. Some payouts are returned
// by the bank after they were paid (Server.Settle to failed) and paid out
// again by a person under the next attempt. A clean Biller reconciles at
// the end of some rounds, and Stripe's events (payout.*) reach a webhook
// handler at the end of every round.
//
// After settling (the charges as TestSimulation settles them, then every
// transfer and payout asked for again, and again once every payout had
// time to be paid, until nothing is pending), the transfers and payouts
// are counted at the fake: each account and period has at most one live
// transfer and one live payout (a payout failed or canceled is not live),
// and exactly one when a call reported it done; an attempt after the
// first is at Stripe only when the one before it failed; no balance is
// ever negative; what a call reported done is at Stripe, and not failed
// unless the bank returned it later; every transfer and payout has its
// claim, and the claims say what Stripe holds.
//
// BILLONCE_SIM_SEEDS and BILLONCE_SIM_SEED choose the seeds as for
// TestSimulation.
func TestSimulationMoneyOut(t *testing.T) {
	t.Parallel()
	simTest(t, simMoneyOut)
}

const (
	simMoveCurrency   = "usd"
	simPayoutReturned = "account_closed" // why the bank returns a payout after it was paid
	simMaxMoveAttempt = 5                // the last attempt a person makes
	simPayoutPaid     = 50 * time.Hour   // a standard payout is paid by then
)

var simMoveKinds = []string{"transfer", "payout"}

// simMoveEndpoint reports whether endpoint is a transfer's or payout's.
func simMoveEndpoint(endpoint string) bool { return endpoint == "transfers" || endpoint == "payouts" }

// simMoveID names one account's transfer or payout of a period.
type simMoveID struct{ account, period, what string }

func (id simMoveID) String() string { return id.what + " " + id.account + "/" + id.period }

// simMoveOutcome is what a Transfer or Payout call reported.
type simMoveOutcome int

const (
	simMoveUnsettled  simMoveOutcome = iota // an error that settles nothing
	simMoveInvalid                          // ErrInvalid
	simMoveProcessing                       // a payout on its way
	simMoveDone                             // Created, Replayed, AlreadyBilled or Reconciled, not processing
	simMoveFailed                           // ErrDeclined: refused by Stripe, or returned by the bank
)

var simMoveOutcomeNames = [...]string{"unsettled", "invalid", "processing", "done", "failed"}

func simMoveOutcomeOf(r billing.Receipt, err error) simMoveOutcome {
	var ce *billing.ChargeError
	switch {
	case err == nil && r.Processing:
		return simMoveProcessing
	case err == nil:
		return simMoveDone
	case errors.Is(err, billing.ErrInvalid):
		return simMoveInvalid
	case errors.As(err, &ce) && errors.Is(err, billing.ErrDeclined):
		return simMoveFailed
	}
	return simMoveUnsettled
}

// simMover is a money-out scenario's accounts and what the calls
// reported, drawn from the seed by a random stream of its own.
type simMover struct {
	// Drawn with the world, read-only after.
	accounts []string
	amounts  map[simMoveID]int64
	order    []simMoveID
	returns  map[simMoveID]bool // the bank returns its first payout once paid
	topUpAt  int                // the round at whose end the platform is topped up; -1 if never short
	cron     []bool

	mu       sync.Mutex
	attempt  map[simMoveID]int // the attempt the application calls now
	last     map[simMoveID]simMoveOutcome
	done     map[simMoveID]map[int]bool // attempts a call reported done
	again    map[simMoveID]bool         // failed: a person makes the next attempt at the end of the round
	toppedUp bool
	returned map[string]bool // payouts the bank returned after they were paid
	negative []string        // balances seen below zero
}

// moveWorld creates the scenario's connected accounts with their
// balances and funds the platform, short of the transfers now and then.
func (w *simWorld) moveWorld() {
	rng := rand.New(rand.NewPCG(w.plan.seed, 0x3a0e_0c7e_5eed))
	m := &simMover{amounts: map[simMoveID]int64{}, returns: map[simMoveID]bool{}, topUpAt: -1,
		attempt: map[simMoveID]int{}, last: map[simMoveID]simMoveOutcome{}, done: map[simMoveID]map[int]bool{},
		again: map[simMoveID]bool{}, returned: map[string]bool{}}
	var transfers int64
	for range 2 + rng.IntN(3) {
		acct := w.srv.CreateAccount()
		m.accounts = append(m.accounts, acct)
		var payouts int64
		for _, p := range w.plan.periods {
			for _, what := range simMoveKinds {
				id := simMoveID{acct, p, what}
				m.order = append(m.order, id)
				m.amounts[id] = int64(100+rng.IntN(4900)) / 10 * 10
				m.attempt[id] = 1
				if what == "payout" {
					payouts += m.amounts[id]
					m.returns[id] = rng.IntN(100) < 30
				} else {
					transfers += m.amounts[id]
				}
			}
		}
		// Enough for every payout and each one paid again, without the
		// transfers.
		w.srv.SetBalance(acct, simMoveCurrency, 2*payouts)
	}
	platform := transfers
	if rng.IntN(100) < 50 {
		platform = transfers * int64(20+rng.IntN(50)) / 100
		m.topUpAt = rng.IntN(max(1, len(w.plan.rounds)/2))
	}
	w.srv.SetBalance("", simMoveCurrency, platform)
	for range w.plan.rounds {
		m.cron = append(m.cron, rng.IntN(100) < 35)
	}
	w.mo = m
	w.logf("connected accounts %v; the platform holds %d %s for transfers of %d%s", m.accounts, platform, simMoveCurrency, transfers,
		simIf(m.topUpAt >= 0, fmt.Sprintf(", topped up at the end of round %d", m.topUpAt+1)))
	for _, id := range m.order {
		w.logf("  %s: %d %s%s", id, m.amounts[id], simMoveCurrency, simIf(m.returns[id], ", returned by the bank once paid"))
	}
}

// label names the transfer and payout keys of scope.
func (m *simMover) label(labels map[string]string, scope string) {
	for _, id := range m.order {
		for a := 1; a <= simMaxMoveAttempt; a++ {
			if k, err := idemkey.For(cmp.Or(scope, billing.DefaultScope), id.what, id.account, id.period, strconv.Itoa(a)); err == nil {
				labels[k.String()] = fmt.Sprintf("%s#%d%s", id, a, scopeTag(scope))
			}
		}
	}
}

// moveCrashStep says which writes a crash of a money-out scenario's step
// falls on: a transfer's, a payout's, or any of the step's.
func (w *simWorld) moveCrashStep(round, op int) string {
	return []string{"transfer", "payout", ""}[rand.New(rand.NewPCG(w.plan.seed, uint64(round*simRunnerCount+op)^0x3a0e)).IntN(3)]
}

// record notes what a call of id at attempt reported; a failure has a
// person make the next attempt.
func (m *simMover) record(id simMoveID, attempt int, o simMoveOutcome) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if attempt != m.attempt[id] {
		return // a call of an attempt the person has moved on from
	}
	m.last[id] = o
	switch o {
	case simMoveDone:
		if m.done[id] == nil {
			m.done[id] = map[int]bool{}
		}
		m.done[id][attempt] = true
	case simMoveFailed:
		m.again[id] = true
	}
}

// current is the attempt the application calls for id.
func (m *simMover) current(id simMoveID) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.attempt[id]
}

// pick chooses the calls a step makes for period: for the accounts
// chosen, the transfer and payout of period, and every one of any period
// not settled yet, delivered again.
func (m *simMover) pick(rng *rand.Rand, period string) []simMoveID {
	m.mu.Lock()
	defer m.mu.Unlock()
	var ids []simMoveID
	for _, id := range m.order {
		if _, asked := m.last[id]; asked && m.last[id] != simMoveDone && m.last[id] != simMoveFailed {
			ids = append(ids, id)
		}
	}
	for _, acct := range m.accounts {
		if rng.IntN(100) < 60 {
			for _, what := range simMoveKinds {
				if id := (simMoveID{acct, period, what}); !slices.Contains(ids, id) {
					ids = append(ids, id)
					if _, ok := m.last[id]; !ok {
						m.last[id] = simMoveUnsettled
					}
				}
			}
		}
	}
	return ids
}

// moveStep runs one runner's step of a money-out scenario: the charge
// scenario's step, then a Run of every account's transfer and payout
// items for a Run step, and Transfer and Payout calls for the others.
func (w *simWorld) moveStep(ctx context.Context, b *billing.Biller, op simOp) (string, []error) {
	out, errs := w.chargeStep(ctx, b, op)
	if ctx.Err() != nil || op.kind == simReconcile {
		return out, errs
	}
	rng := rand.New(rand.NewPCG(w.plan.seed, uint64(w.round*simRunnerCount+op.runner)<<8|0x3a))
	if op.kind == simRun {
		var items []billing.Item
		for _, acct := range w.mo.accounts {
			for _, what := range simMoveKinds {
				p := billing.Price{Amount: w.mo.amounts[simMoveID{acct, op.period, what}], Currency: simMoveCurrency}
				it := billing.Item{Account: acct, Transfer: &p}
				if what == "payout" {
					it = billing.Item{Account: acct, Payout: &p}
				}
				items = append(items, it)
			}
		}
		rng.Shuffle(len(items), func(i, j int) { items[i], items[j] = items[j], items[i] })
		sum, err := b.Run(ctx, op.period, simItems(items), &billing.RunOptions{Concurrency: op.conc, BatchSize: op.batch})
		w.count("money-out runs", 1)
		return out + "; money out: " + simSummary(sum, err), append(errs, append(sum.Failures, err)...)
	}
	var outs []string
	for _, id := range w.mo.pick(rng, op.period) {
		if ctx.Err() != nil {
			break
		}
		click := rng.IntN(100) < 25
		switch {
		case click && rng.IntN(100) < 50:
			var wg sync.WaitGroup
			var texts [2]string
			for k := range texts {
				wg.Go(func() { texts[k] = w.callMove(ctx, b, id, "at once") })
			}
			wg.Wait()
			outs = append(outs, texts[0]+" | at once "+texts[1])
		case click:
			outs = append(outs, w.callMove(ctx, b, id, "")+", again "+w.callMove(ctx, b, id, "a second click"))
		default:
			outs = append(outs, w.callMove(ctx, b, id, ""))
		}
	}
	return out + "; money out: " + strings.Join(outs, "; "), errs
}

func simItems(items []billing.Item) func(func(billing.Item, error) bool) {
	return func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}
}

// callMove makes one Transfer or Payout call of id at the application's
// current attempt and records what it reported.
func (w *simWorld) callMove(ctx context.Context, b *billing.Biller, id simMoveID, why string) string {
	r, o, err := w.moveOnce(ctx, b, id)
	if errors.Is(err, errSimCrashed) {
		return id.String() + " crashed"
	}
	w.count("money-out calls", 1)
	w.count(id.what+" calls reported "+simMoveOutcomeNames[o], 1)
	if why != "" {
		w.count("money-out calls: "+why, 1)
	}
	return fmt.Sprintf("%s %s%s", id, simReceipt(r, err), simIf(r.Processing, " (on its way)"))
}

// moveOnce calls b for id at its current attempt and records the
// outcome, but for a crash.
func (w *simWorld) moveOnce(ctx context.Context, b *billing.Biller, id simMoveID) (billing.Receipt, simMoveOutcome, error) {
	a := w.mo.current(id)
	p := billing.Price{Amount: w.mo.amounts[id], Currency: simMoveCurrency}
	var r billing.Receipt
	var err error
	if id.what == "payout" {
		r, err = b.Payout(ctx, id.account, id.period, p, &billing.MoneyOutOptions{Attempt: a})
	} else {
		r, err = b.Transfer(ctx, id.account, id.period, p, &billing.MoneyOutOptions{Attempt: a})
	}
	o := simMoveOutcomeOf(r, err)
	if !errors.Is(err, errSimCrashed) {
		w.mo.record(id, a, o)
	}
	return r, o, err
}

// endMoveRound ends a round of a money-out scenario: the bank returns the
// paid payouts it is to return, the platform is topped up when the plan
// says so, a person makes the next attempt of each that failed, the
// balances are read, and a clean Biller reconciles when the plan says so.
func (w *simWorld) endMoveRound(ctx context.Context, round int) {
	w.returnPayouts("at the end of the round")
	if round == w.mo.topUpAt {
		w.topUp("at the end of the round")
	}
	w.nextAttempts()
	w.readBalances(fmt.Sprintf("after round %d", round+1))
	if w.mo.cron[round] {
		w.cronReconcile(ctx)
	}
}

// returnPayouts fails, as their bank does days after, the paid payouts
// the plan has the bank return: the first one of each.
func (w *simWorld) returnPayouts(when string) (n int) {
	for _, m := range w.srv.Movements("payout") {
		id := simMoveID{m.Account, m.Metadata[billing.MetaPeriod], "payout"}
		w.mo.mu.Lock()
		due := m.Status == "paid" && w.mo.returns[id] && !slices.ContainsFunc(w.srv.Movements("payout"), func(o billingtest.Movement) bool {
			return w.mo.returned[o.ID] && o.Account == m.Account && o.Metadata[billing.MetaPeriod] == id.period
		})
		w.mo.mu.Unlock()
		if !due {
			continue
		}
		if err := w.srv.Settle(m.ID, "failed", simPayoutReturned); err != nil {
			w.harnessf("returning payout %s: %v", m.ID, err)
			continue
		}
		w.mo.mu.Lock()
		w.mo.returned[m.ID] = true
		if w.mo.last[id] == simMoveDone {
			// The application hears of it and asks again.
			w.mo.last[id] = simMoveUnsettled
		}
		w.mo.mu.Unlock()
		n++
		w.count("payouts returned by the bank after they were paid", 1)
		w.logf("  the bank returns payout %s (%s, key %s) %s", m.ID, id, w.keyLabel(m.IdempotencyKey), when)
	}
	return n
}

// topUp funds the platform with every transfer.
func (w *simWorld) topUp(when string) {
	var all int64
	for _, id := range w.mo.order {
		if id.what == "transfer" {
			all += w.mo.amounts[id]
		}
	}
	have := w.srv.Balance("", simMoveCurrency)
	w.srv.SetBalance("", simMoveCurrency, have+all)
	w.mo.mu.Lock()
	w.mo.toppedUp = true
	w.mo.mu.Unlock()
	w.count("platform balance top-ups", 1)
	w.logf("  the platform's balance is topped up %s: %d → %d %s", when, have, have+all, simMoveCurrency)
}

// nextAttempts is a person's decision on each transfer or payout that
// failed: the next attempt, once the platform was topped up for a
// transfer.
func (w *simWorld) nextAttempts() {
	var made []string
	w.mo.mu.Lock()
	for _, id := range w.mo.order {
		if !w.mo.again[id] || (id.what == "transfer" && w.mo.topUpAt >= 0 && !w.mo.toppedUp) || w.mo.attempt[id] >= simMaxMoveAttempt {
			continue
		}
		w.mo.again[id] = false
		w.mo.attempt[id]++
		w.mo.last[id] = simMoveUnsettled
		made = append(made, fmt.Sprintf("%s again as attempt %d", id, w.mo.attempt[id]))
	}
	w.mo.mu.Unlock()
	for _, m := range made {
		w.count("money out failed, made again under the next attempt", 1)
		w.logf("  a person makes %s", m)
	}
}

// readBalances records any balance below zero.
func (w *simWorld) readBalances(when string) {
	for _, acct := range append([]string{""}, w.mo.accounts...) {
		if b := w.srv.Balance(acct, simMoveCurrency); b < 0 {
			w.mo.mu.Lock()
			w.mo.negative = append(w.mo.negative, fmt.Sprintf("%s: %s's balance is %d %s", when, cmp.Or(acct, "the platform"), b, simMoveCurrency))
			w.mo.mu.Unlock()
		}
	}
}

// settleMoves ends a money-out scenario: the charges settle as
// TestSimulation's do, the platform is funded, then clean Billers make
// every transfer and payout again, then again after every payout had time
// to be paid and the bank to return those it returns, until every call
// reported done and the bank returned nothing meanwhile.
func (w *simWorld) settleMoves(ctx context.Context) {
	w.settle(ctx)
	w.logf("settle the money out at %s", simAt(w.now()))
	w.mo.mu.Lock()
	short := !w.mo.toppedUp && w.mo.topUpAt >= 0
	w.mo.mu.Unlock()
	if short {
		w.topUp("before settling")
	}
	for pass := 1; pass <= 6; pass++ {
		pending := w.moveEveryone(ctx, fmt.Sprintf("pass %d", pass))
		w.quiet(0)
		w.move(ctx, simPayoutPaid, "until every payout is paid")
		w.deliverWebhooks(ctx)
		returned := w.returnPayouts("while settling")
		w.deliverWebhooks(ctx)
		w.reconcileEach(ctx)
		w.nextAttempts()
		w.readBalances(fmt.Sprintf("settling, pass %d", pass))
		if pending == 0 && returned == 0 {
			return
		}
	}
}

// moveEveryone calls every transfer and payout not done with a clean
// Biller of its claims' scope, a person's next attempt after each that
// failed. It returns how many calls did not report it done.
func (w *simWorld) moveEveryone(ctx context.Context, what string) (pending int) {
	claims, err := simListClaims(ctx, w.pool, w.table)
	if err != nil {
		w.harnessf("listing claims: %v", err)
		return 0
	}
	scopes := map[simMoveID]string{}
	for _, c := range claims {
		if simMoveEndpoint(c.Endpoint) {
			kind, per, _ := strings.Cut(c.Period, " ")
			scopes[simMoveID{c.Customer, per, kind}] = c.Scope
		}
	}
	billers := map[string]*billing.Biller{}
	counts := map[simMoveOutcome]int{}
	for _, id := range w.mo.order {
		scope := cmp.Or(scopes[id], billing.DefaultScope)
		if billers[scope] == nil {
			if billers[scope] = w.cleanIn(scope); billers[scope] == nil {
				return 0
			}
		}
		for range simMaxMoveAttempt {
			_, o, err := w.moveOnce(ctx, billers[scope], id)
			w.noteHeld(err)
			counts[o]++
			if o != simMoveFailed {
				if o != simMoveDone {
					pending++
					w.logf("  %s: %s#%d: %s", what, id, w.mo.current(id), simErr(err))
				}
				break
			}
			w.nextAttempts()
		}
	}
	var parts []string
	for o, n := range counts {
		parts = append(parts, fmt.Sprintf("%s×%d", simMoveOutcomeNames[o], n))
	}
	slices.Sort(parts)
	w.logf("  %s: money out asked for again: %s", what, strings.Join(parts, ", "))
	return pending
}

// checkMoves checks the charges as TestSimulation does, then counts the
// transfers and payouts at the fake after settling, and checks their
// claims against them.
func (w *simWorld) checkMoves(ctx context.Context) []simViolation {
	out := w.check(ctx)
	claims, _, ok := w.claimsByPeriod(ctx)
	if !ok {
		return out
	}
	add := func(id simMoveID, kind, format string, args ...any) {
		out = append(out, simViolation{Kind: kind, Cause: w.cause(id.account, id.period), Detail: fmt.Sprintf(format, args...)})
	}
	w.mo.mu.Lock()
	for _, n := range w.mo.negative {
		out = append(out, simViolation{Kind: "negative balance", Detail: n})
	}
	returned := w.mo.returned
	w.mo.mu.Unlock()
	byKey := map[string]simClaim{}
	for _, c := range claims {
		if simMoveEndpoint(c.Endpoint) {
			byKey[c.Key] = c
		}
	}
	describe := func(ms []billingtest.Movement) string {
		var s []string
		for _, m := range ms {
			s = append(s, fmt.Sprintf("%s (%s%d %s, key %s, at %s)", m.ID, simIf(m.Status != "", m.Status+" "), m.Amount, m.Currency,
				w.keyLabel(m.IdempotencyKey), simAt(m.Created.Sub(w.t0))))
		}
		return strings.Join(s, ", ")
	}
	dead := func(m billingtest.Movement) bool { return m.Status == "failed" || m.Status == "canceled" }
	byID := map[simMoveID][]billingtest.Movement{}
	moveByKey := map[string][]billingtest.Movement{}
	for _, what := range simMoveKinds {
		for _, m := range w.srv.Movements(what) {
			acct := m.Account
			if what == "transfer" {
				acct = m.Destination
			}
			id := simMoveID{acct, m.Metadata[billing.MetaPeriod], what}
			w.count(what+"s at Stripe", 1)
			if dead(m) {
				w.count(what+"s at Stripe, failed", 1)
			}
			if _, known := w.mo.amounts[id]; !known || m.Metadata[billing.MetaKey] == "" {
				add(id, "unknown "+what, "%s with metadata %v, which nobody asked for", m.ID, m.Metadata)
				continue
			}
			byID[id] = append(byID[id], m)
			moveByKey[m.Metadata[billing.MetaKey]] = append(moveByKey[m.Metadata[billing.MetaKey]], m)
			if m.IdempotencyKey != m.Metadata[billing.MetaKey] {
				add(id, what+" key", "%s: sent with key %q, its metadata says %q", id, m.IdempotencyKey, m.Metadata[billing.MetaKey])
			}
			if m.Amount != w.mo.amounts[id] || m.Currency != simMoveCurrency {
				add(id, "wrong amount", "%s: %s is %d %s, asked for %d %s", id, m.ID, m.Amount, m.Currency, w.mo.amounts[id], simMoveCurrency)
			}
			if _, ok := byKey[m.Metadata[billing.MetaKey]]; !ok {
				add(id, what+" without claim", "%s: no claim has its key", describe([]billingtest.Movement{m}))
			}
		}
	}
	w.mo.mu.Lock()
	done := w.mo.done
	w.mo.mu.Unlock()
	for _, id := range w.mo.order {
		ms := byID[id]
		var live []billingtest.Movement
		for _, m := range ms {
			if !dead(m) {
				live = append(live, m)
			}
		}
		// At most one live transfer and payout of an account's period,
		// exactly one when a call reported it done.
		switch {
		case len(live) > 1:
			add(id, "paid twice", "%s: %d live at Stripe: %s", id, len(live), describe(ms))
		case len(live) == 0 && len(done[id]) > 0:
			add(id, "reported done, none live", "%s: calls reported attempts %v done; Stripe holds %s", id, slices.Sorted(maps.Keys(done[id])), describe(ms))
		case len(live) == 1:
			w.count(id.what+"s live at the end", 1)
		}
		// What a call reported done is at Stripe, and not failed unless
		// the bank returned it after it was paid.
		for a := range done[id] {
			k := w.moveKey(byKey, id, a)
			ms := moveByKey[k]
			switch {
			case len(ms) == 0:
				add(id, "reported done, missing", "%s#%d: a call reported it done, Stripe holds none of its key", id, a)
			case dead(ms[0]) && !returned[ms[0].ID]:
				add(id, "reported done, failed", "%s#%d: a call reported it done, Stripe holds %s", id, a, describe(ms))
			}
		}
	}
	// An attempt after the first only once the one before it failed.
	for _, c := range claims {
		if !simMoveEndpoint(c.Endpoint) {
			continue
		}
		kind, per, _ := strings.Cut(c.Period, " ")
		id := simMoveID{c.Customer, per, kind}
		ms := moveByKey[c.Key]
		if c.Attempt > 1 && len(ms) > 0 {
			var prev *simClaim
			for i := range claims {
				if p := claims[i]; p.Customer == c.Customer && p.Period == c.Period && p.Endpoint == c.Endpoint && p.Scope == c.Scope && p.Attempt == c.Attempt-1 {
					prev = &claims[i]
				}
			}
			switch {
			case prev == nil:
				add(id, "attempt out of turn", "%s#%d is at Stripe (%s), and no claim of attempt %d", id, c.Attempt, describe(ms), c.Attempt-1)
			case prev.State != string(claim.StateFailed) || slices.ContainsFunc(moveByKey[prev.Key], func(m billingtest.Movement) bool { return !dead(m) }):
				add(id, "attempt out of turn", "%s#%d is at Stripe (%s) while attempt %d is %s, Stripe holding %s", id, c.Attempt, describe(ms),
					prev.Attempt, prev.State, describe(moveByKey[prev.Key]))
			}
		}
		// The claims say what Stripe holds.
		switch c.State {
		case string(claim.StateSucceeded):
			if len(ms) != 1 || dead(ms[0]) || ms[0].ID != c.StripeID || (kind == "payout" && ms[0].Status != "paid") {
				add(id, "false success", "claim %s is succeeded as %s; Stripe holds %s", w.keyLabel(c.Key), c.StripeID, describe(ms))
			}
		case string(claim.StateFailed):
			if slices.ContainsFunc(ms, func(m billingtest.Movement) bool { return !dead(m) }) {
				add(id, "live "+kind+" recorded failed", "claim %s is failed; Stripe holds %s", w.keyLabel(c.Key), describe(ms))
			}
		default:
			if !w.heldFor(c.Customer, c.Period) {
				add(id, "unsettled "+kind, "claim %s is %s after settling; Stripe holds %s", w.keyLabel(c.Key), c.State, describe(ms))
			}
		}
	}
	return out
}

// moveKey is the key of id's attempt a: its claim's, in whichever scope.
func (w *simWorld) moveKey(claims map[string]simClaim, id simMoveID, a int) string {
	for k, c := range claims {
		if c.Customer == id.account && c.Period == id.what+" "+id.period && c.Attempt == a {
			return k
		}
	}
	return ""
}
