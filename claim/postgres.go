package claim

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/billonce/billonce/internal/claimengine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Defaults for [Config].
const (
	DefaultTable = "billonce_claims"
	DefaultLease = 2 * time.Minute
)

// Config configures a claim store. The zero value is usable.
type Config struct {
	// Table is the claim table's name: letters, digits and underscores, at
	// most 50 characters. Defaults to DefaultTable.
	//
	// Table and Schema name the record of who was billed. A run pointed
	// at another table (a renamed Table or Schema, or a search_path that
	// finds another schema's table when Schema is empty) knows none of
	// the earlier claims: within Stripe's 24-hour window it resends the
	// same keys and Stripe replays them, but past it a claim it does not
	// have is charged again. Keep them fixed, and set Schema where
	// replicas' search_paths may differ.
	Table string
	// Schema holds the table. Defaults to the connection's search_path.
	Schema string
	// Lease is how long a won or resumed claim stays its owner's before
	// another runner may resume it; renew it for longer calls. Defaults to
	// DefaultLease.
	Lease time.Duration
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// withDefaults validates c and fills in the defaults.
func (c Config) withDefaults() (Config, error) {
	if c.Table == "" {
		c.Table = DefaultTable
	}
	if !identRE.MatchString(c.Table) || len(c.Table) > 50 {
		return c, fmt.Errorf("%w: table name %q must be 1 to 50 letters, digits or underscores, not starting with a digit", ErrInvalid, c.Table)
	}
	if c.Schema != "" && (!identRE.MatchString(c.Schema) || len(c.Schema) > 63) {
		return c, fmt.Errorf("%w: schema name %q must be 1 to 63 letters, digits or underscores, not starting with a digit", ErrInvalid, c.Schema)
	}
	switch {
	case c.Lease == 0:
		c.Lease = DefaultLease
	case c.Lease < time.Millisecond:
		return c, fmt.Errorf("%w: lease %v must be at least 1ms (zero means %v)", ErrInvalid, c.Lease, DefaultLease)
	}
	return c, nil
}

type names struct {
	table    string // quoted, possibly schema-qualified
	events   string // the events table: quoted, possibly schema-qualified
	replacer *strings.Replacer
}

func namesFor(cfg Config) names {
	table := pgx.Identifier{cfg.Table}
	if cfg.Schema != "" {
		table = pgx.Identifier{cfg.Schema, cfg.Table}
	}
	events := pgx.Identifier{cfg.Table + "_events"}
	if cfg.Schema != "" {
		events = pgx.Identifier{cfg.Schema, cfg.Table + "_events"}
	}
	n := names{table: table.Sanitize(), events: events.Sanitize()}
	n.replacer = strings.NewReplacer(
		"{{table}}", n.table,
	)
	return n
}

// Postgres is the claim store in a PostgreSQL table. Its clock is the
// database's. It is safe for concurrent use, across
// goroutines, processes and hosts sharing the database, whatever the
// database's default transaction isolation.
type Postgres struct {
	db        *pgxpool.Pool
	cfg       Config
	names     names
	lockKey   int64
	claimSQL  string
	claimBase string // claimTemplate with this store's names, fence unset
	heldSQL   string // heldTemplate with this store's names
	selectSQL string // column list, FROM the table, for Get and Stale
}

// NewPostgres returns a claim store on pool. It checks cfg but does not touch
// the database; call [Postgres.Migrate] (or apply [Migrations]) first.
//
// The store takes a pool, not a connection or a transaction, because a
// claim must be committed, and visible to every replica, before anything
// is sent to Stripe: a claim inside a caller's transaction is invisible to
// other replicas until it commits and is erased by a rollback while the
// charge exists, and a single connection cannot serve a run's concurrent
// claims. Each statement of the store commits on its own. A pool of one
// connection (MaxConns 1) works, one statement at a time.
func NewPostgres(pool *pgxpool.Pool, cfg Config) (*Postgres, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: pool is nil; pass the *pgxpool.Pool from pgxpool.New", ErrInvalid)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	n := namesFor(cfg)
	h := fnv.New64a()
	h.Write([]byte("billonce/claim/migrate " + n.table))
	base := n.replacer.Replace(strings.ReplaceAll(claimTemplate, "{{cols_x}}", colsOf("x")))
	return &Postgres{
		db:        pool,
		cfg:       cfg,
		names:     n,
		lockKey:   int64(h.Sum64()),
		claimSQL:  fenced(base, claimengine.Fence{}),
		claimBase: base,
		heldSQL:   n.replacer.Replace(heldTemplate),
		selectSQL: "SELECT " + colsOf("t") + " FROM " + n.table + " t",
	}, nil
}

// colsOf lists, for alias x, the columns every query that returns claims
// selects, in the order scanClaim reads them.
func colsOf(x string) string {
	return strings.NewReplacer("x.", x+".").Replace(`x.customer, x.period, x.key, x.amount, x.currency, x.state, x.stripe_id,
	x.attempts, x.owner, x.lease_until, x.last_error, x.created_at, x.updated_at,
	(extract(epoch FROM now() - x.created_at) * 1000000)::bigint,
	x.scope, x.attempt, x.endpoint, x.credential, x.first_sent_at,
	(extract(epoch FROM now() - x.first_sent_at) * 1000000)::bigint, x.reconciled_at,
	x.processing_at, x.settled_at, x.failure_code, x.refunded, x.dispute, x.event_at, x.dispute_at, x.step,
	x.meter, x.window_start, x.window_end, x.meter_id, x.unsent, x.refund_of, x.account`)
}

// Where a row returned by claimTemplate comes from, most telling first.
const (
	fromInsert   = iota + 1 // a new claim: claimengine.Won
	fromTakeover            // a pending claim taken over: claimengine.Resumed
	fromKey                 // the key's existing row
	fromOverlap             // a live usage claim whose window overlaps the request's
	fromPeriod              // the live claim for the customer and period
	fromScope               // a failed claim of the customer and period under another scope
	fromLater               // a failed claim of a later attempt of the scope, customer and period
	fromRefund              // a refund's payment claim, which is not succeeded or has too little left to refund
)

// claimTemplate claims a batch in one statement, every request numbered by
// its position (ord):
//
//   - ins inserts the requests that conflict with no claim: same key, a
//     live (pending, processing or succeeded) claim for the same customer
//     and period, or, for a usage report, a live claim of the same
//     customer and meter whose window overlaps the request's and is not
//     the same. DO NOTHING without a target makes the unique indexes and
//     the exclusion constraints arbiters, so concurrent claims never fail
//     with a violation.
//   - ins also leaves out a request of a known scope whose customer and
//     period has a claim of another known scope (the empty scope, of claims made before
//     scopes were recorded, blocks nothing): a failed one, since only
//     its own scope re-bills a declined period, and a live one as the
//     statement's snapshot saw it, which the unique index alone misses
//     when that claim fails between the snapshot and the insert.
//   - Likewise ins leaves out a request whose scope, customer and period
//     has a claim of a later attempt: a failed one, since the period's
//     attempts are claimed one after the other and the later attempt's
//     declined payment may still be completed (an earlier attempt's
//     failed claim deleted by hand leaves exactly this), and a live one
//     as the snapshot saw it.
//   - ins leaves out a refund (refund_of set) unless its payment's claim
//     is succeeded, in its currency, with at least its amount left once
//     the payment's live refunds are taken off, as the snapshot saw them.
//     A refund's statement runs after a lock on its payment's key (see
//     claimRun), so its snapshot has every other refund of the payment.
//   - took takes over the key's row when it is pending with the same
//     parameters and its lease has expired or is already the caller's.
//     UPDATE locks the row and re-checks these conditions at its latest
//     version, so of runners racing for a stale claim exactly one takes it.
//   - The last six selects, for the requests neither inserted nor taken
//     over (rest: the caller would not look at their rows), return the
//     existing rows by key, by overlapping window, by customer and
//     period (the live claim), the
//     failed claims of the customer and period under another scope, the
//     failed claims of its later attempts, and a refund's payment claim
//     when it refuses the refund, as of the statement's snapshot: the
//     caller reads InProgress, Succeeded, Failed or a mismatch from them.
//
// A request whose conflicting row was committed by another transaction
// after this statement's snapshot was taken gets no row at all (ins waited
// for it and did nothing; the others cannot see it), or, when that row
// failed before ins looked at it again, a row that heldTemplate, next in
// the transaction, fails the transaction for. The caller runs the
// statement again for such requests, with a fresh snapshot.
//
// With a fence (see fenced), req is empty unless the lease row still
// carries the fence's token: the statement then claims nothing and
// returns no row.
//
// Every read of the table is a probe of the rows one request names, by
// an index: the subqueries end in OFFSET 0, which keeps the planner from
// turning them into joins. A connection caches one generic plan for the
// statement, made while the table may have been small; a join planned
// then (a hash of the whole table, or of all its failed claims) would
// read the table once per batch ever after, however large it grew
// (TestClaimBatchReadsNoMoreWhenTheTableGrows). Probes keep a claim's
// cost flat in the table's size, and make the cached plan right for a
// single claim too. took, an UPDATE, cannot probe that way: it names the
// batch's keys ($3) as well, which the index of pending claims by key
// (migration 13) takes as its condition, so that it reads the pending
// claims of the batch, not every pending claim a killed run left.
const claimTemplate = `
WITH {{fence}}req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[],
		$8::text[], $9::int[], $10::text[], $11::text[], $12::text[], $13::timestamptz[], $14::timestamptz[], $15::text[], $16::text[], $17::text[]) WITH ORDINALITY
		AS r(customer, period, key, amount, currency, owner, scope, attempt, endpoint, credential, meter, window_start, window_end, meter_id, refund_of, account, ord){{fenced}}
), ins AS (
	INSERT INTO {{table}} (customer, period, key, amount, currency, owner, lease_until, scope, attempt, endpoint, credential,
		meter, window_start, window_end, meter_id, refund_of, account)
	SELECT customer, period, key, amount, currency, owner, now() + $7 * interval '1 microsecond',
		scope, attempt, endpoint, credential, meter, window_start, window_end, meter_id, refund_of, account FROM req
	WHERE NOT EXISTS (SELECT FROM {{table}} f
			WHERE f.customer = req.customer AND f.period = req.period AND f.state = 'failed'
				AND (req.scope <> '' AND f.scope NOT IN ('', req.scope) OR f.scope = req.scope AND f.attempt > req.attempt) OFFSET 0)
		AND NOT EXISTS (SELECT FROM {{table}} f
			WHERE f.customer = req.customer AND f.period = req.period AND f.state <> 'failed'
				AND (req.scope <> '' AND f.scope NOT IN ('', req.scope) OR f.scope = req.scope AND f.attempt > req.attempt) OFFSET 0)
		AND (req.refund_of IS NULL OR EXISTS (SELECT FROM {{table}} p
			WHERE p.key = req.refund_of AND p.state = 'succeeded' AND p.currency = req.currency
				AND p.amount - req.amount >= (SELECT coalesce(sum(r.amount), 0) FROM {{table}} r
					WHERE r.refund_of = req.refund_of AND r.state <> 'failed') OFFSET 0))
	ON CONFLICT DO NOTHING
	RETURNING *
), took AS (
	UPDATE {{table}} c SET attempts = c.attempts + 1, owner = req.owner,
		lease_until = now() + $7 * interval '1 microsecond', updated_at = now()
	FROM req
	WHERE c.key = req.key AND c.key = ANY ($3::text[]) AND c.state = 'pending' AND c.customer = req.customer AND c.period = req.period
		AND c.amount = req.amount AND c.currency = req.currency AND c.account = req.account
		AND (c.lease_until <= now() OR c.owner = req.owner)
	RETURNING req.ord, c.*
), rest AS (
	SELECT * FROM req WHERE NOT EXISTS (SELECT FROM ins WHERE ins.key = req.key) AND NOT EXISTS (SELECT FROM took WHERE took.ord = req.ord)
)
SELECT req.ord, 1, {{cols_x}} FROM ins x JOIN req ON req.key = x.key
UNION ALL
SELECT x.ord, 2, {{cols_x}} FROM took x
UNION ALL
SELECT req.ord, 3, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE x.key = req.key OFFSET 0) x
UNION ALL
SELECT req.ord, 4, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE hashtextextended(x.customer || ' ' || x.meter, 0) = hashtextextended(req.customer || ' ' || req.meter, 0)
		AND x.customer = req.customer AND x.meter = req.meter AND x.state <> 'failed' AND x.window_end IS NOT NULL
		AND tstzrange(x.window_start, x.window_end) && tstzrange(req.window_start, req.window_end)
		AND (x.window_start <> req.window_start OR x.window_end <> req.window_end) OFFSET 0) x
	WHERE req.meter IS NOT NULL
UNION ALL
SELECT req.ord, 5, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE x.customer = req.customer AND x.period = req.period AND x.state <> 'failed' AND x.key <> req.key OFFSET 0) x
UNION ALL
SELECT req.ord, 6, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE x.customer = req.customer AND x.period = req.period AND x.state = 'failed' AND x.key <> req.key
		AND x.scope NOT IN ('', req.scope) OFFSET 0) x
	WHERE req.scope <> ''
UNION ALL
SELECT req.ord, 7, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE x.customer = req.customer AND x.period = req.period AND x.state = 'failed' AND x.key <> req.key
		AND x.scope = req.scope AND x.attempt > req.attempt OFFSET 0) x
UNION ALL
SELECT req.ord, 8, {{cols_x}} FROM rest req CROSS JOIN LATERAL (SELECT * FROM {{table}} x
	WHERE x.key = req.refund_of OFFSET 0) x
	WHERE req.refund_of IS NOT NULL AND NOT (x.state = 'succeeded' AND x.currency = req.currency
		AND x.amount - req.amount >= (SELECT coalesce(sum(r.amount), 0) FROM {{table}} r
			WHERE r.refund_of = req.refund_of AND r.state <> 'failed'))`

// heldTemplate fails its transaction when a claim of keys $1 that the
// transaction inserted (its own row version, created at the
// transaction's start: a takeover keeps the claim's creation time) is one
// that another claim holds against by the rules of claimTemplate's ins,
// as of this statement's own snapshot: the cast of a sentence to an
// integer raises invalid_text_representation, and nothing of the
// transaction commits. It runs after claimTemplate, in its transaction,
// at read committed: the claims that statement's snapshot missed and the
// unique index no longer saw are in this one's. Failing, rather than
// deleting the insert, asks for no privilege beyond SELECT, INSERT and
// UPDATE on the table.
const heldTemplate = `
SELECT ('billonce: the new claim ' || t.key || ' meets a claim committed while it was inserted; it is claimed again')::int
FROM {{table}} t
WHERE t.key = ANY ($1::text[]) AND t.state = 'pending' AND t.created_at = now()
	AND t.xmin::text = (pg_current_xact_id_if_assigned()::text::bigint % 4294967296)::text
	AND (EXISTS (SELECT FROM {{table}} f
			WHERE f.customer = t.customer AND f.period = t.period AND f.state = 'failed'
				AND (t.scope <> '' AND f.scope NOT IN ('', t.scope) OR f.scope = t.scope AND f.attempt > t.attempt) OFFSET 0)
		OR EXISTS (SELECT FROM {{table}} f
			WHERE f.customer = t.customer AND f.period = t.period AND f.state <> 'failed' AND f.key <> t.key
				AND (t.scope <> '' AND f.scope NOT IN ('', t.scope) OR f.scope = t.scope AND f.attempt > t.attempt) OFFSET 0))`

// fenced returns the claim statement base under fence f, whose token is
// $18: the lease row that carries it is locked FOR SHARE until the claims
// commit, so a takeover of the lease (an UPDATE of that row) either waits
// for them or, having committed first, leaves no row with the token, and
// the statement claims nothing. The zero Fence checks nothing.
func fenced(base string, f claimengine.Fence) string {
	if f == (claimengine.Fence{}) {
		return strings.NewReplacer("{{fence}}", "", "{{fenced}}", "").Replace(base)
	}
	return strings.NewReplacer(
		"{{fence}}", "fence AS (SELECT FROM "+pgx.Identifier{f.Table}.Sanitize()+" WHERE token = $18 FOR SHARE),\n",
		"{{fenced}}", "\n\tWHERE EXISTS (SELECT FROM fence)",
	).Replace(base)
}

// fenceLost explains a fenced claim statement that returned no row: it
// returns an error wrapping claimengine.ErrFenced if no row of the lease
// table carries f's token any more, and nil if one does (the requests
// raced other claims and are run again).
func (p *pgEngine) fenceLost(ctx context.Context, f claimengine.Fence) error {
	var held bool
	err := p.db.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+pgx.Identifier{f.Table}.Sanitize()+" WHERE token = $1)", f.Token).Scan(&held)
	switch {
	case err != nil:
		return fenceErr(f, err)
	case !held:
		return fmt.Errorf("%w: lease table %q has no row with token %d (taken over, or ended); nothing was claimed",
			claimengine.ErrFenced, f.Table, f.Token)
	}
	return nil
}

