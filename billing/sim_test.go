package billing_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/internal/testenv"
)

// TestSimulation plays seeded scenarios of several days of virtual time in
// which three runners bill a few customers through crashes, lost answers,
// 5xx storms, 409s, slow answers, clock jumps (between steps and in the
// middle of them), API switches, key rotations and re-bills after declines,
// while other writers act on billonce's objects and claims (see
// sim_others_test.go): a key rotated while a request is held at Stripe, a
// support script's declined charge that copies a claim's metadata, a
// customer completing a declined PaymentIntent on-session, refunds, failed
// claims deleted by hand; Stripe's events then reach a webhook endpoint.
// After each scenario a settle phase finishes the work with clean Billers,
// and the fake Stripe's ledger is checked against the claim table: no
// customer and period paid twice, none left unpaid but for a standing
// decline or a deliberate stop, every payment and every succeeded claim
// accounted for, no claim recording another writer's payment, and no
// reconciliation of the settle phase stopped.
//
// BILLONCE_SIM_SEEDS=N runs seeds 1 to N (20 by default, 200 with
// BILLONCE_LONG=1, 40 of them under -race);
// BILLONCE_SIM_SEED=K runs seed K alone and prints its whole trace. A seed
// makes the same choices on every run; goroutines that act at once may
// interleave differently, so a replay that passes may need -count=10.
// BILLONCE_SIM_FAULTS chooses the other writers' fault types (all by
// default; "none" for the infrastructure faults alone, or a list of names:
// see sim_others_test.go).
func TestSimulation(t *testing.T) {
	t.Parallel()
	simTest(t, simCharges)
}

// simMode is what a scenario's runners bill: charges (or payment intents),
// usage reports to a meter, invoices, charges and refunds of them, or
// charges and money out to connected accounts.
type simMode int

const (
	simCharges simMode = iota
	simUsage
	simInvoices
	simRefunds
	simMoneyOut
)

// simTest plays the seeds of BILLONCE_SIM_SEEDS (or BILLONCE_SIM_SEED) in
// mode and reports what they found.
func simTest(t *testing.T, mode simMode) {
	seeds, single := simSeeds(t)
	faults := simFaultSet(t)
	pool := simPool(t)
	start := time.Now()
	results := make([]simResult, len(seeds))
	sem := make(chan struct{}, max(8, 4*runtime.GOMAXPROCS(0)))
	var wg sync.WaitGroup
	for i, seed := range seeds {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			results[i] = simulate(pool, seed, mode, faults)
		})
	}
	wg.Wait()
	simReport(t, results, time.Since(start), single)
}

func simSeeds(t *testing.T) (seeds []uint64, single bool) {
	t.Helper()
	if v := os.Getenv("BILLONCE_SIM_SEED"); v != "" {
		k, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			t.Fatalf("BILLONCE_SIM_SEED=%q: want a seed number", v)
		}
		return []uint64{k}, true
	}
	n := testenv.Size(20, 200)
	if raceOn {
		n = testenv.Size(20, 40) // the race detector makes each seed several times slower
	}
	if v := os.Getenv("BILLONCE_SIM_SEEDS"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("BILLONCE_SIM_SEEDS=%q: want a positive number of seeds", v)
		}
	}
	for k := 1; k <= n; k++ {
		seeds = append(seeds, uint64(k))
	}
	return seeds, false
}

// simPool returns a pool on a fresh database that all seeds share, each
// with its own claim table.
func simPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 8
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// simResult is what one seed found.
type simResult struct {
	seed       uint64
	violations []simViolation
	harness    []string
	trace      []string
	virtual    time.Duration
	elapsed    time.Duration
	figures    map[string]int // what the scenario did, by name, summed over seeds
}

// simulate plays one seed's scenario, settles it and checks the ledger.
func simulate(pool *pgxpool.Pool, seed uint64, mode simMode, faults map[simFault]bool) (res simResult) {
	res.seed = seed
	start := time.Now()
	plan := newSimPlan(seed)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	w, err := newSimWorld(ctx, pool, plan, mode, faults)
	if err != nil {
		res.harness = append(res.harness, "setting up: "+err.Error())
		return res
	}
	defer w.close()
	defer func() {
		if r := recover(); r != nil {
			w.harnessf("panic: %v\n%s", r, debug.Stack())
		}
		w.drop()
		w.mu.Lock()
		res.trace, res.harness, res.virtual, res.figures = w.trace, w.harness, w.virtual, w.figures
		w.mu.Unlock()
		res.elapsed = time.Since(start)
	}()
	w.play(ctx)
	switch mode {
	case simUsage:
		w.settleUsage(ctx)
		res.violations = w.checkUsage(ctx)
		return res
	case simInvoices:
		w.settleInvoices(ctx)
		res.violations = w.checkInvoices(ctx)
		return res
	case simRefunds:
		w.settleRefunds(ctx)
		res.violations = w.checkRefunds(ctx)
		return res
	case simMoneyOut:
		w.settleMoves(ctx)
		res.violations = w.checkMoves(ctx)
		return res
	}
	w.settle(ctx)
	res.violations = w.check(ctx)
	return res
}

