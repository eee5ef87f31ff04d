package billing_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/ledger"
	"github.com/billonce/billonce/retry"
)

// The simulation touches the billing and claim APIs only in the functions
// of this first section: building a store, building a Biller from a
// configuration, listing the claims and moving time.

// simNewStore returns a claim store on the scenario's table.
func simNewStore(pool *pgxpool.Pool, table string, lease time.Duration) (claim.Store, error) {
	return claim.NewPostgres(pool, claim.Config{Table: table, Lease: lease})
}

// simMigrate creates the scenario's claim table.
func simMigrate(ctx context.Context, pool *pgxpool.Pool, table string) error {
	s, err := claim.NewPostgres(pool, claim.Config{Table: table})
	if err != nil {
		return err
	}
	return s.Migrate(ctx)
}

// simNewBiller builds a runner's Biller: its configuration, its claim store
// and its HTTP transport, both of which die with the runner.
func simNewBiller(w *simWorld, cfg simConfig, store claim.Store, rt http.RoundTripper, owner string) (*billing.Biller, error) {
	price, invoice := w.plan.priceOf, (func(context.Context, string, string) (billing.Invoice, error))(nil)
	if w.mode == simInvoices {
		price, invoice = nil, w.plan.invoiceOf
	}
	return billing.New(billing.Config{
		SecretKey:    simSecrets[cfg.Secret],
		StripeURL:    w.srv.URL,
		HTTPClient:   &http.Client{Transport: rt},
		Claims:       store,
		Price:        price,
		Invoice:      invoice,
		API:          cfg.API,
		Scope:        cfg.Scope,
		RateLimit:    -1,
		Retry:        cfg.Retry.policy(),
		WindowMargin: cfg.Margin,
		Owner:        owner,
	})
}

// simClaim is one row of the claim table, as the checker and the other
// writers need it.
type simClaim struct {
	Key, Customer, Period string
	Amount                int64
	Currency              string
	State                 string
	StripeID              string
	Endpoint              string
	Scope                 string
	Attempt               int
	Age                   time.Duration // since the claim last changed, on the database clock
}

// simListClaims reads every claim of the table.
func simListClaims(ctx context.Context, pool *pgxpool.Pool, table string) ([]simClaim, error) {
	rows, err := pool.Query(ctx, `SELECT key, customer, period, amount, currency, state, stripe_id, endpoint, scope, attempt,
		(extract(epoch FROM now() - updated_at) * 1000000)::bigint FROM `+
		pgx.Identifier{table}.Sanitize()+" ORDER BY customer, period, created_at, key")
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (simClaim, error) {
		var c simClaim
		var age int64
		err := r.Scan(&c.Key, &c.Customer, &c.Period, &c.Amount, &c.Currency, &c.State, &c.StripeID, &c.Endpoint, &c.Scope, &c.Attempt, &age)
		c.Age = time.Duration(age) * time.Microsecond
		return c, err
	})
}

// simShiftSQL returns one UPDATE per table of the claim store (the table
// itself and any table named after it, table_…) that moves every timestamptz
// column back by $1 microseconds. The columns are read from
// information_schema, so columns added by later migrations move too; a
// usage report's window is its identity, not a reading of the clock, and
// stays.
func simShiftSQL(ctx context.Context, pool *pgxpool.Pool, table string) ([]string, error) {
	rows, err := pool.Query(ctx, `SELECT table_name::text, column_name::text FROM information_schema.columns
		WHERE table_schema = current_schema() AND data_type = 'timestamp with time zone'
			AND column_name NOT IN ('window_start', 'window_end')
			AND (table_name = $1 OR starts_with(table_name, $1 || '_'))
		ORDER BY table_name, ordinal_position`, table)
	if err != nil {
		return nil, err
	}
	type col struct{ Table, Column string }
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[col])
	if err != nil {
		return nil, err
	}
	var out []string
	var sets []string
	for i, c := range cols {
		name := pgx.Identifier{c.Column}.Sanitize()
		sets = append(sets, fmt.Sprintf("%s = %s - $1::bigint * interval '1 microsecond'", name, name))
		if i == len(cols)-1 || cols[i+1].Table != c.Table {
			out = append(out, "UPDATE "+pgx.Identifier{c.Table}.Sanitize()+" SET "+strings.Join(sets, ", "))
			sets = nil
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no timestamptz column found for table %s", table)
	}
	return out, nil
}

// simShiftExec runs one statement of simShiftSQL. It updates every row of
// its table, in the table's order, while the runners lock rows in theirs:
// PostgreSQL may end either side of a deadlock. When it ends this one, the
// statement was rolled back whole and runs again; the runners' side is
// theirs to handle, as in production.
func simShiftExec(ctx context.Context, pool *pgxpool.Pool, stmt string, us int64) error {
	for try := 1; ; try++ {
		_, err := pool.Exec(ctx, stmt, us)
		var pgErr *pgconn.PgError
		if err == nil || try == 10 || !errors.As(err, &pgErr) || (pgErr.Code != "40P01" && pgErr.Code != "40001") {
			return err
		}
	}
}

// move moves virtual time forward by d on both clocks: the claim table's
// ages (every timestamp moves back, the database's now() stays) and the
// fake Stripe's clock. The database moves first, so that in between billonce
// sees claims older, never younger, than Stripe sees their keys. The columns
// are read again after every start of a runner, which may migrate.
func (w *simWorld) move(ctx context.Context, d time.Duration, why string) {
	w.clock.Lock()
	defer w.clock.Unlock()
	if w.shift == nil {
		var err error
		if w.shift, err = simShiftSQL(ctx, w.pool, w.table); err != nil {
			w.harnessf("moving time: %v", err)
			return
		}
	}
	for _, s := range w.shift {
		if err := simShiftExec(ctx, w.pool, s, d.Microseconds()); err != nil {
			w.harnessf("moving time: %v", err)
			return
		}
	}
	w.srv.Advance(d)
	w.mu.Lock()
	w.virtual += d
	w.mu.Unlock()
	if d >= 20*time.Hour {
		w.count("clock jumps of 20h or more", 1)
	}
	if why != "" {
		w.logf("! clock +%s %s (now %s)", simDur(d), why, simAt(w.now()))
	}
}