// noJIT turns PostgreSQL's JIT compilation off until the end of the
// transaction it runs in (an explicit one, or the implicit one of a
// batch). A batch's statement is estimated at a cost that grows with its
// size, and past jit_above_cost (on by default) PostgreSQL compiles it
// first: a claim statement of 10,000 requests spent 39 of its 41 seconds
// compiling, of 1,000 about a second (BenchmarkClaimBatch). Every
// statement of the store reads and writes a few rows by index, which
// compiling never pays back.
const noJIT = "SELECT set_config('jit', 'off', true)"

// noJITAbove is the size of a claim batch above which its transaction
// turns JIT off: the statement of a smaller one is estimated far below
// jit_above_cost's default, and is spared the round of noJIT.
const noJITAbove = 100

// rolledBack reports whether err is PostgreSQL's refusal of a whole
// transaction that may succeed when run again: a deadlock with other
// transactions that it was chosen to end (claims of the same periods in
// another order), or a serialization failure.
func rolledBack(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && (pgErr.Code == "40001" || pgErr.Code == "40P01")
}

// fenceErr is err from a claim statement under fence f, with a hint when
// a table is missing: the lease table may not be in the claim store's
// database.
func fenceErr(f claimengine.Fence, err error) error {
	var pgErr *pgconn.PgError
	if f != (claimengine.Fence{}) && errors.As(err, &pgErr) && pgErr.Code == "42P01" { // undefined_table
		return fmt.Errorf("claim: %w (a claim fenced by a lease needs the lease table %q in the claim store's database and search_path)", err, f.Table)
	}
	return fmt.Errorf("claim: %w", err)
}