// simReport prints what the seeds found: ledger violations (the library's
// failures) apart from harness errors (the simulation's own).
func simReport(t *testing.T, results []simResult, elapsed time.Duration, single bool) {
	t.Helper()
	var violated, broken []simResult
	byKind := make(map[string][]uint64)
	var shortest, longest time.Duration
	var slowest simResult
	for i, r := range results {
		if i == 0 || r.virtual < shortest {
			shortest = r.virtual
		}
		longest = max(longest, r.virtual)
		if r.elapsed > slowest.elapsed {
			slowest = r
		}
		if len(r.violations) > 0 {
			violated = append(violated, r)
		}
		if len(r.harness) > 0 {
			broken = append(broken, r)
		}
		seen := make(map[string]bool)
		for _, v := range r.violations {
			k := v.group()
			if !seen[k] {
				seen[k] = true
				byKind[k] = append(byKind[k], r.seed)
			}
		}
	}
	t.Logf("%d seeds in %v (each %s to %s of virtual time; slowest: seed %d, %v): %d with ledger violations, %d with harness errors",
		len(results), elapsed.Round(time.Millisecond), simDur(shortest), simDur(longest), slowest.seed,
		slowest.elapsed.Round(time.Millisecond), len(violated), len(broken))
	figures := make(map[string]int)
	for _, r := range results {
		for k, v := range r.figures {
			figures[k] += v
		}
	}
	if len(figures) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(figures)) {
			parts = append(parts, fmt.Sprintf("%s %d", k, figures[k]))
		}
		t.Logf("  over all seeds: %s", strings.Join(parts, ", "))
	}
	for _, k := range slices.Sorted(maps.Keys(byKind)) {
		t.Logf("  %3d seeds: %s: %v", len(byKind[k]), k, byKind[k])
	}
	for i, r := range violated {
		var b strings.Builder
		fmt.Fprintf(&b, "seed %d: LEDGER VIOLATIONS (%d) after %s of virtual time:\n", r.seed, len(r.violations), simDur(r.virtual))
		for j, v := range r.violations {
			if j == 6 && !single {
				fmt.Fprintf(&b, "    … %d more\n", len(r.violations)-j)
				break
			}
			fmt.Fprintf(&b, "    %s\n", v)
		}
		if single || i < 3 {
			fmt.Fprintf(&b, "  trace:\n    %s\n", strings.Join(r.trace, "\n    "))
		}
		fmt.Fprintf(&b, "  replay: %s", simReplay(r.seed, t.Name()))
		t.Error(b.String())
	}
	for _, r := range broken {
		t.Errorf("seed %d: HARNESS ERROR (the simulation itself failed, not the ledger):\n    %s\n  replay: %s",
			r.seed, strings.Join(r.harness, "\n    "), simReplay(r.seed, t.Name()))
	}
	if single && len(violated) == 0 && len(results) == 1 {
		t.Logf("trace of seed %d:\n    %s", results[0].seed, strings.Join(results[0].trace, "\n    "))
	}
}

// simReplay is the command that plays seed again alone, with its trace.
func simReplay(seed uint64, test string) string {
	faults := ""
	if v := os.Getenv(simFaultsVar); v != "" {
		faults = fmt.Sprintf("%s=%q ", simFaultsVar, v)
	}
	return fmt.Sprintf("%sBILLONCE_SIM_SEED=%d go test ./billing -run '%s$' -v", faults, seed, test)
}

// The scenario: a plan drawn from the seed alone, so that a seed makes the
// same choices (steps, crashes, faults, jumps, configurations) on every run;
// only goroutine interleavings vary.

const (
	simRunnerCount = 3
	simMinRounds   = 14
	simMaxRounds   = 30
	simSpan        = 74 * time.Hour // virtual time a scenario spans at least
	simSecondFrom  = 30 * time.Hour // the second period is billed from then on
	simOtherScope  = "sim-other"    // the scope of a second product on the same claim table
	simStepBudget  = time.Minute    // wall time one step may take
)

var simPeriods = []string{"2026-09", "2026-10"}

// simCrash is where a runner dies during a step.
type simCrash int

const (
	simCrashNone         simCrash = iota
	simCrashBeforeClaim           // the claim never commits
	simCrashAfterClaim            // the claim commits, nothing is sent
	simCrashBeforeAnswer          // Stripe commits, the answer is lost with the runner
	simCrashBeforeRecord          // the answer arrives, the runner dies before recording it
)

