package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/lock"
)

// conn is the database settings every subcommand shares.
type conn struct {
	databaseURL string
	dbTimeout   bound
	a           *app
}

func (c *conn) register(f *flags) {
	c.a = f.a
	f.StringVar(&c.databaseURL, "database-url", "", "PostgreSQL connection string (default $DATABASE_URL; required)")
	c.dbTimeout.register(f, "db-timeout", "the database: connecting, and each of the command's own reads, writes and migrations")
}

// bounded runs fn, one of the command's own calls to the database, under
// -db-timeout.
func (c *conn) bounded(ctx context.Context, fn func(context.Context) error) error {
	return c.dbTimeout.run(ctx, "the database", fn)
}

// A bound is how long one call the command makes itself to another
// machine may take, and the flag that sets it: a machine that accepts the
// connection and never answers must not keep a cron job from ending and
// alerting. Each machine has its own (the database, the spend-cap proxy,
// Stripe), so that each can be set to what it needs.
type bound struct {
	d    time.Duration
	flag string
}

// defaultBound is the default of every bound.
const defaultBound = 30 * time.Second

func (b *bound) register(f *flags, name, what string) {
	b.flag = name
	f.DurationVar(&b.d, name, defaultBound, "bound of each call to "+what)
}

// check returns a usage error for a bound that is not above 0.
func (b bound) check() error {
	if b.d <= 0 {
		return usageError("-%s %v: want a duration above 0, such as %v", b.flag, b.d, defaultBound)
	}
	return nil
}

// run runs fn, one call to what, within the bound. An error the bound
// caused names it and its flag.
func (b bound) run(ctx context.Context, what string, fn func(context.Context) error) error {
	bctx, cancel := context.WithTimeout(ctx, b.d)
	defer cancel()
	err := fn(bctx)
	if err != nil && ctx.Err() == nil && errors.Is(bctx.Err(), context.DeadlineExceeded) {
		return fmt.Errorf("%s gave no answer within %v (-%s): %w", what, b.d, b.flag, err)
	}
	return err
}

// pool returns a pool on the database, checked but not yet connected:
// pgxpool connects on first use.
func (c *conn) pool() (*pgxpool.Pool, error) {
	u := c.databaseURL
	if u == "" {
		u = c.a.getenv("DATABASE_URL")
	}
	if u == "" {
		return nil, usageError("no database: pass -database-url or set DATABASE_URL to the database that holds billonce's tables (postgres://user:password@host:5432/dbname)")
	}
	if err := c.dbTimeout.check(); err != nil {
		return nil, err
	}
	cfg, err := pgxpool.ParseConfig(u)
	if err != nil {
		// Not printed: the string may carry a password.
		return nil, usageError("the database connection string does not parse: want postgres://user:password@host:5432/dbname")
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		return nil, usageError("the database connection string: %v", err)
	}
	return pool, nil
}

// connect checks that the server of pool answers.
func (c *conn) connect(ctx context.Context, pool *pgxpool.Pool) error {
	db := "the database " + redactURL(pool.Config().ConnString())
	if err := c.dbTimeout.run(ctx, db, pool.Ping); err != nil {
		return fmt.Errorf("cannot reach %s: %w", db, err)
	}
	return nil
}

// open connects to the database, and checks that the server answers.
func (c *conn) open(ctx context.Context) (*pgxpool.Pool, error) {
	pool, err := c.pool()
	if err != nil {
		return nil, err
	}
	if err := c.connect(ctx, pool); err != nil {
		pool.Close()
		return nil, err
	}
	return pool, nil
}

// redactURL hides the password of a connection string.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(connection string not shown)"
	}
	return u.Redacted()
}

// biller is the Stripe settings of the subcommands that call Stripe.
type biller struct {
	conn
	stripeURL string
	api       string
	scope     string
	rate      float64
	lease     time.Duration
	// vault, when set, bills through a spend-cap proxy with a vault key
	// issued for the run once the database is open.
	vault *vaultRun
}

func (b *biller) register(f *flags) {
	b.conn.register(f)
	f.StringVar(&b.stripeURL, "stripe-url", "", "Stripe API base URL (default $STRIPE_URL, else "+billing.DefaultStripeURL+"); the key is $STRIPE_SECRET_KEY")
	f.StringVar(&b.api, "api", string(billing.Charges), "Stripe API: charges or payment_intents")
	f.StringVar(&b.scope, "scope", billing.DefaultScope, "first part of every idempotency key: the scope of the services that bill")
	f.Float64Var(&b.rate, "rate", billing.DefaultRateLimit, "Stripe requests per second, at most; negative: no limit")
	f.DurationVar(&b.lease, "lease", claim.DefaultLease, "how long a claim stays this runner's before another may resume it")
}