// maxClaimRuns bounds how often a statement is run again for requests that
// raced with another transaction's first claim; one more run always sees it.
const maxClaimRuns = 5

// Claim claims req in one round trip (two when it races another runner's
// first claim of the same row). See [Store].
func (p *pgEngine) Claim(ctx context.Context, req request) (result, error) {
	if err := validateRequest(req); err != nil {
		return result{}, err
	}
	res, err := p.claim(ctx, []request{req})
	if err != nil {
		return result{}, err
	}
	if res[0].Conflict != nil {
		return result{}, res[0].Conflict
	}
	return res[0], nil
}

// ClaimBatch claims all reqs in one statement. See [Store].
func (p *pgEngine) ClaimBatch(ctx context.Context, reqs []request) ([]result, error) {
	if err := validateBatch(reqs); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	res, err := p.claim(ctx, reqs)
	if err != nil {
		return nil, err
	}
	return batchResults(res)
}

// batchResults returns res with the conflicts joined into one error.
func batchResults(res []result) ([]result, error) {
	var errs []error
	for _, r := range res {
		if r.Conflict != nil {
			errs = append(errs, r.Conflict)
		}
	}
	return res, errors.Join(errs...)
}

func (p *pgEngine) claim(ctx context.Context, reqs []request) ([]result, error) {
	out := make([]result, len(reqs))
	todo := make([]int, len(reqs)) // indexes into reqs still unanswered
	for i := range todo {
		todo[i] = i
	}
	for run := 0; len(todo) > 0; run++ {
		if run == maxClaimRuns {
			return nil, fmt.Errorf("claim: %d claims (first %q) still racing other runners after %d runs; claim them again", len(todo), reqs[todo[0]].Key, run)
		}
		now, later := refundsApart(reqs, todo)
		again, err := p.claimRun(ctx, reqs, now, out)
		if rolledBack(err) {
			// The transaction was rolled back, nothing of it committed:
			// run it again, on a fresh snapshot, as for a race.
			again, err = now, nil
		}
		if err != nil {
			return nil, err
		}
		if len(again) == 0 && len(later) > 0 {
			run-- // refunds waiting their turn, not a race
		}
		todo = append(again, later...)
	}
	return out, nil
}