var simCrashNames = [...]string{"", "before-claim", "after-claim", "before-answer", "before-record"}

type simOpKind int

const (
	simCharge simOpKind = iota + 1
	simRun
	simReconcile
	simRebill // Charge, and on a standing failure Rebill with the next attempt
)

// simOp is one runner's step.
type simOp struct {
	runner      int
	kind        simOpKind
	customer    string
	period      string
	run         []string // a Run's customers
	conc, batch int      // a Run's options
	crash       simCrash
	crashAt     int    // the crash fires on this occurrence of its point in the step
	crashStep   string // if set, only writes of this step (simStep) count for crashes around the answer
}

func (o simOp) String() string {
	var s string
	switch o.kind {
	case simCharge:
		s = fmt.Sprintf("charge %s/%s", o.customer, o.period)
	case simRebill:
		s = fmt.Sprintf("rebill %s/%s", o.customer, o.period)
	case simReconcile:
		s = "reconcile"
	case simRun:
		s = fmt.Sprintf("run %s ×%d %v conc=%d batch=%d", o.period, len(o.run), o.run, o.conc, o.batch)
	}
	if o.crash != simCrashNone {
		s += fmt.Sprintf(" crash=%s#%d", simCrashNames[o.crash], o.crashAt)
		if o.crashStep != "" {
			s += " of " + o.crashStep
		}
	}
	return s
}

// simFaults are the fake's faults during one round.
type simFaults struct {
	seed       int64
	rates      map[billingtest.FaultKind]float64
	storm      int // the first storm create requests of the round answer 500
	slowEvery  int // every slowEvery-th request is held slowDelay
	slowDelay  time.Duration
	inFlightAt int // this request answers 409 idempotency_key_in_use
	// The clock moves by jumpBy during request jumpAt, or right after claim
	// call jumpClaim of the round, while claimed customers wait to be sent.
	jumpAt, jumpClaim int
	jumpBy            time.Duration
}

func (f simFaults) jumps() bool { return f.jumpAt > 0 || f.jumpClaim > 0 }

func (f simFaults) String() string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(f.rates)) {
		parts = append(parts, fmt.Sprintf("%s=%.2f", k, f.rates[k]))
	}
	if f.storm > 0 {
		parts = append(parts, fmt.Sprintf("5xx storm of %d", f.storm))
	}
	if f.slowEvery > 0 {
		parts = append(parts, fmt.Sprintf("every %d slow %v", f.slowEvery, f.slowDelay))
	}
	if f.inFlightAt > 0 {
		parts = append(parts, fmt.Sprintf("409 at request %d", f.inFlightAt))
	}
	if f.jumpAt > 0 {
		parts = append(parts, fmt.Sprintf("clock +%s at request %d", simDur(f.jumpBy), f.jumpAt))
	}
	if f.jumpClaim > 0 {
		parts = append(parts, fmt.Sprintf("clock +%s after claim call %d", simDur(f.jumpBy), f.jumpClaim))
	}
	return strings.Join(parts, ", ")
}

type simEventKind int

const (
	simDeploy  simEventKind = iota + 1 // the configuration new processes get changes
	simStart                           // a runner (re)starts with a configuration
	simDecline                         // a customer's card starts declining
	simHonor                           // the scenario re-bills a declined customer: the card works again
	simStop                            // a customer is no longer billed
	simJoin                            // a new customer is billed from now on
)

type simEvent struct {
	kind     simEventKind
	runner   int
	cfg      simConfig
	customer string
	note     string
}

// simRound is a step of the scenario: time moves, things change, then one to
// three runners act at once.
type simRound struct {
	jump   time.Duration
	events []simEvent
	faults simFaults
	ops    []simOp
}

// simPlan is a whole scenario.
type simPlan struct {
	seed       uint64
	customers  []string
	periods    []string
	prices     map[string]billing.Price
	initial    []simConfig // the runners' first configurations
	rounds     []simRound
	settleJump time.Duration
	final      simConfig // the configuration deployed at the end
	active     []string  // customers still billed at the end
	declined   []string  // customers whose card was made to decline
	rebill     []string  // declined customers the scenario decided to re-bill
	stopped    []string  // customers no longer billed
}

func (p *simPlan) priceOf(_ context.Context, customer, _ string) (billing.Price, error) {
	pr, ok := p.prices[customer]
	if !ok {
		return billing.Price{}, fmt.Errorf("no price for %s", customer)
	}
	return pr, nil
}

// simGen draws a plan.
type simGen struct {
	rng       *rand.Rand
	p         *simPlan
	deployed  simConfig
	cfgs      []simConfig // each runner's current configuration
	up        []bool
	restartAt []int
	virtual   time.Duration
	joinAt    map[string]int // round from which a late customer is billed
	declined  map[string]bool
	rebill    map[string]bool
	honored   map[string]bool
}