// Runner configurations.

// simSecrets are the Stripe keys the runners rotate through. The fake
// accepts any key and scopes idempotency keys per API key, as Stripe may.
var simSecrets = []string{
	"sk_test_simulationKeyAAAAAAAAAAAAAAAAAA0001",
	"sk_test_simulationKeyBBBBBBBBBBBBBBBBBB0002",
	"sk_test_simulationKeyCCCCCCCCCCCCCCCCCC0003",
}

// simConfig is a runner's configuration.
type simConfig struct {
	API    billing.API
	Secret int           // index into simSecrets
	Scope  string        // "" for the default scope
	Margin time.Duration // 0 for the default window margin
	Retry  simRetry
	Lease  time.Duration // the claim lease, wall time
}

func (c simConfig) String() string {
	scope := c.Scope
	if scope == "" {
		scope = billing.DefaultScope
	}
	margin := c.Margin
	if margin == 0 {
		margin = billing.DefaultWindowMargin
	}
	return fmt.Sprintf("%s key#%d scope=%s margin=%s retry=%s lease=%v", c.API, c.Secret, scope, simDur(margin), c.Retry, c.Lease)
}

// where says where a configuration's keys go: an endpoint, a credential and
// a key space.
func (c simConfig) where() string { return fmt.Sprintf("%s key#%d scope=%q", c.API, c.Secret, c.Scope) }

func scopeTag(scope string) string {
	if scope == "" {
		return ""
	}
	return "@" + scope
}

// simRetry is a retry policy with tiny waits.
type simRetry struct {
	Attempts       int
	MaxInterval    time.Duration
	AttemptTimeout time.Duration
	MaxElapsed     time.Duration
}

func (r simRetry) String() string {
	return fmt.Sprintf("%dx/%v", r.Attempts, r.AttemptTimeout)
}

func (r simRetry) policy() retry.Policy {
	return retry.Policy{
		InitialInterval: time.Millisecond,
		MaxInterval:     r.MaxInterval,
		MaxAttempts:     r.Attempts,
		AttemptTimeout:  r.AttemptTimeout,
		MaxElapsed:      r.MaxElapsed,
	}
}

// The world.

// simWorld is one scenario's world: a fake Stripe, the claim table, the
// runners, virtual time and the trace.
type simWorld struct {
	plan      *simPlan
	mode      simMode
	others    *simOthers
	ow        simOtherState
	hooks     simHooks     // when others.hooks
	usageBase time.Time    // mode simUsage: the start of the first window, on the wall clock
	oldBase   time.Time    // mode simUsage: the start of the window from 34 days ago, on the wall clock
	rf        *simRefunder // mode simRefunds: the refunds asked for, and what their calls reported
	mo        *simMover    // mode simMoneyOut: the connected accounts, and what the calls reported
	pool      *pgxpool.Pool
	table     string
	srv       *billingtest.Server
	base      *http.Transport
	t0        time.Time // the fake's clock when the scenario starts

	// Set by the goroutine that plays the scenario only, before the
	// round's steps start.
	round int // the round being played, from 0

	// Used by the goroutine that plays the scenario only.
	runners   []*simRunner
	doubles   map[[2]string]bool // customers and periods already seen paid twice
	cleanRuns int

	clock    sync.Mutex    // serialises moves of time and guards shift
	shift    []string      // the statements that move the claim table's time
	jumped   atomic.Bool   // the round's clock jump has happened
	inflight atomic.Int64  // exchanges with the fake under way
	dashDone atomic.Bool   // the round's dashboard item is added
	closing  chan struct{} // closed when the world closes: nothing is held any more
	closed   sync.Once

	mu         sync.Mutex    // guards the fields below
	faults     simFaults     // the round's
	orRound    simOtherRound // the round's other writers
	hold       *simHold      // the round's held write
	settleErrs []string      // reconciliations of the settle phase that stopped
	claimCalls int           // claim calls in the round
	virtual    time.Duration
	trace      []string
	harness    []string
	labels     map[string]string // idempotency key → "cus_03/2026-09#1"
	configs    []simConfig       // distinct places keys were sent from, in order of first use
	madeIn     []string          // per payment (by index): the step that created it
	figures    map[string]int    // see simResult
}

// count adds n to the figure name.
func (w *simWorld) count(name string, n int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.figures == nil {
		w.figures = make(map[string]int)
	}
	w.figures[name] += n
}

func newSimWorld(ctx context.Context, pool *pgxpool.Pool, plan *simPlan, mode simMode, faults map[simFault]bool) (*simWorld, error) {
	w := &simWorld{
		plan:    plan,
		mode:    mode,
		others:  newSimOthers(plan, mode, faults),
		pool:    pool,
		table:   fmt.Sprintf("sim_%d", plan.seed),
		labels:  make(map[string]string),
		doubles: make(map[[2]string]bool),
		closing: make(chan struct{}),
	}
	w.ow.init()
	w.srv = billingtest.NewServer(billingtest.Config{})
	w.base = http.DefaultTransport.(*http.Transport).Clone()
	w.base.MaxIdleConnsPerHost = 16
	w.t0 = w.srv.Now()
	switch mode {
	case simUsage:
		w.usageWorld()
	case simRefunds:
		w.refundWorld()
	case simMoneyOut:
		w.moveWorld()
	}
	if _, err := pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{w.table}.Sanitize()); err != nil {
		w.close()
		return nil, err
	}
	if err := simMigrate(ctx, pool, w.table); err != nil {
		w.close()
		return nil, err
	}
	for i, cfg := range plan.initial {
		r := &simRunner{name: fmt.Sprintf("r%d", i+1)}
		w.runners = append(w.runners, r)
		if err := w.boot(r, cfg); err != nil {
			w.close()
			return nil, err
		}
	}
	return w, nil
}