// refundsApart splits todo into what one statement may claim, with at
// most one refund of each payment, and the refunds left for a later one:
// one statement reads one snapshot, in which two refunds of a payment
// would not see each other's amount.
func refundsApart(reqs []request, todo []int) (now, later []int) {
	var seen []string
	for _, i := range todo {
		if k := reqs[i].RefundOf; k != "" {
			if slices.Contains(seen, k) {
				later = append(later, i)
				continue
			}
			seen = append(seen, k)
		}
		now = append(now, i)
	}
	return now, later
}

// claimRun runs claimTemplate once for reqs[todo], fills in out and returns
// the requests that got no answer.
func (p *pgEngine) claimRun(ctx context.Context, reqs []request, todo []int, out []result) (again []int, err error) {
	n := len(todo)
	customers, periods, keys, currencies, owners := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	scopes, endpoints, credentials := make([]string, n), make([]string, n), make([]string, n)
	amounts, attempts := make([]int64, n), make([]int32, n)
	meters, starts, ends, meterIDs := make([]*string, n), make([]*time.Time, n), make([]*time.Time, n), make([]*string, n) // NULL but for usage reports
	refundOf, accounts := make([]*string, n), make([]string, n)                                                            // NULL but for refunds
	for j, i := range todo {
		r := reqs[i]
		customers[j], periods[j], keys[j], amounts[j], currencies[j], owners[j] = r.Customer, r.Period, r.Key, r.Amount, r.Currency, r.Owner
		scopes[j], attempts[j], endpoints[j], credentials[j] = r.Scope, int32(r.Attempt), r.Endpoint, r.Credential
		if r.Meter != "" {
			meters[j], starts[j], ends[j] = &r.Meter, &r.WindowStart, &r.WindowEnd
		}
		if r.MeterID != "" {
			meterIDs[j] = &r.MeterID
		}
		if r.RefundOf != "" {
			refundOf[j] = &r.RefundOf
		}
		accounts[j] = r.Account
	}
	args := []any{customers, periods, keys, amounts, currencies, owners, p.cfg.Lease.Microseconds(),
		scopes, attempts, endpoints, credentials, meters, starts, ends, meterIDs, refundOf}
	sql, fence := p.claimSQL, reqs[todo[0]].Fence // one fence per batch: validateBatch
	args = append(args, accounts)
	if fence != (claimengine.Fence{}) {
		sql = fenced(p.claimBase, fence)
		args = append(args, fence.Token)
	}
	// One round trip, one transaction, read committed whatever the
	// database's default (each statement then reads the table as of its
	// own start): the refunds' locks, the claim statement, and the check
	// of what it inserted.
	var b pgx.Batch
	b.Queue("BEGIN ISOLATION LEVEL READ COMMITTED")
	if n > noJITAbove {
		b.Queue(noJIT)
	}
	if locks := refundLocks(reqs, todo); locks != nil {
		// A refund's claim reads its payment's refunds after a lock on the
		// payment's key, held until it commits: refunds of one payment are
		// claimed one after the other, each seeing the others' amounts.
		// Under repeatable read the snapshot would be taken before the
		// lock is granted, and miss the refunds claimed while it waited.
		b.Queue("SELECT pg_advisory_xact_lock($1, hashtext(k)) FROM unnest($2::text[]) AS k ORDER BY k", refundLockSpace, locks)
	}
	best := make([]int, n) // the most telling source seen per request; 0 = none
	rowOf := make([]Claim, n)
	seen := 0
	var readErr error // an answer the claim statement's rows could not give
	b.Queue(sql, args...).Query(func(rows pgx.Rows) error {
		for rows.Next() {
			seen++
			var ord int64
			var from int
			c, err := scanClaim(rows, &ord, &from)
			if err != nil {
				readErr = fmt.Errorf("claim: reading claims: %w", err)
				return readErr
			}
			j := int(ord) - 1
			if j < 0 || j >= n {
				readErr = fmt.Errorf("claim: the database answered request %d of %d", ord, n)
				return readErr
			}
			if best[j] == 0 || from < best[j] {
				best[j], rowOf[j] = from, c
			}
		}
		return rows.Err()
	})
	// The claim statement's snapshot misses a claim that another
	// transaction committed after it was taken, and the unique index of
	// live claims misses one that has failed since: a claim of another
	// scope, or of a later attempt, committed and then failed while the
	// insert waited for it. Read again, the period holds it. This
	// statement reads the table as of its own start, after that
	// transaction's commit (the insert waited for it), and fails the
	// transaction when a claim it inserted is held so; the statement then
	// runs again, and sees that claim.
	held := false
	b.Queue(p.heldSQL, keys).Query(func(rows pgx.Rows) error {
		for rows.Next() {
		}
		var pgErr *pgconn.PgError
		held = errors.As(rows.Err(), &pgErr) && pgErr.Code == "22P02" // invalid_text_representation: heldTemplate's
		return rows.Err()
	})
	b.Queue("COMMIT")
	if err := p.db.SendBatch(ctx, &b).Close(); err != nil {
		switch {
		case readErr != nil:
			return nil, readErr
		case held:
			return todo, nil // nothing committed: all again
		}
		return nil, fenceErr(fence, err)
	}
	if seen == 0 && fence != (claimengine.Fence{}) {
		if err := p.fenceLost(ctx, fence); err != nil {
			return nil, err
		}
	}
	for j, i := range todo {
		out[i] = answer(reqs[i], best[j], rowOf[j])
		if best[j] == 0 && reqs[i].RefundOf != "" {
			// A refund the statement neither claimed nor refused: its
			// payment has no claim.
			var exists bool
			if err := p.db.QueryRow(ctx, "SELECT EXISTS (SELECT FROM "+p.names.table+" WHERE key = $1)", reqs[i].RefundOf).Scan(&exists); err != nil {
				return nil, fmt.Errorf("claim: reading the payment claim of refund %q: %w", reqs[i].Key, err)
			}
			if !exists {
				out[i] = result{Outcome: claimengine.Mismatch, Conflict: fmt.Errorf("%w: refund of %q: no claim has this key", ErrInvalid, reqs[i].RefundOf)}
				continue
			}
		}
		if best[j] == 0 {
			again = append(again, i)
		}
		if m, ok := out[i].Conflict.(*MismatchError); ok && best[j] == fromRefund {
			if err := p.refundLeft(ctx, m); err != nil {
				return nil, err
			}
		}
	}
	return again, nil
}