func newSimPlan(seed uint64) *simPlan {
	rng := rand.New(rand.NewPCG(seed, 0xb111_0ce5_1a1e))
	p := &simPlan{seed: seed, prices: make(map[string]billing.Price)}
	g := &simGen{rng: rng, p: p, declined: map[string]bool{}, rebill: map[string]bool{}, honored: map[string]bool{},
		joinAt: map[string]int{}}
	n := 6 + rng.IntN(7)
	for i := range n {
		c := fmt.Sprintf("cus_%02d", i)
		cur := "usd"
		if rng.IntN(4) == 0 {
			cur = "eur"
		}
		p.customers = append(p.customers, c)
		p.prices[c] = billing.Price{Amount: 500 + 100*rng.Int64N(40), Currency: cur, PaymentMethod: "pm_card_visa"}
		// Half the customers are there from the start, the others sign up
		// during the scenario, so that there is new work every day.
		if i >= max(3, n/2) {
			g.joinAt[c] = 1 + rng.IntN(simMinRounds-2)
		} else {
			p.active = append(p.active, c)
		}
	}
	p.periods = simPeriods[:1+rng.IntN(len(simPeriods))]
	g.deployed = simConfig{API: g.api(), Margin: g.margin(), Retry: g.retry(), Lease: g.lease()}
	for i := range simRunnerCount {
		cfg := g.deployed
		if i == simRunnerCount-1 && rng.IntN(100) < 15 {
			cfg.Scope = simOtherScope
		}
		p.initial = append(p.initial, cfg)
		g.cfgs = append(g.cfgs, cfg)
		g.up = append(g.up, true)
		g.restartAt = append(g.restartAt, -1)
	}
	for r := 0; r < simMaxRounds && (r < simMinRounds || g.virtual < simSpan); r++ {
		p.rounds = append(p.rounds, g.round(r))
	}
	if g.virtual < simSpan {
		p.rounds[len(p.rounds)-1].jump += simSpan - g.virtual
	}
	p.settleJump = g.between(time.Hour, 6*time.Hour)
	p.final = g.deployed
	p.declined = simSorted(g.declined)
	p.rebill = simSorted(g.rebill)
	return p
}

func (g *simGen) round(r int) simRound {
	rng := g.rng
	var rd simRound
	if r > 0 {
		rd.jump = g.jump()
		g.virtual += rd.jump
	}
	for _, c := range g.p.customers {
		if at, ok := g.joinAt[c]; ok && at == r {
			g.p.active = append(g.p.active, c)
			rd.events = append(rd.events, simEvent{kind: simJoin, customer: c})
		}
	}
	for i := range g.up {
		if !g.up[i] && g.restartAt[i] <= r {
			rd.events = append(rd.events, g.start(i, true))
		}
	}
	if r > 0 && rng.IntN(100) < 25 {
		rd.events = append(rd.events, g.deploy())
	}
	if rng.IntN(100) < 25 {
		up := slices.DeleteFunc(g.upRunners(), func(i int) bool {
			return slices.ContainsFunc(rd.events, func(e simEvent) bool { return e.kind == simStart && e.runner == i })
		})
		if len(up) > 0 {
			rd.events = append(rd.events, g.start(up[rng.IntN(len(up))], false))
		}
	}
	if rng.IntN(100) < 12 {
		var can []string
		for _, c := range g.p.active {
			if !g.declined[c] {
				can = append(can, c)
			}
		}
		if len(can) > 0 {
			c := can[rng.IntN(len(can))]
			g.declined[c] = true
			ev := simEvent{kind: simDecline, customer: c, note: "left declining"}
			if rng.IntN(2) == 0 {
				g.rebill[c] = true
				ev.note = "to be re-billed"
			}
			rd.events = append(rd.events, ev)
		}
	}
	for _, c := range simSorted(g.rebill) {
		if !g.honored[c] && rng.IntN(100) < 20 {
			g.honored[c] = true
			rd.events = append(rd.events, simEvent{kind: simHonor, customer: c})
		}
	}
	if rng.IntN(100) < 4 && len(g.p.active) > 4 {
		c := g.p.active[rng.IntN(len(g.p.active))]
		g.p.active = slices.DeleteFunc(g.p.active, func(s string) bool { return s == c })
		g.p.stopped = append(g.p.stopped, c)
		rd.events = append(rd.events, simEvent{kind: simStop, customer: c})
	}
	rd.faults = g.faults(r)

	up := g.upRunners()
	if len(up) == 0 {
		return rd
	}
	n := 1 + rng.IntN(min(3, len(up)))
	if rd.faults.jumps() {
		// A clock jump in the middle of a step is only fair to a correct
		// Biller when nothing else is sending: a request checked before
		// the jump and sent after it would cross the window through no
		// fault of the library.
		n = 1
	}
	for _, j := range rng.Perm(len(up))[:n] {
		i := up[j]
		op := g.op(i, rd.faults.jumps())
		if op.crash != simCrashNone {
			g.up[i] = false
			g.restartAt[i] = r + 1 + rng.IntN(3)
		}
		rd.ops = append(rd.ops, op)
	}
	return rd
}