func (w *simWorld) close() {
	w.closed.Do(func() { close(w.closing) })
	w.srv.Close()
	w.base.CloseIdleConnections()
}

// drop removes the scenario's tables, so that many seeds keep the shared
// database small.
func (w *simWorld) drop() {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rows, err := w.pool.Query(ctx, `SELECT table_name::text FROM information_schema.tables
		WHERE table_schema = current_schema() AND (table_name = $1 OR starts_with(table_name, $1 || '_'))`, w.table)
	if err == nil {
		var tables []string
		if tables, err = pgx.CollectRows(rows, pgx.RowTo[string]); err == nil {
			for _, t := range tables {
				if _, err = w.pool.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier{t}.Sanitize()+" CASCADE"); err != nil {
					break
				}
			}
		}
	}
	if err != nil {
		w.harnessf("dropping the scenario's tables: %v", err)
	}
}

// simRunner is one of the scenario's billing processes; a restart gives it
// a new incarnation with a new Biller and owner.
type simRunner struct {
	name string
	life int
	cfg  simConfig
	proc *simProc
	b    *billing.Biller
}

// boot starts a new incarnation of r with cfg; the previous one, idle
// between steps, is retired.
func (w *simWorld) boot(r *simRunner, cfg simConfig) error {
	if r.proc != nil {
		r.proc.die("")
	}
	r.life++
	p, b, err := w.process(fmt.Sprintf("%s.%d", r.name, r.life), cfg)
	if err != nil {
		return err
	}
	r.cfg, r.proc, r.b = cfg, p, b
	w.clock.Lock()
	w.shift = nil
	w.clock.Unlock()
	return nil
}

// process builds a Biller whose store and transport die with the returned
// process.
func (w *simWorld) process(name string, cfg simConfig) (*simProc, *billing.Biller, error) {
	p := &simProc{w: w, name: name}
	store, err := simNewStore(w.pool, w.table, cfg.Lease)
	if err != nil {
		return nil, nil, err
	}
	b, err := simNewBiller(w, cfg, &simStore{Store: store, p: p, inner: engineOf(store)}, &simTransport{p: p, base: w.base, srv: w.srv}, "sim-"+name)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", cfg, err)
	}
	w.learn(cfg, b)
	return p, b, nil
}

// learn notes where cfg sends keys and names the keys of its scope.
func (w *simWorld) learn(cfg simConfig, b *billing.Biller) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !slices.ContainsFunc(w.configs, func(c simConfig) bool { return c.where() == cfg.where() }) {
		w.configs = append(w.configs, cfg)
	}
	if w.mo != nil {
		w.mo.label(w.labels, cfg.Scope)
	}
	for _, c := range w.plan.customers {
		for _, p := range w.plan.periods {
			for a := 1; a <= 6; a++ {
				if k, err := b.Key(c, p, a); err == nil {
					w.labels[k.String()] = fmt.Sprintf("%s/%s#%d%s", c, p, a, scopeTag(cfg.Scope))
					if w.rf != nil {
						w.rf.label(w.labels, cfg.Scope, k, c, p, a)
					}
				}
			}
		}
	}
}

// keyLabel names an idempotency key by the charge it stands for.
func (w *simWorld) keyLabel(key string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	if l, ok := w.labels[key]; ok {
		return l
	}
	if len(key) > 12 {
		return key[:12] + "…"
	}
	return key
}

func (w *simWorld) now() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.virtual
}

func (w *simWorld) logf(format string, args ...any) {
	line := fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.trace = append(w.trace, line)
	w.mu.Unlock()
}

func (w *simWorld) harnessf(format string, args ...any) {
	msg := fmt.Sprintf(format, args...)
	w.mu.Lock()
	w.harness = append(w.harness, msg)
	w.trace = append(w.trace, "HARNESS ERROR: "+msg)
	w.mu.Unlock()
}

// claimed counts a claim call of the round and moves the clock when the
// round's jump is due after it: time passes while claimed customers wait.
func (w *simWorld) claimed(what string) {
	w.mu.Lock()
	w.claimCalls++
	due := w.faults.jumpClaim == w.claimCalls
	by := w.faults.jumpBy
	w.mu.Unlock()
	if due && w.jumped.CompareAndSwap(false, true) {
		w.count("clock jumps after a claim call", 1)
		w.quiet(0)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		w.move(ctx, by, "after claiming "+what)
	}
}