// answer turns the row found for req, and where it came from, into a result.
func answer(req request, from int, c Claim) result {
	switch from {
	case fromInsert:
		return result{Outcome: claimengine.Won, Claim: c}
	case fromTakeover:
		return result{Outcome: claimengine.Resumed, Claim: c}
	case fromOverlap:
		return result{Outcome: claimengine.Mismatch, Claim: c, Conflict: overlap(req, c)}
	case fromScope:
		return result{Outcome: claimengine.Mismatch, Claim: c, Conflict: &MismatchError{Field: "scope", Have: c.Scope, Want: req.Scope, Existing: c}}
	case fromLater:
		return result{Outcome: claimengine.Failed, Claim: c}
	case fromRefund:
		return result{Outcome: claimengine.Mismatch, Claim: c, Conflict: &MismatchError{Field: "refund", Want: fmt.Sprint(req.Amount), Existing: c}}
	case 0:
		return result{}
	}
	if m := compare(req, c); m != nil {
		return result{Outcome: claimengine.Mismatch, Claim: c, Conflict: m}
	}
	switch c.State {
	case StateSucceeded:
		return result{Outcome: claimengine.Succeeded, Claim: c}
	case StateProcessing:
		return result{Outcome: claimengine.Processing, Claim: c}
	case StateFailed:
		return result{Outcome: claimengine.Failed, Claim: c}
	default:
		return result{Outcome: claimengine.InProgress, Claim: c}
	}
}

