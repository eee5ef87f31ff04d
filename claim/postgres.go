package claim

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"hash/fnv"
	"reflect"
	"regexp"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is what [Postgres] needs from pgx: *pgxpool.Pool, *pgx.Conn and pgx.Tx
// all satisfy it. Pass a pgx.Tx to claim inside your own transaction.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Defaults for [Config].
const (
	DefaultTable = "billonce_claims"
	DefaultLease = 2 * time.Minute
)

// Config configures a claim store. The zero value is usable.
type Config struct {
	// Table is the claim table's name: letters, digits and underscores, at
	// most 50 characters. Defaults to DefaultTable.
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

//go:embed schema.sql
var schemaTemplate string

// SchemaSQL returns the SQL that creates the claim table and its indexes for
// cfg, for teams that apply migrations with their own tool (goose,
// golang-migrate, atlas). It is idempotent. [Postgres.Migrate] runs the same
// SQL.
func SchemaSQL(cfg Config) (string, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return "", err
	}
	n := namesFor(cfg)
	sql := n.replacer.Replace(schemaTemplate)
	if cfg.Schema != "" {
		sql = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{cfg.Schema}.Sanitize() + ";\n\n" + sql
	}
	return sql, nil
}

type names struct {
	table     string // quoted, possibly schema-qualified
	liveIndex string // unquoted, as PostgreSQL reports it in errors
	replacer  *strings.Replacer
}

func namesFor(cfg Config) names {
	table := pgx.Identifier{cfg.Table}
	if cfg.Schema != "" {
		table = pgx.Identifier{cfg.Schema, cfg.Table}
	}
	n := names{table: table.Sanitize(), liveIndex: cfg.Table + "_live"}
	n.replacer = strings.NewReplacer(
		"{{table}}", n.table,
		"{{live_index}}", pgx.Identifier{n.liveIndex}.Sanitize(),
		"{{pending_index}}", pgx.Identifier{cfg.Table + "_pending"}.Sanitize(),
	)
	return n
}

// Postgres is the claim store in a PostgreSQL table. Its clock is the
// database's (invariant I10). It is safe for concurrent use, across
// goroutines, processes and hosts sharing the database.
type Postgres struct {
	db        DB
	cfg       Config
	names     names
	schema    string
	lockKey   int64
	claimSQL  string
	selectSQL string // column list, FROM the table, for Get/Pending/Stale
}

// NewPostgres returns a claim store on db. It checks cfg but does not touch
// the database; call [Postgres.Migrate] (or apply [SchemaSQL]) first.
func NewPostgres(db DB, cfg Config) (*Postgres, error) {
	if db == nil || (reflect.ValueOf(db).Kind() == reflect.Pointer && reflect.ValueOf(db).IsNil()) {
		return nil, fmt.Errorf("%w: database is nil; pass a *pgxpool.Pool, *pgx.Conn or pgx.Tx", ErrInvalid)
	}
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	schema, _ := SchemaSQL(cfg)
	n := namesFor(cfg)
	h := fnv.New64a()
	h.Write([]byte("billonce/claim/migrate " + n.table))
	return &Postgres{
		db:        db,
		cfg:       cfg,
		names:     n,
		schema:    schema,
		lockKey:   int64(h.Sum64()),
		claimSQL:  n.replacer.Replace(strings.ReplaceAll(claimTemplate, "{{take}}", takeCond)),
		selectSQL: "SELECT " + columns + " FROM " + n.table,
	}, nil
}

// Migrate creates the claim table and its indexes if they do not exist. It
// is idempotent and safe to run from many replicas at once: a transaction
// advisory lock serialises it.
func (p *Postgres) Migrate(ctx context.Context) error {
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", p.lockKey); err != nil {
		return fmt.Errorf("claim: migrate: taking the migration lock: %w", err)
	}
	if _, err := tx.Exec(ctx, p.schema); err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	return nil
}

// columns are selected, in this order, by every query that returns claims.
const columns = `customer, period, key, amount, currency, state, stripe_id, attempts, owner, lease_until,
	last_error, created_at, updated_at, (extract(epoch FROM now() - created_at) * 1000000)::bigint`