func (g *simGen) upRunners() []int {
	var up []int
	for i, ok := range g.up {
		if ok {
			up = append(up, i)
		}
	}
	return up
}

// start (re)starts runner i: with the deployed configuration, or after a
// crash sometimes with the configuration it had (a node left behind by a
// deploy). The last runner sometimes bills under a second scope.
func (g *simGen) start(i int, afterCrash bool) simEvent {
	cfg, note := g.deployed, "deployed config"
	if afterCrash && g.rng.IntN(100) < 30 {
		cfg, note = g.cfgs[i], "its old config"
	} else if i == simRunnerCount-1 && g.rng.IntN(100) < 20 {
		cfg.Scope, note = simOtherScope, "deployed config, second scope"
	}
	if afterCrash {
		note = "back after a crash, " + note
	}
	g.cfgs[i], g.up[i] = cfg, true
	return simEvent{kind: simStart, runner: i, cfg: cfg, note: note}
}

// deploy changes one thing in the deployed configuration.
func (g *simGen) deploy() simEvent {
	c := g.deployed
	var note string
	switch g.rng.IntN(10) {
	case 0, 1, 2:
		from := c.API
		c.API = billing.Charges
		if from == billing.Charges {
			c.API = billing.PaymentIntents
		}
		note = fmt.Sprintf("API %s → %s", from, c.API)
	case 3, 4, 5, 6:
		from := c.Secret
		c.Secret = (c.Secret + 1) % len(simSecrets)
		note = fmt.Sprintf("secret key rotated #%d → #%d", from, c.Secret)
	case 7:
		c.Margin = g.margin()
		note = "window margin changed"
	case 8:
		c.Retry = g.retry()
		note = "retry policy changed"
	default:
		c.Lease = g.lease()
		note = "claim lease changed"
	}
	g.deployed = c
	return simEvent{kind: simDeploy, cfg: c, note: note}
}

func (g *simGen) faults(r int) simFaults {
	rng := g.rng
	f := simFaults{seed: int64(g.p.seed)*1000 + int64(r)}
	prob := func(most float64) float64 { return float64(int(rng.Float64()*most*100)) / 100 }
	if rng.IntN(100) < 50 {
		f.rates = map[billingtest.FaultKind]float64{
			billingtest.FaultCut:         prob(0.15),
			billingtest.FaultErrorBefore: prob(0.10),
			billingtest.FaultErrorAfter:  prob(0.05),
			billingtest.FaultLockTimeout: prob(0.05),
		}
		if rng.IntN(100) < 15 {
			f.rates[billingtest.FaultInFlight] = 0.02
		}
		maps.DeleteFunc(f.rates, func(_ billingtest.FaultKind, p float64) bool { return p == 0 })
	}
	if rng.IntN(100) < 25 {
		f.storm = 2 + rng.IntN(9)
	}
	if rng.IntN(100) < 20 {
		f.slowEvery = 2 + rng.IntN(3)
		f.slowDelay = time.Duration(2+rng.IntN(14)) * time.Millisecond
	}
	if rng.IntN(100) < 8 {
		f.inFlightAt = 1 + rng.IntN(10)
	}
	if rng.IntN(100) < 55 {
		switch {
		case rng.IntN(2) == 0:
			f.jumpClaim = 1 // while the claimed customers wait to be sent
		case f.storm > 0:
			f.jumpAt = 1 + rng.IntN(f.storm) // during the storm's retries
		default:
			f.jumpAt = 1 + rng.IntN(3)
		}
		f.jumpBy = g.midJump()
		g.virtual += f.jumpBy
	}
	return f
}