// refundLockSpace is the first key of the transaction-level advisory
// locks a refund's claim takes on its payment's key (the second is a hash
// of that key): two-key advisory locks are apart from the one-key locks
// of package lock and of Migrate.
const refundLockSpace = 0x626f5246 // "boRF"

// refundLocks returns the payment keys the refunds among reqs[todo]
// refund, or nil when there are none.
func refundLocks(reqs []request, todo []int) []string {
	var keys []string
	for _, i := range todo {
		if k := reqs[i].RefundOf; k != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	return keys
}

// refundLeft fills in m.Have, for a refund its payment's claim refused:
// the amount left to refund of the payment, its live refunds taken off.
// It is read after the claim's transaction, for the refusal's words only:
// refunds claimed since may be taken off too.
func (p *pgEngine) refundLeft(ctx context.Context, m *MismatchError) error {
	var refunded int64
	err := p.db.QueryRow(ctx, "SELECT coalesce(sum(amount), 0) FROM "+p.names.table+
		" WHERE refund_of = $1 AND state <> 'failed'", m.Existing.Key).Scan(&refunded)
	if err != nil {
		return fmt.Errorf("claim: reading the refunds of %q: %w", m.Existing.Key, err)
	}
	m.Have = fmt.Sprint(max(m.Existing.Amount-refunded, 0))
	return nil
}

func scanClaim(row pgx.Row, prefix ...any) (Claim, error) {
	var c Claim
	var state string
	var ageMicros, sentMicros int64
	var reconciled, processing, settled, eventAt, disputeAt, windowStart, windowEnd *time.Time
	var meter, meterID, refundOf *string
	dest := append(prefix, &c.Customer, &c.Period, &c.Key, &c.Amount, &c.Currency, &state, &c.StripeID, &c.Leases,
		&c.Owner, &c.LeaseUntil, &c.LastError, &c.CreatedAt, &c.UpdatedAt, &ageMicros,
		&c.Scope, &c.Attempt, &c.Endpoint, &c.Credential, &c.FirstSentAt, &sentMicros, &reconciled,
		&processing, &settled, &c.FailureCode, &c.Refunded, &c.Dispute, &eventAt, &disputeAt, &c.Step,
		&meter, &windowStart, &windowEnd, &meterID, &c.Unsent, &refundOf, &c.Account)
	if err := row.Scan(dest...); err != nil {
		return Claim{}, err
	}
	if meter != nil {
		c.Meter = *meter
	}
	if meterID != nil {
		c.MeterID = *meterID
	}
	if refundOf != nil {
		c.RefundOf = *refundOf
	}
	c.State = State(state)
	c.Age = time.Duration(ageMicros) * time.Microsecond
	c.SentAge = time.Duration(sentMicros) * time.Microsecond
	for _, t := range [...]struct {
		src *time.Time
		dst *time.Time
	}{{reconciled, &c.ReconciledAt}, {processing, &c.ProcessingAt}, {settled, &c.SettledAt}, {eventAt, &c.EventAt}, {disputeAt, &c.DisputeAt},
		{windowStart, &c.WindowStart}, {windowEnd, &c.WindowEnd}} {
		if t.src != nil {
			*t.dst = *t.src
		}
	}
	return c, nil
}

// Renew extends owner's lease on key by the configured lease, from now on
// the database clock. See [Store].
func (p *pgEngine) Renew(ctx context.Context, key, owner string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET lease_until = now() + $3 * interval '1 microsecond', updated_at = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, p.cfg.Lease.Microseconds())
	if err != nil {
		return fmt.Errorf("claim: renewing %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return p.lost(ctx, key, owner)
}

// CheckSend reports whether owner may send key now: it holds the pending
// claim and less than window has passed on the database clock since the
// key's window started. See [Store].
func (p *pgEngine) CheckSend(ctx context.Context, key, owner string, window time.Duration) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateWindow(window)); err != nil {
		return err
	}
	var held, open bool
	var sentMicros int64
	err := p.db.QueryRow(ctx, `SELECT owner = $2 AND state = 'pending', now() < first_sent_at + $3 * interval '1 microsecond',
		(extract(epoch FROM now() - first_sent_at) * 1000000)::bigint FROM `+p.names.table+` WHERE key = $1`,
		key, owner, window.Microseconds()).Scan(&held, &open, &sentMicros)
	switch {
	case errors.Is(err, pgx.ErrNoRows):
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	case err != nil:
		return fmt.Errorf("claim: checking %q before sending: %w", key, err)
	case !held:
		return p.lost(ctx, key, owner)
	case !open:
		return windowClosed(key, time.Duration(sentMicros)*time.Microsecond, window)
	}
	return nil
}