// quiet waits until at most n exchanges with the fake are under way.
func (w *simWorld) quiet(n int64) {
	for deadline := time.Now().Add(10 * time.Second); w.inflight.Load() > n; {
		if time.Now().After(deadline) {
			w.harnessf("%d requests to the fake still under way after 10s", w.inflight.Load())
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// notePayments attributes the payments made since the last call to step,
// and traces any customer and period that now has a second live payment.
func (w *simWorld) notePayments(step string) {
	pays := w.srv.Payments()
	w.mu.Lock()
	for len(w.madeIn) < len(pays) {
		w.madeIn = append(w.madeIn, step)
	}
	w.mu.Unlock()
	live := make(map[[2]string][]string)
	for _, p := range pays {
		if p.Paid {
			cp := [2]string{p.Customer, p.Period}
			live[cp] = append(live[cp], p.ID)
		}
	}
	for _, cp := range simSortedKeys(live) {
		if ids := live[cp]; len(ids) > 1 && !w.doubles[cp] {
			w.doubles[cp] = true
			w.logf("  LEDGER: %s/%s now has %d live payments %v", cp[0], cp[1], len(ids), ids)
		}
	}
}

// Crashes: a runner's process, its claim store and its transport.

// errSimCrashed is what a dead runner's store and transport answer.
var errSimCrashed = errors.New("simulated crash: the runner is dead")

// simProc is one incarnation of a runner: the process that a crash kills.
// Once dead, its claim store and its transport fail every call, so the
// Biller, which keeps running, can no longer release or record anything.
type simProc struct {
	w    *simWorld
	name string
	dead atomic.Bool

	mu      sync.Mutex
	point   simCrash // armed crash point of the current operation
	step    string   // the step whose writes count for it, or "" for any create
	at      int      // the point fires on this occurrence
	claims  int      // Claim and ClaimBatch calls in the operation
	creates int      // create requests in the operation
	cancel  context.CancelFunc
}

// arm sets the crash point of the next operation, run under cancel.
func (p *simProc) arm(point simCrash, at int, step string, cancel context.CancelFunc) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.point, p.at, p.step, p.claims, p.creates, p.cancel = point, at, step, 0, 0, cancel
}

// next counts one claim call, or one create request, of the operation and
// returns its number.
func (p *simProc) next(create bool) (n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if create {
		p.creates++
		return p.creates
	}
	p.claims++
	return p.claims
}

// counts reports whether a write of step counts for the armed crash point.
func (p *simProc) counts(step string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.step == "" || p.step == step
}

// fires reports whether the armed crash point is point, on occurrence n.
func (p *simProc) fires(point simCrash, n int) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.point == point && p.at == n
}

// die kills the process: from now on its store and transport fail.
func (p *simProc) die(how string) {
	if !p.dead.CompareAndSwap(false, true) {
		return
	}
	if how != "" {
		p.w.logf("! %s crashed %s", p.name, how)
		p.w.count("crashes", 1)
	}
	p.mu.Lock()
	cancel := p.cancel
	p.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}

// simStore is a runner's claim store: it fails once the runner is dead and
// kills the runner at the claim crash points. It must be an engine itself,
// every method of it: billing takes a store that is not for the claim.Store
// it embeds, and drives that store's engine directly, past every crash.
type simStore struct {
	claim.Store // the store's own, for Config.Claims
	p           *simProc
	inner       claimEngine
}

var _ claimEngine = (*simStore)(nil)

func (s *simStore) alive() error {
	if s.p.dead.Load() {
		return errSimCrashed
	}
	return nil
}

// claimed runs one claim call of step (simStep: "refund" for a refund's
// claim, "" for any other) under the claim crash points, which count the
// claim calls of the operation's crash step alone when it has one.
func (s *simStore) claimed(what, step string, call func() error) error {
	if err := s.alive(); err != nil {
		return err
	}
	if !s.p.counts(step) {
		err := call()
		s.p.w.claimed(what)
		return err
	}
	n := s.p.next(false)
	if s.p.fires(simCrashBeforeClaim, n) {
		s.p.w.count("crashes before a claim", 1)
		s.p.die("before claiming " + what)
		return errSimCrashed
	}
	err := call()
	s.p.w.claimed(what)
	if s.p.fires(simCrashAfterClaim, n) {
		s.p.w.count("crashes after a claim", 1)
		s.p.die("after claiming " + what + ", before sending")
		return errSimCrashed
	}
	return err
}

func (s *simStore) Claim(ctx context.Context, req claimengine.Request) (claimResult, error) {
	var res claimResult
	step := ""
	switch {
	case req.RefundOf != "":
		step = "refund"
	case req.Endpoint == "transfers" || req.Endpoint == "payouts":
		step = strings.TrimSuffix(req.Endpoint, "s")
	}
	err := s.claimed(s.p.w.keyLabel(req.Key), step, func() (err error) {
		res, err = s.inner.Claim(ctx, req)
		s.noteResumed(res)
		if err == nil {
			s.p.w.snapshotIfDue(ctx, req, res)
		}
		return err
	})
	if errors.Is(err, errSimCrashed) {
		return claimResult{}, err
	}
	return res, err
}

func (s *simStore) ClaimBatch(ctx context.Context, reqs []claimengine.Request) ([]claimResult, error) {
	var res []claimResult
	err := s.claimed(fmt.Sprintf("a batch of %d", len(reqs)), "", func() (err error) {
		res, err = s.inner.ClaimBatch(ctx, reqs)
		s.noteResumed(res...)
		return err
	})
	if errors.Is(err, errSimCrashed) {
		return nil, err
	}
	return res, err
}

// noteResumed traces the pending claims a runner takes over, with their age.
func (s *simStore) noteResumed(res ...claimResult) {
	for _, r := range res {
		if r.Outcome == claimengine.Resumed {
			s.p.w.logf("  ~ %s resumes %s, claimed %s ago", s.p.name, s.p.w.keyLabel(r.Claim.Key), simDur(r.Claim.Age))
		}
	}
}

func (s *simStore) Renew(ctx context.Context, key, owner string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Renew(ctx, key, owner)
}

func (s *simStore) Succeed(ctx context.Context, key, stripeID string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Succeed(ctx, key, stripeID)
}

func (s *simStore) Fail(ctx context.Context, key, stripeID, reason string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Fail(ctx, key, stripeID, reason)
}

func (s *simStore) Release(ctx context.Context, key, owner, stripeID, lastErr string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Release(ctx, key, owner, stripeID, lastErr)
}

func (s *simStore) ReleaseUnsent(ctx context.Context, key, owner, lastErr string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.ReleaseUnsent(ctx, key, owner, lastErr)
}

func (s *simStore) Get(ctx context.Context, key string) (claim.Claim, error) {
	if err := s.alive(); err != nil {
		return claim.Claim{}, err
	}
	return s.inner.Get(ctx, key)
}

func (s *simStore) Period(ctx context.Context, customer, period string) ([]claim.Claim, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return s.inner.Period(ctx, customer, period)
}

func (s *simStore) Stale(ctx context.Context, scope string) ([]claim.Claim, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return s.inner.Stale(ctx, scope)
}

func (s *simStore) CheckSend(ctx context.Context, key, owner string, window time.Duration) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.CheckSend(ctx, key, owner, window)
}