// claimTemplate claims a batch in one statement. For each request:
//
//   - live finds a live claim for the same customer and period under another
//     key (only when the key itself is unknown): a mismatch, nothing written;
//   - otherwise the INSERT either creates the claim (won) or, on the key's
//     existing row, takes it over when it is pending with the same
//     parameters and its lease has expired or is already the caller's. The
//     row is locked and re-checked at its latest version, so of two runners
//     racing for a stale claim exactly one takes it over. When no takeover
//     happens the SET keeps every value, so the row comes back as it stands.
//
// The caller reads the outcome from the returned row (see outcomeOf).
const claimTemplate = `
WITH req AS (
	SELECT * FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[])
		AS r(customer, period, key, amount, currency, owner)
), live AS (
	SELECT t.* FROM req JOIN {{table}} t
		ON t.customer = req.customer AND t.period = req.period AND t.state <> 'failed' AND t.key <> req.key
	WHERE NOT EXISTS (SELECT 1 FROM {{table}} k WHERE k.key = req.key)
), up AS (
	INSERT INTO {{table}} AS c (customer, period, key, amount, currency, owner, lease_until)
	SELECT customer, period, key, amount, currency, owner, now() + $7 * interval '1 microsecond'
	FROM req
	WHERE NOT EXISTS (SELECT 1 FROM live WHERE live.customer = req.customer AND live.period = req.period)
	ON CONFLICT (key) DO UPDATE SET
		attempts    = CASE WHEN {{take}} THEN c.attempts + 1 ELSE c.attempts END,
		owner       = CASE WHEN {{take}} THEN excluded.owner ELSE c.owner END,
		lease_until = CASE WHEN {{take}} THEN excluded.lease_until ELSE c.lease_until END,
		updated_at  = CASE WHEN {{take}} THEN now() ELSE c.updated_at END
	RETURNING c.*
)
SELECT false, ` + columns + ` FROM up
UNION ALL
SELECT true, ` + columns + ` FROM live`

// takeCond is when a claim on an existing row takes it over.
const takeCond = `(c.state = 'pending' AND c.customer = excluded.customer AND c.period = excluded.period
		AND c.amount = excluded.amount AND c.currency = excluded.currency
		AND (c.lease_until <= now() OR c.owner = excluded.owner))`

// Claim claims req in one round trip. See [Store].
func (p *Postgres) Claim(ctx context.Context, req Request) (Result, error) {
	if err := req.Validate(); err != nil {
		return Result{}, err
	}
	res, err := p.claim(ctx, []Request{req})
	if err != nil {
		return Result{}, err
	}
	if res[0].Outcome == Mismatch {
		return Result{}, res[0].mismatch
	}
	return res[0].Result, nil
}