func validateWindow(w time.Duration) error {
	if w <= 0 {
		return fmt.Errorf("%w: window %v must be positive", ErrInvalid, w)
	}
	return nil
}

func windowClosed(key string, sent, window time.Duration) error {
	return fmt.Errorf("%w: key %q was first sent %v ago, window %v", claimengine.ErrWindowClosed, key, sent.Round(time.Second), window)
}

// Reopen starts key's window again after a search found no payment for
// it, recording where the key goes from now on. See [Store].
func (p *pgEngine) Reopen(ctx context.Context, key, owner, endpoint, credential string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateID("endpoint", endpoint), validateID("credential", credential)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET first_sent_at = now(), reconciled_at = now(), endpoint = $3, credential = $4, unsent = false, updated_at = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, endpoint, credential)
	if err != nil {
		return fmt.Errorf("claim: reopening %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return p.lost(ctx, key, owner)
}

// Advance records step as done on owner's pending claim on key, and
// stripeID as the object the steps build on. See [claimengine.Engine].
func (p *pgEngine) Advance(ctx context.Context, key, owner, stripeID, step string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateID("stripe id", stripeID), validateID("step", step)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET step = $4, stripe_id = $3, first_sent_at = now(), reconciled_at = NULL, updated_at = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending' AND lease_until > now() AND stripe_id IN ('', $3)`, key, owner, stripeID, step)
	if err != nil {
		return fmt.Errorf("claim: recording step %q of %q: %w", step, key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return advanceConflict(c, owner, stripeID)
}

func advanceConflict(c Claim, owner, stripeID string) error {
	if c.State == StatePending && c.StripeID != "" && c.StripeID != stripeID {
		return fmt.Errorf("%w: claim %q builds on %q, not %q", claimengine.ErrConflict, c.Key, c.StripeID, stripeID)
	}
	return fmt.Errorf("%w: claim %q is %s and held by %q until %s, not by %q", claimengine.ErrLeaseLost, c.Key, c.State, c.Owner, c.LeaseUntil.UTC().Format(time.RFC3339), owner)
}

// lost explains why owner's update of key matched no row.
func (p *pgEngine) lost(ctx context.Context, key, owner string) error {
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: claim %q is %s and held by %q, not %q", claimengine.ErrLeaseLost, key, c.State, c.Owner, owner)
}

// Release gives up owner's lease on key, recording lastErr. See [Store].
func (p *pgEngine) Release(ctx context.Context, key, owner, stripeID, lastErr string) error {
	return p.release(ctx, key, owner, stripeID, lastErr, false)
}

// ReleaseUnsent releases owner's lease on key like Release, and records
// that its key never executed at Stripe. See claimengine.Engine.
func (p *pgEngine) ReleaseUnsent(ctx context.Context, key, owner, lastErr string) error {
	return p.release(ctx, key, owner, "", lastErr, true)
}

func (p *pgEngine) release(ctx context.Context, key, owner, stripeID, lastErr string, unsent bool) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateOptionalID("stripe id", stripeID), validateText("error", lastErr)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET owner = '', lease_until = now(), last_error = $3, unsent = unsent OR $4,
		stripe_id = CASE WHEN stripe_id = '' THEN $5 ELSE stripe_id END, updated_at = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, lastErr, unsent, stripeID)
	if err != nil {
		return fmt.Errorf("claim: releasing %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return p.lost(ctx, key, owner)
}

// Abandon deletes owner's pending claim on key, whose key never executed
// at Stripe. See [Store].
func (p *pgEngine) Abandon(ctx context.Context, key, owner string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "DELETE FROM "+p.names.table+" WHERE key = $1 AND owner = $2 AND state = 'pending' AND step = '' AND stripe_id = ''", key, owner)
	if err != nil {
		return fmt.Errorf("claim: abandoning %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return p.lost(ctx, key, owner)
}

// Succeed records that key was charged as stripeID. It does not check the
// lease: an answer from Stripe is the truth whoever receives it. See [Store].
func (p *pgEngine) Succeed(ctx context.Context, key, stripeID string) error {
	if err := errors.Join(validateID("key", key), validateID("stripe id", stripeID)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET state = 'succeeded', stripe_id = $2, updated_at = now()
		WHERE key = $1 AND state = 'pending'`, key, stripeID)
	if err != nil {
		return fmt.Errorf("claim: recording success of %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return succeedConflict(c, stripeID)
}

func succeedConflict(c Claim, stripeID string) error {
	switch {
	case c.State == StateSucceeded && c.StripeID == stripeID:
		return nil
	case c.State == StateSucceeded:
		return fmt.Errorf("%w: claim %q already succeeded as %q, not %q", claimengine.ErrConflict, c.Key, c.StripeID, stripeID)
	default:
		return fmt.Errorf("%w: claim %q is %s (%s); it cannot succeed as %q", claimengine.ErrConflict, c.Key, c.State, c.LastError, stripeID)
	}
}

// Fail records that key failed definitively. It does not check the lease.
// See [Store].
func (p *pgEngine) Fail(ctx context.Context, key, stripeID, reason string) error {
	if err := errors.Join(validateID("key", key), validateOptionalID("stripe id", stripeID), validateText("reason", reason)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET state = 'failed', last_error = $2, stripe_id = coalesce(nullif($3, ''), stripe_id), updated_at = now()
		WHERE key = $1 AND state = 'pending'`, key, reason, stripeID)
	if err != nil {
		return fmt.Errorf("claim: recording failure of %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return failConflict(c)
}

func failConflict(c Claim) error {
	if c.State == StateFailed {
		return nil
	}
	return fmt.Errorf("%w: claim %q is already %s as %q; it cannot fail", claimengine.ErrConflict, c.Key, c.State, c.StripeID)
}

// Get returns the claim for key. See [Store].
func (p *Postgres) Get(ctx context.Context, key string) (Claim, error) {
	if err := validateID("key", key); err != nil {
		return Claim{}, err
	}
	c, err := scanClaim(p.db.QueryRow(ctx, p.selectSQL+" WHERE key = $1", key))
	if errors.Is(err, pgx.ErrNoRows) {
		return Claim{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	if err != nil {
		return Claim{}, fmt.Errorf("claim: reading %q: %w", key, err)
	}
	return c, nil
}

// Stale lists pending claims whose lease has expired on the database
// clock, of scope and of unknown scope, or all when scope is "". See
// [Store].
func (p *pgEngine) Stale(ctx context.Context, scope string) ([]Claim, error) {
	return p.list(ctx, ` WHERE state = 'pending' AND lease_until <= now() AND ($1 = '' OR scope IN ($1, ''))
		ORDER BY created_at, key`, scope)
}

func (p *pgEngine) list(ctx context.Context, where string, args ...any) ([]Claim, error) {
	rows, err := p.db.Query(ctx, p.selectSQL+where, args...)
	if err != nil {
		return nil, fmt.Errorf("claim: listing claims: %w", err)
	}
	claims, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (Claim, error) { return scanClaim(r) })
	if err != nil {
		return nil, fmt.Errorf("claim: listing claims: %w", err)
	}
	return claims, nil
}

var _ Store = (*Postgres)(nil)