func (s *simStore) Reopen(ctx context.Context, key, owner, endpoint, credential string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Reopen(ctx, key, owner, endpoint, credential)
}

func (s *simStore) Advance(ctx context.Context, key, owner, stripeID, step string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Advance(ctx, key, owner, stripeID, step)
}

func (s *simStore) Abandon(ctx context.Context, key, owner string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Abandon(ctx, key, owner)
}

// CheckSendSucceed lets runs check and record in shared round trips, as
// they do over claim.Postgres; a dead runner's round trip fails whole.
func (s *simStore) CheckSendSucceed(ctx context.Context, window time.Duration, checks []claimengine.SendCheck, done []claimengine.Success) (checkErrs, doneErrs []error) {
	if err := s.alive(); err != nil {
		checkErrs, doneErrs = make([]error, len(checks)), make([]error, len(done))
		for i := range checkErrs {
			checkErrs[i] = err
		}
		for i := range doneErrs {
			doneErrs[i] = err
		}
		return checkErrs, doneErrs
	}
	return s.inner.(claimengine.Batcher).CheckSendSucceed(ctx, window, checks, done)
}

// simCreate reports whether a POST to path creates what is billed or
// refunded, or takes a step of an invoice: the crash points around
// Stripe's answer fire on them.
func simCreate(path string) bool {
	switch path {
	case "/v1/charges", "/v1/payment_intents", meterEvents, "/v1/invoices", "/v1/invoiceitems", "/v1/refunds", "/v1/transfers", "/v1/payouts":
		return true
	}
	return strings.HasPrefix(path, "/v1/invoices/") && (strings.HasSuffix(path, "/finalize") || strings.HasSuffix(path, "/pay"))
}

// simStep names the write a create request makes.
func simStep(path string) string {
	switch {
	case path == "/v1/invoices":
		return "invoice draft"
	case path == "/v1/invoiceitems":
		return "invoice line"
	case strings.HasPrefix(path, "/v1/invoices/"):
		return "invoice " + path[strings.LastIndexByte(path, '/')+1:]
	case path == meterEvents:
		return "meter event"
	}
	return strings.TrimSuffix(strings.TrimPrefix(path, "/v1/"), "s")
}

// simTransport is a runner's HTTP transport: it fails once the runner is
// dead and kills the runner at the crash points around Stripe's answer.
type simTransport struct {
	p    *simProc
	base http.RoundTripper
	srv  *billingtest.Server
}

func (t *simTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	if t.p.dead.Load() {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, errSimCrashed
	}
	if req.Method != http.MethodPost || !simCreate(req.URL.Path) {
		return t.send(req)
	}
	t.p.w.landBefore(t.p)
	if h := t.p.w.holdFor(t.p, simStep(req.URL.Path)); h != nil {
		return t.hold(req, h)
	}
	key := req.Header.Get("Idempotency-Key")
	if !t.p.counts(simStep(req.URL.Path)) {
		return t.send(req)
	}
	n := t.p.next(true)
	switch {
	case t.p.fires(simCrashBeforeAnswer, n):
		// Stripe commits, the connection is cut, and the runner dies
		// before it could have read any answer.
		t.srv.FailNext(billingtest.Match{Method: http.MethodPost, Path: req.URL.Path, IdempotencyKey: key},
			billingtest.Fault{Kind: billingtest.FaultCut})
		resp, err := t.send(req)
		t.p.w.count("crashes at "+simStep(req.URL.Path), 1)
		t.p.die("after Stripe committed " + t.p.w.keyLabel(key) + " (" + simStep(req.URL.Path) + "), before the answer")
		if err == nil {
			resp.Body.Close()
		}
		return nil, errSimCrashed
	case t.p.fires(simCrashBeforeRecord, n):
		resp, err := t.send(req)
		status := "no answer"
		if err == nil {
			status = resp.Status
		}
		t.p.w.count("crashes at "+simStep(req.URL.Path), 1)
		t.p.die(fmt.Sprintf("after Stripe answered %s (%s, %s), before recording", t.p.w.keyLabel(key), simStep(req.URL.Path), status))
		return resp, err
	}
	return t.send(req)
}

// send makes one exchange with the fake. The exchange runs to its end even
// when the caller stops waiting (an attempt's timeout, a cancelled step), as
// a request already on the wire does, and the world counts it until then:
// time only jumps when no request is between a runner and the fake.
func (t *simTransport) send(req *http.Request) (*http.Response, error) {
	type answer struct {
		resp *http.Response
		err  error
	}
	done := make(chan answer, 1)
	t.p.w.inflight.Add(1)
	go func() {
		defer t.p.w.inflight.Add(-1)
		resp, err := t.base.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
		done <- answer{resp, err}
	}()
	select {
	case a := <-done:
		return a.resp, a.err
	case <-req.Context().Done():
		go func() {
			if a := <-done; a.err == nil {
				io.Copy(io.Discard, a.resp.Body)
				a.resp.Body.Close()
			}
		}()
		return nil, req.Context().Err()
	}
}

// The settle phase and the checker.

// simCleanRetry is the retry policy of the settle phase's Billers.
var simCleanRetry = simRetry{Attempts: 6, MaxInterval: 5 * time.Millisecond, AttemptTimeout: 2 * time.Second, MaxElapsed: 10 * time.Second}

// clean returns a Biller that never crashes, configured as cfg.
func (w *simWorld) clean(cfg simConfig) *billing.Biller {
	w.cleanRuns++
	cfg.Retry = simCleanRetry
	_, b, err := w.process(fmt.Sprintf("settle.%d", w.cleanRuns), cfg)
	if err != nil {
		w.harnessf("settle Biller: %v", err)
		return nil
	}
	return b
}