// session is an open database with a claim store, a lock and a Biller.
type session struct {
	pool   *pgxpool.Pool
	store  *claim.Postgres
	guard  *lock.Advisory
	biller *billing.Biller
	vault  *runKey // the run's vault key, if issued
}

func (s *session) close() { s.pool.Close() }

// unissuedVaultKey stands for the run's vault key while the settings are
// checked, before the proxy has issued it.
const unissuedVaultKey = "vault_key_not_issued_yet"

// open checks every setting, with the checks of billing, claim and the
// spend-cap client, and only then connects to the database (and has the
// proxy issue the run's vault key). price, when set, is the Biller's
// Config.Price.
func (b *biller) open(ctx context.Context, price func(context.Context, string, string) (billing.Price, error)) (*session, error) {
	key := b.a.getenv("STRIPE_SECRET_KEY")
	if key == "" && b.vault == nil {
		return nil, usageError("no Stripe key: set STRIPE_SECRET_KEY (a secret or restricted key, sk_… or rk_…); it is never taken from a flag")
	}
	su := b.stripeURL
	if su == "" {
		su = b.a.getenv("STRIPE_URL")
	}
	if su == "" {
		su = billing.DefaultStripeURL
	}
	if api := billing.API(b.api); api != billing.Charges && api != billing.PaymentIntents {
		return nil, usageError("-api %q: use charges or payment_intents", b.api)
	}
	if b.rate == 0 {
		return nil, usageError("-rate 0 would never send anything: want requests per second, or a negative number for no limit")
	}
	pool, err := b.conn.pool()
	if err != nil {
		return nil, err
	}
	s := &session{pool: pool}
	fail := func(err error) (*session, error) {
		if s.vault != nil {
			s.vault.end(ctx, b.a)
		}
		pool.Close()
		return nil, err
	}
	if s.store, err = claim.NewPostgres(pool, claim.Config{Lease: b.lease}); err != nil {
		return fail(usageError("-lease: %v", err))
	}
	if s.guard, err = lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billonce"}); err != nil {
		return fail(err)
	}
	cfg := billing.Config{
		SecretKey: key,
		StripeURL: su,
		Claims:    s.store,
		Price:     price,
		API:       billing.API(b.api),
		Scope:     b.scope,
		RateLimit: b.rate,
		Logger:    slog.New(slog.NewTextHandler(b.a.stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
	}
	if b.vault != nil {
		// The proxy holds the Stripe key: the process sends only the
		// vault key, to the proxy alone.
		if err := b.vault.check(b.a); err != nil {
			return fail(err)
		}
		cfg.SecretKey, cfg.StripeURL, cfg.Credential = unissuedVaultKey, b.vault.flags.proxyURL, b.vault.flags.credential
	}
	if _, err := billing.New(cfg); err != nil {
		if errors.Is(err, billing.ErrInvalid) {
			return fail(usageError("%v", err))
		}
		return fail(err)
	}

	// Every setting is checked: from here on the command talks to others.
	if err := b.conn.connect(ctx, pool); err != nil {
		return fail(err)
	}
	if err := b.bounded(ctx, s.store.Migrate); err != nil {
		return fail(fmt.Errorf("the claim table: %w (run billonce migrate with a role that may create tables)", err))
	}
	if b.vault != nil {
		// The cap covers what is still to bill, read from the period's
		// claims.
		var claims []claim.Claim
		if err := b.bounded(ctx, func(ctx context.Context) (err error) {
			claims, err = s.store.List(ctx, b.vault.period, "")
			return err
		}); err != nil {
			return fail(err)
		}
		if s.vault, err = b.vault.issue(ctx, b.a, billing.API(b.api), claims); err != nil {
			return fail(err)
		}
		cfg.SecretKey, cfg.HTTPClient = s.vault.key, s.vault.client
	}
	if s.biller, err = billing.New(cfg); err != nil {
		return fail(err)
	}
	return s, nil
}

// read runs fn, the reads of a subcommand that only reads claims, under
// -db-timeout, and turns PostgreSQL's "relation does not exist"
// into what to do about it.
func (c *conn) read(ctx context.Context, fn func(context.Context) error) error {
	err := c.bounded(ctx, fn)
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == undefinedTable {
		return fmt.Errorf("no claim table %s in this database (or its search_path): run billonce migrate, or check that -database-url (or DATABASE_URL) names the database the services bill with", claim.DefaultTable)
	}
	return err
}

// undefinedTable is PostgreSQL's SQLSTATE for a table that does not
// exist.
const undefinedTable = "42P01"

// store opens the database and its claim store, for the subcommands that
// only read claims.
func (c *conn) store(ctx context.Context) (*pgxpool.Pool, *claim.Postgres, error) {
	pool, err := c.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	st, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		pool.Close()
		return nil, nil, err
	}
	return pool, st, nil
}