// op draws a runner's step. A runner alone in its round (a clock jump will
// happen during its step) runs more often, one customer at a time, so that
// the jump may fall while customers wait in its queue.
func (g *simGen) op(runner int, alone bool) simOp {
	rng := g.rng
	periods := g.p.periods
	if g.virtual < simSecondFrom {
		periods = periods[:1]
	}
	op := simOp{runner: runner, period: periods[rng.IntN(len(periods))]}
	runs, charges, reconciles := 40, 65, 80
	if alone {
		runs, charges, reconciles = 55, 70, 85
	}
	switch x := rng.IntN(100); {
	case x < runs:
		op.kind = simRun
		for _, c := range g.p.active {
			if rng.IntN(100) < 70 {
				op.run = append(op.run, c)
			}
		}
		if len(op.run) < 2 {
			op.run = slices.Clone(g.p.active)
		}
		op.conc = 1
		if !alone {
			op.conc = 1 + rng.IntN(4)
		}
		op.batch = 100
		if rng.IntN(100) < 50 {
			op.batch = 1 + rng.IntN(6)
		}
	case x < charges:
		op.kind, op.customer = simCharge, g.p.active[rng.IntN(len(g.p.active))]
	case x < reconciles:
		op.kind = simReconcile
	default:
		var can []string
		for _, c := range simSorted(g.rebill) {
			if slices.Contains(g.p.active, c) {
				can = append(can, c)
			}
		}
		if len(can) == 0 {
			op.kind, op.customer = simCharge, g.p.active[rng.IntN(len(g.p.active))]
		} else {
			op.kind, op.customer = simRebill, can[rng.IntN(len(can))]
		}
	}
	if rng.IntN(100) < 30 {
		// Crashes around Stripe's answer, which leave a key that Stripe
		// knows on a pending claim, twice as often as those around the
		// claim.
		op.crash, op.crashAt = []simCrash{simCrashBeforeClaim, simCrashAfterClaim,
			simCrashBeforeAnswer, simCrashBeforeAnswer, simCrashBeforeRecord, simCrashBeforeRecord}[rng.IntN(6)], 1
		if rng.IntN(100) < 30 {
			op.crashAt = 2
		}
	}
	return op
}

// jump draws the time that passes between two rounds: mostly hours,
// sometimes up to the window margin or across the whole key window.
func (g *simGen) jump() time.Duration {
	switch x := g.rng.IntN(100); {
	case x < 15:
		return 0
	case x < 62:
		return g.between(5*time.Minute, 3*time.Hour)
	case x < 77:
		return g.between(3*time.Hour, 12*time.Hour)
	case x < 89:
		return g.between(20*time.Hour, 23*time.Hour)
	}
	return g.between(23*time.Hour, 26*time.Hour)
}

// midJump draws the time that passes in the middle of a step: a long
// retry storm, a stalled process, a Run's long queue.
func (g *simGen) midJump() time.Duration {
	switch x := g.rng.IntN(100); {
	case x < 35:
		return g.between(30*time.Minute, 3*time.Hour)
	case x < 55:
		return g.between(3*time.Hour, 12*time.Hour)
	}
	return g.between(20*time.Hour, 26*time.Hour)
}

func (g *simGen) between(lo, hi time.Duration) time.Duration {
	return lo + time.Duration(g.rng.Int64N(int64((hi-lo)/time.Minute)+1))*time.Minute
}

func (g *simGen) api() billing.API {
	if g.rng.IntN(2) == 0 {
		return billing.Charges
	}
	return billing.PaymentIntents
}

func (g *simGen) margin() time.Duration {
	// 23h50m is near the largest margin New accepts: the key window less
	// ClockAllowance less the attempt timeout.
	if g.rng.IntN(100) < 60 {
		return 0 // the default
	}
	return []time.Duration{20 * time.Hour, 22 * time.Hour, 23*time.Hour + 30*time.Minute, 23*time.Hour + 50*time.Minute}[g.rng.IntN(4)]
}

func (g *simGen) retry() simRetry {
	return simRetry{
		Attempts:       2 + g.rng.IntN(7),
		MaxInterval:    time.Duration(2+g.rng.IntN(9)) * time.Millisecond,
		AttemptTimeout: time.Duration(250+50*g.rng.IntN(16)) * time.Millisecond,
		MaxElapsed:     time.Duration(2+g.rng.IntN(3)) * time.Second,
	}
}

func (g *simGen) lease() time.Duration {
	return time.Duration(200+100*g.rng.IntN(19)) * time.Millisecond
}