// settle ends a scenario: faults off, declines lifted for the customers the
// scenario decided to re-bill, time moved on, then clean Billers finish the
// work: the final configuration reconciles and bills everyone; a day later
// every configuration used reconciles what it left, and the final one bills
// everyone again.
func (w *simWorld) settle(ctx context.Context) {
	plan := w.plan
	w.logf("settle at %s with %s", simAt(w.now()), plan.final)
	w.srv.SetScript(nil)
	for _, c := range plan.rebill {
		w.srv.Honor(c)
	}
	w.quiet(0)
	w.move(ctx, plan.settleJump, "before settling")
	w.settleHooks(ctx)
	w.settleWith(ctx, w.clean(plan.final), "final config")
	w.notePayments("settle (final config)")
	w.quiet(0)
	w.move(ctx, 25*time.Hour, "past every key window")
	w.settleHooks(ctx)
	w.reconcileEach(ctx)
	w.notePayments("settle (each config reconciles)")
	w.settleHooks(ctx)
	w.settleWith(ctx, w.clean(plan.final), "final config, a day later")
	w.settleHooks(ctx)
	w.notePayments("settle (final config, a day later)")
}

// settleHooks delivers the events of a charge scenario that has a webhook
// endpoint.
func (w *simWorld) settleHooks(ctx context.Context) {
	if w.others.hooks {
		w.deliverWebhooks(ctx)
	}
}

// settleReconciled traces a Reconcile of the settle phase. With faults off
// and clean Billers nothing stops it: one that stopped is noted for the
// checker, since no claim after the one that stopped it was settled.
func (w *simWorld) settleReconciled(what string, sum billing.Summary, err error) {
	w.logf("  %s: %s", what, simSummary(sum, err))
	w.noteHeld(sum.Failures...)
	if err != nil {
		msg := err.Error()
		if len(msg) > 400 {
			msg = msg[:400] + "…"
		}
		w.mu.Lock()
		w.settleErrs = append(w.settleErrs, what+": "+msg)
		w.mu.Unlock()
	}
}

// settleViolations are the settle phase's stopped reconciliations.
func (w *simWorld) settleViolations() []simViolation {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []simViolation
	for _, e := range w.settleErrs {
		out = append(out, simViolation{Kind: "reconcile stopped", Detail: e})
	}
	return out
}

func (w *simWorld) settleWith(ctx context.Context, b *billing.Biller, what string) {
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
	for _, c := range w.plan.rebill {
		if !slices.Contains(w.plan.active, c) {
			continue
		}
		for _, p := range w.plan.periods {
			b := b
			for range 3 {
				_, err := b.Charge(ctx, c, p, nil)
				w.noteHeld(err)
				if other, ok := simDeclinedUnder(err); ok {
					// Declined under another scope: the person re-bills it
					// from that scope's Biller, as the error says.
					if b = w.cleanIn(other); b == nil {
						break
					}
					w.logf("  %s: %s/%s was declined under scope %q: re-billed from there", what, c, p, other)
					_, err = b.Charge(ctx, c, p, nil)
					w.noteHeld(err)
				}
				var fe *billing.ChargeError
				if !(errors.As(err, &fe) && errors.Is(err, billing.ErrDeclined)) {
					break
				}
				r, err := b.Rebill(ctx, c, p, fe.Attempt+1, nil)
				w.logf("  %s: rebill %s/%s attempt %d: %s", what, c, p, fe.Attempt+1, simReceipt(r, err))
				w.noteHeld(err)
				if err == nil {
					break
				}
			}
		}
	}
}

// cleanIn is a clean Biller of the final configuration in scope, the
// Biller a person re-bills a period with that the claim store says failed
// under scope (see simDeclinedUnder).
func (w *simWorld) cleanIn(scope string) *billing.Biller {
	cfg := w.plan.final
	cfg.Scope = scope
	if cfg.Scope == billing.DefaultScope {
		cfg.Scope = ""
	}
	return w.clean(cfg)
}

// simDeclinedUnder reports the scope named by err when err is the claim
// store's refusal of a period that failed under another scope.
func simDeclinedUnder(err error) (string, bool) {
	var m *claim.MismatchError
	if errors.As(err, &m) && m.Field == "scope" && m.Existing.State == claim.StateFailed {
		return m.Have, true
	}
	return "", false
}

// simViolation is one broken rule of the ledger.
type simViolation struct {
	Kind   string // "double charge", "missing", "unrecorded payment", "payment without claim", "false success"
	Class  string // for a double charge: what kind of resend made it
	Cause  string // what other writers did to the customer's period, if anything
	Detail string
}

// group is how simReport counts the violation's seeds.
func (v simViolation) group() string {
	k := v.Kind
	if v.Class != "" {
		k += " [" + v.Class + "]"
	}
	if v.Cause != "" {
		k += " {after: " + v.Cause + "}"
	}
	return k
}

func (v simViolation) String() string { return v.group() + ": " + v.Detail }

// claimsByPeriod lists the claim table, and its claims by customer and
// period; ok is false when the listing failed (a harness error, logged).
func (w *simWorld) claimsByPeriod(ctx context.Context) (claims []simClaim, byPeriod map[[2]string][]simClaim, ok bool) {
	claims, err := simListClaims(ctx, w.pool, w.table)
	if err != nil {
		w.harnessf("listing claims: %v", err)
		return nil, nil, false
	}
	byPeriod = make(map[[2]string][]simClaim)
	for _, c := range claims {
		cp := [2]string{c.Customer, c.Period}
		byPeriod[cp] = append(byPeriod[cp], c)
	}
	return claims, byPeriod, true
}