// ClaimBatch claims all reqs in one statement. See [Store].
func (p *Postgres) ClaimBatch(ctx context.Context, reqs []Request) ([]Result, error) {
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

type claimed struct {
	Result
	mismatch *MismatchError
}

func batchResults(res []claimed) ([]Result, error) {
	out := make([]Result, len(res))
	var errs []error
	for i, r := range res {
		out[i] = r.Result
		if r.mismatch != nil {
			errs = append(errs, r.mismatch)
		}
	}
	return out, errors.Join(errs...)
}

func (p *Postgres) claim(ctx context.Context, reqs []Request) ([]claimed, error) {
	n := len(reqs)
	customers, periods, keys, currencies, owners := make([]string, n), make([]string, n), make([]string, n), make([]string, n), make([]string, n)
	amounts := make([]int64, n)
	byKey := make(map[string]int, n)
	byPeriod := make(map[[2]string]int, n)
	for i, r := range reqs {
		customers[i], periods[i], keys[i], amounts[i], currencies[i], owners[i] = r.Customer, r.Period, r.Key, r.Amount, r.Currency, r.Owner
		byKey[r.Key] = i
		byPeriod[[2]string{r.Customer, r.Period}] = i
	}
	rows, err := p.db.Query(ctx, p.claimSQL, customers, periods, keys, amounts, currencies, owners, p.cfg.Lease.Microseconds())
	if err != nil {
		return nil, p.claimErr(err)
	}
	out := make([]claimed, n)
	seen := 0
	for rows.Next() {
		var live bool
		c, err := scanClaim(rows, &live)
		if err != nil {
			rows.Close()
			return nil, fmt.Errorf("claim: reading claims: %w", err)
		}
		var i int
		var ok bool
		if live {
			i, ok = byPeriod[[2]string{c.Customer, c.Period}]
		} else {
			i, ok = byKey[c.Key]
		}
		if !ok {
			rows.Close()
			return nil, fmt.Errorf("claim: the database returned claim %q that was not requested", c.Key)
		}
		if m := compare(reqs[i], c); m != nil {
			out[i] = claimed{Result{Mismatch, c}, m}
		} else {
			out[i] = claimed{Result: Result{outcomeOf(reqs[i], c), c}}
		}
		seen++
	}
	if err := rows.Err(); err != nil {
		return nil, p.claimErr(err)
	}
	if seen != n {
		return nil, fmt.Errorf("claim: the database answered %d of %d claims", seen, n)
	}
	return out, nil
}

func (p *Postgres) claimErr(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "23505" && pgErr.ConstraintName == p.names.liveIndex {
		return fmt.Errorf("claim: a concurrent claim took the same customer and period under another key; nothing was claimed, retry to see it: %w", err)
	}
	return fmt.Errorf("claim: %w", err)
}

func scanClaim(row pgx.Row, prefix ...any) (Claim, error) {
	var c Claim
	var state string
	var ageMicros int64
	dest := append(prefix, &c.Customer, &c.Period, &c.Key, &c.Amount, &c.Currency, &state, &c.StripeID, &c.Attempts,
		&c.Owner, &c.LeaseUntil, &c.LastError, &c.CreatedAt, &c.UpdatedAt, &ageMicros)
	if err := row.Scan(dest...); err != nil {
		return Claim{}, err
	}
	c.State = State(state)
	c.Age = time.Duration(ageMicros) * time.Microsecond
	return c, nil
}

// Renew extends owner's lease on key by the configured lease, from now on
// the database clock. See [Store].
func (p *Postgres) Renew(ctx context.Context, key, owner string) error {
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

// lost explains why owner's update of key matched no row.
func (p *Postgres) lost(ctx context.Context, key, owner string) error {
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return fmt.Errorf("%w: claim %q is %s and held by %q, not %q", ErrLeaseLost, key, c.State, c.Owner, owner)
}

// Release gives up owner's lease on key, recording lastErr. See [Store].
func (p *Postgres) Release(ctx context.Context, key, owner, lastErr string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateText("error", lastErr)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET owner = '', lease_until = now(), last_error = $3, updated_at = now()
		WHERE key = $1 AND owner = $2 AND state = 'pending'`, key, owner, lastErr)
	if err != nil {
		return fmt.Errorf("claim: releasing %q: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	return p.lost(ctx, key, owner)
}

// Succeed records that key was charged as stripeID. It does not check the
// lease: an answer from Stripe is the truth whoever receives it. See [Store].
func (p *Postgres) Succeed(ctx context.Context, key, stripeID string) error {
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
		return fmt.Errorf("%w: claim %q already succeeded as %q, not %q", ErrConflict, c.Key, c.StripeID, stripeID)
	default:
		return fmt.Errorf("%w: claim %q is %s (%s); it cannot succeed as %q", ErrConflict, c.Key, c.State, c.LastError, stripeID)
	}
}

// Fail records that key failed definitively. It does not check the lease.
// See [Store].
func (p *Postgres) Fail(ctx context.Context, key, reason string) error {
	if err := errors.Join(validateID("key", key), validateText("reason", reason)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET state = 'failed', last_error = $2, updated_at = now()
		WHERE key = $1 AND state = 'pending'`, key, reason)
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
	return fmt.Errorf("%w: claim %q already succeeded as %q; it cannot fail", ErrConflict, c.Key, c.StripeID)
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

// Pending lists pending claims created at least olderThan ago on the
// database clock. See [Store].
func (p *Postgres) Pending(ctx context.Context, olderThan time.Duration) ([]Claim, error) {
	if olderThan < 0 {
		return nil, fmt.Errorf("%w: age %v is negative", ErrInvalid, olderThan)
	}
	return p.list(ctx, ` WHERE state = 'pending' AND created_at <= now() - $1 * interval '1 microsecond'
		ORDER BY created_at, key`, olderThan.Microseconds())
}

// Stale lists pending claims whose lease has expired on the database
// clock. See [Store].
func (p *Postgres) Stale(ctx context.Context) ([]Claim, error) {
	return p.list(ctx, ` WHERE state = 'pending' AND lease_until <= now() ORDER BY created_at, key`)
}

func (p *Postgres) list(ctx context.Context, where string, args ...any) ([]Claim, error) {
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