func simSorted(m map[string]bool) []string {
	var out []string
	for k, ok := range m {
		if ok {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// play runs the plan's rounds.
func (w *simWorld) play(ctx context.Context) {
	for i, rd := range w.plan.rounds {
		if ctx.Err() != nil {
			w.harnessf("the scenario ran out of time before round %d", i+1)
			return
		}
		if rd.jump > 0 {
			w.move(ctx, rd.jump, "")
		}
		w.logf("round %d at %s%s", i+1, simAt(w.now()), simIf(rd.jump > 0, " (+"+simDur(rd.jump)+")"))
		for _, ev := range rd.events {
			w.apply(ev)
		}
		if s := rd.faults.String(); s != "" {
			w.logf("  faults: %s", s)
		}
		or := w.others.rounds[i]
		if s := or.String(); s != "" {
			w.logf("  other writers: %s", s)
		}
		w.mu.Lock()
		w.orRound = or
		w.mu.Unlock()
		w.ow.mu.Lock()
		w.ow.snapArmed = w.others.snapshotAt >= 0 && i >= w.others.snapshotAt
		w.ow.mu.Unlock()
		w.dashDone.Store(false)
		if or.hold != "" {
			w.armHold(w.runners[rd.ops[0].runner].proc, or.hold)
		}
		w.arm(rd.faults)
		w.round = i
		for j, op := range rd.ops {
			switch {
			case w.mode == simInvoices && (op.crash == simCrashBeforeAnswer || op.crash == simCrashBeforeRecord):
				// An invoice takes several writes: the crash falls on
				// one of a step, each step as likely.
				steps := []string{"invoice draft", "invoice line", "invoice finalize", "invoice pay"}
				rd.ops[j].crashStep = steps[rand.New(rand.NewPCG(w.plan.seed, uint64(i*simRunnerCount+j))).IntN(len(steps))]
				op = rd.ops[j]
			case w.mode == simRefunds && op.crash != simCrashNone:
				rd.ops[j].crashStep = w.refundCrashStep(i, j)
				op = rd.ops[j]
			case w.mode == simMoneyOut && op.crash != simCrashNone:
				rd.ops[j].crashStep = w.moveCrashStep(i, j)
				op = rd.ops[j]
			}
			r := w.runners[op.runner]
			w.logf("  %c) %s.%d (%s key#%d%s) %s", 'a'+j, r.name, r.life, r.cfg.API, r.cfg.Secret, scopeTag(r.cfg.Scope), op)
		}
		results := make([]string, len(rd.ops))
		var wg sync.WaitGroup
		for j, op := range rd.ops {
			wg.Go(func() { results[j] = w.runOp(ctx, op) })
		}
		wg.Wait()
		if h := w.currentHold(); h != nil {
			if h.sent() {
				results[0] += "; after the key rotation: " + w.rotateAfterHold(ctx, rd.ops[0], h)
			}
			w.mu.Lock()
			w.hold = nil
			w.mu.Unlock()
		}
		w.quiet(0)
		w.disarm()
		if w.mode == simUsage {
			// Stripe processes meter events within minutes, and reports
			// the rejected ones then: before the hours between rounds
			// pass, not after.
			w.srv.AggregateNow()
		}
		w.actOthers(ctx, or)
		switch w.mode {
		case simUsage:
			w.srv.AggregateNow()
		case simRefunds:
			w.endRefundRound(ctx, i)
		case simMoneyOut:
			w.endMoveRound(ctx, i)
		}
		if w.others.hooks {
			w.deliverWebhooks(ctx)
		}
		if rd.faults.jumps() && !w.jumped.Load() {
			// The step never reached the jump (too few requests or
			// claims): the time passes after it, so that a seed always
			// spans the same virtual time.
			w.move(ctx, rd.faults.jumpBy, "after the step")
		}
		for j, r := range results {
			w.logf("  %c) → %s", 'a'+j, r)
		}
		w.notePayments(fmt.Sprintf("round %d", i+1))
	}
}

func (w *simWorld) apply(ev simEvent) {
	switch ev.kind {
	case simDeploy:
		w.logf("  deploy: %s", ev.note)
	case simStart:
		r := w.runners[ev.runner]
		if err := w.boot(r, ev.cfg); err != nil {
			w.harnessf("starting %s: %v", r.name, err)
			return
		}
		w.logf("  start %s.%d (%s): %s", r.name, r.life, ev.note, ev.cfg)
	case simDecline:
		if w.mode == simUsage {
			w.srv.RejectUsage(ev.customer, simRejectCode)
			w.logf("  %s's meter events are rejected from now on (%s)", ev.customer, ev.note)
			return
		}
		w.srv.Decline(ev.customer, "insufficient_funds")
		w.logf("  %s's card declines from now on (%s)", ev.customer, ev.note)
	case simHonor:
		if w.mode == simUsage {
			w.srv.RejectUsage(ev.customer, "")
			w.logf("  %s's meter events count again", ev.customer)
			return
		}
		w.srv.Honor(ev.customer)
		w.logf("  %s's card works again", ev.customer)
	case simStop:
		w.logf("  %s is no longer billed", ev.customer)
	case simJoin:
		w.logf("  %s is billed from now on", ev.customer)
	}
}

// arm sets the fake's faults for a round.
func (w *simWorld) arm(f simFaults) {
	if cut := f.rates[billingtest.FaultCut]; w.mode == simInvoices && cut > 0 {
		// Steps whose connection drops without a byte, besides those
		// whose answer is cut.
		f.rates = maps.Clone(f.rates)
		f.rates[billingtest.FaultDrop] = cut / 2
	}
	random, err := billingtest.RandomFaults(f.seed, f.rates)
	if err != nil {
		w.harnessf("fault rates: %v", err)
	}
	var (
		mu                sync.Mutex
		requests, creates int
	)
	w.jumped.Store(false)
	w.mu.Lock()
	w.faults, w.claimCalls = f, 0
	w.mu.Unlock()
	w.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if simOtherRequest(r.IdempotencyKey) || w.otherInStep(r) {
			// Another writer's request, or the held one landing: as
			// Stripe serves it.
			return billingtest.Fault{}
		}
		create := r.Method == http.MethodPost
		mu.Lock()
		requests++
		n := requests
		if create {
			creates++
		}
		c := creates
		mu.Unlock()
		if n == f.jumpAt && w.jumped.CompareAndSwap(false, true) {
			// Time passes while this request waits, and it fails before
			// Stripe executes it: the next attempt is the one that
			// finds the clock moved.
			what := r.Method + " " + r.Path
			if r.IdempotencyKey != "" {
				what += " " + w.keyLabel(r.IdempotencyKey) + fmt.Sprintf(", request %d with this key", r.Attempt)
			}
			w.quiet(1) // this request only
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			w.move(ctx, f.jumpBy, fmt.Sprintf("during request %d (%s)", n, what))
			cancel()
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		switch {
		case create && c <= f.storm:
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		case n == f.inFlightAt:
			return billingtest.Fault{Kind: billingtest.FaultInFlight}
		case f.slowEvery > 0 && n%f.slowEvery == 0:
			return billingtest.Fault{Kind: billingtest.FaultSlow, Delay: f.slowDelay}
		}
		return random(r)
	})
}

func (w *simWorld) disarm() {
	w.mu.Lock()
	w.faults = simFaults{}
	w.mu.Unlock()
	w.srv.SetScript(nil)
}

// runOp runs one runner's step and describes its outcome.
func (w *simWorld) runOp(ctx context.Context, op simOp) (out string) {
	defer func() {
		if r := recover(); r != nil {
			w.harnessf("panic in step %s: %v\n%s", op, r, debug.Stack())
			out = "panicked"
		}
	}()
	r := w.runners[op.runner]
	p, b := r.proc, r.b
	if p.dead.Load() {
		w.harnessf("%s is down but the plan has it %s", p.name, op)
		return "skipped"
	}
	ctx, cancel := context.WithTimeout(ctx, simStepBudget)
	defer cancel()
	p.arm(op.crash, op.crashAt, op.crashStep, cancel)
	defer p.arm(simCrashNone, 0, "", nil)
	var errs []error
	switch w.mode {
	case simUsage:
		out, errs = w.usageStep(ctx, b, op)
	case simInvoices:
		out, errs = w.invoiceStep(ctx, b, op)
	case simRefunds:
		out, errs = w.refundStep(ctx, b, op)
	case simMoneyOut:
		out, errs = w.moveStep(ctx, b, op)
	default:
		out, errs = w.chargeStep(ctx, b, op)
	}
	crashed, late := p.dead.Load(), ctx.Err() != nil
	if op.crash != simCrashNone && !crashed {
		p.die("at the end of its step (its crash point was not reached)")
	}
	if !crashed {
		if late {
			w.harnessf("%s: %s took longer than %v", p.name, op, simStepBudget)
		}
		for _, err := range errs {
			if errors.Is(err, billing.ErrInvalid) && !w.rowsEdited(err) {
				w.harnessf("%s: %s: %v", p.name, op, err)
			}
		}
	}
	return p.name + ": " + out
}

// chargeStep runs one runner's step of a charge scenario: a charge or a
// run bills, a re-bill bills again with the next attempt a period that
// declined.
func (w *simWorld) chargeStep(ctx context.Context, b *billing.Biller, op simOp) (string, []error) {
	switch op.kind {
	case simRun:
		sum, err := b.Run(ctx, op.period, billing.Customers(op.run...), &billing.RunOptions{Concurrency: op.conc, BatchSize: op.batch})
		return simSummary(sum, err), append(sum.Failures, err)
	case simReconcile:
		sum, err := b.Reconcile(ctx, nil)
		return simSummary(sum, err), append(sum.Failures, err)
	case simRebill:
		rc, err := b.Charge(ctx, op.customer, op.period, nil)
		out := "charge: " + simReceipt(rc, err)
		var fe *billing.ChargeError
		if errors.As(err, &fe) && errors.Is(err, billing.ErrDeclined) {
			rc, err = b.Rebill(ctx, op.customer, op.period, fe.Attempt+1, nil)
			out = fmt.Sprintf("rebill attempt %d: %s", fe.Attempt+1, simReceipt(rc, err))
		}
		return out, []error{err}
	}
	rc, err := b.Charge(ctx, op.customer, op.period, nil)
	return simReceipt(rc, err), []error{err}
}