// check compares the fake's ledger with the claim table after settling.
func (w *simWorld) check(ctx context.Context) []simViolation {
	claims, byPeriod, ok := w.claimsByPeriod(ctx)
	if !ok {
		return nil
	}
	pays := w.srv.Payments()
	out := w.settleViolations()
	add := func(cust, per, kind, class, format string, args ...any) {
		out = append(out, simViolation{Kind: kind, Class: class, Cause: w.cause(cust, per), Detail: fmt.Sprintf(format, args...)})
	}
	byKey := make(map[string]simClaim, len(claims))
	for _, c := range claims {
		byKey[c.Key] = c
	}
	payByID := make(map[string]billingtest.Payment, len(pays))
	lp := make([]ledger.Payment, len(pays))
	for i, p := range pays {
		// Another writer's payments are not billonce's, whatever their
		// metadata says.
		lp[i] = ledger.Payment{Customer: p.Customer, Period: p.Period, Paid: p.Paid && !w.is(w.ow.foreign, p.ID)}
	}
	want := map[ledger.Slot]bool{}
	for _, cust := range w.plan.customers {
		for _, per := range w.plan.periods {
			if !slices.Contains(w.plan.stopped, cust) {
				want[ledger.Slot{Customer: cust, Period: per}] = true
			}
		}
	}
	verdict := ledger.Check(lp, want)
	live := make(map[[2]string][]int) // indexes into pays
	for s, idx := range verdict.Paid {
		live[[2]string{s.Customer, s.Period}] = idx
	}
	for i, p := range pays {
		payByID[p.ID] = p
		switch _, ok := byKey[simPayKey(p)]; {
		case ok, w.is(w.ow.foreign, p.ID):
		case !p.Paid && w.is(w.ow.deleted, simPayKey(p)):
			// A person deleted the claim of this declined payment.
		default:
			add(p.Customer, p.Period, "payment without claim", "", "%s", w.describePayment(i, p))
		}
	}
	for _, c := range claims {
		if c.StripeID != "" && w.is(w.ow.foreign, c.StripeID) {
			add(c.Customer, c.Period, "another writer's payment recorded", "", "claim %s is %s as %s, a payment billonce did not make", w.keyLabel(c.Key), c.State, c.StripeID)
		}
	}

	// No customer and period with two live payments; a single live payment
	// is the one its claim recorded.
	for _, cp := range simSortedKeys(live) {
		idx := live[cp]
		if len(idx) > 1 {
			for _, j := range idx[1:] {
				a, b := pays[idx[0]], pays[j]
				class := simDoubleClass(a, b)
				if simPayKey(a) != simPayKey(b) {
					// Two attempts both paid: the first one's claim must have
					// been failed by a later send of its key.
					for k := len(pays) - 1; k > idx[0]; k-- {
						if simPayKey(pays[k]) == simPayKey(a) && !w.is(w.ow.foreign, pays[k].ID) {
							class = simDoubleClass(a, pays[k]) + ", recorded as failed, then re-billed"
							break
						}
					}
				}
				add(cp[0], cp[1], "double charge", class, "%s/%s: %s and %s", cp[0], cp[1],
					w.describePayment(idx[0], a), w.describePayment(j, b))
			}
			continue
		}
		p := pays[idx[0]]
		c, ok := byKey[simPayKey(p)]
		if !ok || (c.State == string(claim.StateSucceeded) && c.StripeID == p.ID) {
			continue
		}
		if c.State == string(claim.StatePending) && w.heldFor(cp[0], cp[1]) {
			w.count("periods left for a person after another writer acted", 1)
			continue
		}
		// The claim holds another outcome of the same key: say how that
		// later send differed from the one that moved money.
		class, later := "", ""
		for j := len(pays) - 1; j > idx[0]; j-- {
			if simPayKey(pays[j]) == simPayKey(p) && !w.is(w.ow.foreign, pays[j].ID) {
				class, later = simDoubleClass(p, pays[j]), "; later "+w.describePayment(j, pays[j])
				break
			}
		}
		add(cp[0], cp[1], "unrecorded payment", class, "%s; its claim is %s%s%s", w.describePayment(idx[0], p), c.State,
			simIf(c.StripeID != "", " as "+c.StripeID), later)
	}

	// Every succeeded claim is a live payment of its amount and currency.
	// A refund's claim is checked with the refunds (checkRefunds), a
	// transfer's or payout's with them (checkMoves).
	for _, c := range claims {
		if c.State != string(claim.StateSucceeded) || c.Endpoint == simRefundsEndpoint || simMoveEndpoint(c.Endpoint) {
			continue
		}
		p, ok := payByID[c.StripeID]
		switch {
		case !ok:
			add(c.Customer, c.Period, "false success", "", "claim %s records %s, which Stripe never made", w.keyLabel(c.Key), c.StripeID)
		case !p.Paid || p.Amount != c.Amount || p.Currency != c.Currency || p.Customer != c.Customer || p.Period != c.Period:
			add(c.Customer, c.Period, "false success", "", "claim %s (%d %s) records %s: %s %s/%s %d %s", w.keyLabel(c.Key), c.Amount, c.Currency,
				p.ID, p.Status, p.Customer, p.Period, p.Amount, p.Currency)
		}
	}

	// Everyone billed, but for a decline left standing or a stop.
	for _, s := range verdict.Missing {
		cust, per := s.Customer, s.Period
		cp := [2]string{cust, per}
		cs := byPeriod[cp]
		failedOnly := len(cs) > 0 && !slices.ContainsFunc(cs, func(c simClaim) bool { return c.State != string(claim.StateFailed) })
		if failedOnly && slices.Contains(w.plan.declined, cust) && !slices.Contains(w.plan.rebill, cust) {
			continue
		}
		if slices.ContainsFunc(cs, func(c simClaim) bool { return c.State == string(claim.StatePending) }) && w.heldFor(cust, per) {
			w.count("periods left for a person after another writer acted", 1)
			continue
		}
		var states []string
		for _, c := range cs {
			states = append(states, w.keyLabel(c.Key)+" "+c.State)
		}
		add(cust, per, "missing", "", "%s/%s has no live payment; claims %v", cust, per, states)
	}
	return out
}

// simDoubleClass says what kind of resend made b after a for one customer
// and period.
func simDoubleClass(a, b billingtest.Payment) string {
	switch {
	case simPayKey(a) != simPayKey(b):
		return "two keys for one period"
	case a.Object != b.Object && b.Created.Sub(a.Created) < 24*time.Hour:
		// Within the window the same credential would have been refused
		// (the key belongs to the other endpoint).
		return "class 2: one key sent on both APIs, under two credentials"
	case a.Object != b.Object:
		return "class 2: one key sent on both APIs"
	case b.Created.Sub(a.Created) < 24*time.Hour:
		return "class 2: one key sent under two credentials"
	}
	return "class 1: key resent after Stripe's 24h window"
}

func (w *simWorld) describePayment(i int, p billingtest.Payment) string {
	w.mu.Lock()
	step := "?"
	if i < len(w.madeIn) {
		step = w.madeIn[i]
	}
	w.mu.Unlock()
	return fmt.Sprintf("%s (%s %d %s, key %s, at %s, %s)", p.ID, p.Status, p.Amount, p.Currency,
		w.keyLabel(simPayKey(p)), simAt(p.Created.Sub(w.t0)), step)
}

func simPayKey(p billingtest.Payment) string {
	if k := p.Metadata[billing.MetaKey]; k != "" {
		return k
	}
	return p.IdempotencyKey
}

func simSortedKeys[V any](m map[[2]string]V) [][2]string {
	keys := make([][2]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b [2]string) int {
		if c := strings.Compare(a[0], b[0]); c != 0 {
			return c
		}
		return strings.Compare(a[1], b[1])
	})
	return keys
}

// Trace formatting.

// simErr names the kind of a Biller error for the trace.
func simErr(err error) string {
	var (
		failed   *billing.ChargeError
		unknown  *billing.ChargeError
		busy     *billing.ChargeError
		reuse    *billing.ChargeError
		needs    *billing.ChargeError
		record   *billing.ChargeError
		mismatch *claim.MismatchError
	)
	switch {
	case err == nil:
		return "ok"
	case errors.Is(err, errSimCrashed):
		return "crashed"
	case errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined):
		return "failed(" + strings.TrimPrefix(failed.Err.Error(), "billing: declined: ") + ")"
	case errors.As(err, &unknown) && errors.Is(err, billing.ErrOutcomeUnknown):
		return "unknown outcome"
	case errors.As(err, &busy) && errors.Is(err, billing.ErrInProgress):
		return "in progress"
	case errors.As(err, &reuse) && errors.Is(err, billing.ErrKeyReused):
		return "key reuse refused"
	case errors.As(err, &needs) && errors.Is(err, billing.ErrNeedsReconciliation):
		return "needs reconciliation"
	case errors.Is(err, billing.ErrSentElsewhere):
		return "sent elsewhere"
	case errors.As(err, &record) && errors.Is(err, billing.ErrNotRecorded):
		return "record failed"
	case errors.As(err, &mismatch):
		return "mismatch(" + mismatch.Field + ")"
	case errors.Is(err, billing.ErrInvalid):
		return "invalid input: " + err.Error()
	case errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return "stopped"
	}
	s := err.Error()
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return "error: " + s
}

func simReceipt(r billing.Receipt, err error) string {
	if err != nil {
		return simErr(err)
	}
	return fmt.Sprintf("%s %s", r.Outcome, r.StripeID)
}

func simSummary(s billing.Summary, err error) string {
	out := fmt.Sprintf("created=%d already=%d failed=%d pending=%d invalid=%d", s.Created, s.AlreadyBilled, s.Declined, s.Pending, s.Invalid)
	kinds := make(map[string]int)
	for _, f := range s.Failures {
		kinds[simErr(f)]++
	}
	if len(kinds) > 0 {
		var parts []string
		for _, k := range slices.Sorted(maps.Keys(kinds)) {
			parts = append(parts, fmt.Sprintf("%s×%d", k, kinds[k]))
		}
		out += " [" + strings.Join(parts, ", ") + "]"
	}
	if err != nil {
		out += "; " + simErr(err)
	}
	return out
}

// simAt formats a virtual time as T+27h13m.
func simAt(d time.Duration) string { return "T+" + simDur(d) }

func simDur(d time.Duration) string {
	if d > 0 && d < time.Minute {
		return d.Round(time.Second).String()
	}
	d = d.Round(time.Minute)
	h, m := int(d/time.Hour), int(d%time.Hour/time.Minute)
	switch {
	case h == 0:
		return fmt.Sprintf("%dm", m)
	case m == 0:
		return fmt.Sprintf("%dh", h)
	}
	return fmt.Sprintf("%dh%02dm", h, m)
}

func simIf(ok bool, s string) string {
	if ok {
		return s
	}
	return ""
}

func (s *simStore) Process(ctx context.Context, key, stripeID string) error {
	if err := s.alive(); err != nil {
		return err
	}
	return s.inner.Process(ctx, key, stripeID)
}

func (s *simStore) Apply(ctx context.Context, u claimengine.Update) (claimApplied, error) {
	if err := s.alive(); err != nil {
		return claimApplied{}, err
	}
	return s.inner.Apply(ctx, u)
}

func (s *simStore) Unsettled(ctx context.Context, scope string, olderThan time.Duration) ([]claim.Claim, error) {
	if err := s.alive(); err != nil {
		return nil, err
	}
	return s.inner.Unsettled(ctx, scope, olderThan)
}

func (s *simStore) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := s.alive(); err != nil {
		return 0, err
	}
	return s.inner.PruneEvents(ctx, olderThan)
}

// reconcileEach runs a Reconcile with a clean Biller of every
// configuration seen so far, and settles what each reconciled.
func (w *simWorld) reconcileEach(ctx context.Context) {
	w.mu.Lock()
	configs := slices.Clone(w.configs)
	w.mu.Unlock()
	for _, cfg := range configs {
		if b := w.clean(cfg); b != nil {
			sum, err := b.Reconcile(ctx, nil)
			w.settleReconciled("reconcile with "+cfg.where(), sum, err)
		}
	}
}
