package lock

import (
	"context"
	"crypto/rand"
	"embed"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"os"
	"regexp"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/internal/migrate"
	"github.com/billonce/billonce/internal/nilness"
)

// DefaultLeaseTTL is how long a lease lasts without renewal when
// [LeaseConfig].TTL is zero.
const DefaultLeaseTTL = 30 * time.Second

// DefaultLeaseTable is the table [Lease] keeps its leases in when
// LeaseConfig.Table is empty. [Lease.Migrate] creates it; the files of
// the package's migrations directory create it too.
const DefaultLeaseTable = "billonce_lock_leases"

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// LeaseConfig configures a [Lease]. The zero value is usable.
type LeaseConfig struct {
	// Table is the lease table's name: letters, digits and underscores, at
	// most 50 characters. Defaults to [DefaultLeaseTable].
	Table string

	// Namespace separates the names of unrelated applications sharing the
	// table. Defaults to "".
	Namespace string

	// TTL is how long a lease lasts past its last renewal, on the database
	// clock. A holder that dies is replaced after at most TTL. So is one
	// paused for longer (SIGSTOP, a GC or VM pause): once it resumes, its
	// job goes on until its first renewal fails, up to RenewInterval and a
	// round trip later, but writes that check its fencing token are
	// refused from the moment the new holder took the lease (the package
	// documentation, under "Fencing tokens").
	// Defaults to [DefaultLeaseTTL].
	TTL time.Duration

	// RenewInterval is how often a held lease is extended to now() + TTL.
	// A renewal that fails, or gets no answer by the time the lease would
	// run out (TTL-RenewInterval after it starts), cancels the job, which is
	// therefore told before the lease can expire.
	// Defaults to TTL/3; at most TTL/2 and at least 10ms.
	RenewInterval time.Duration

	// Wait is how long Lock (and so Do) keeps trying while another holder has
	// the lease. Defaults to 0: one try, no waiting.
	Wait time.Duration

	// Logger receives acquisitions, skips, lost leases and unconfirmed
	// releases. Defaults to discarding.
	Logger *slog.Logger
}

// Lease is a [Locker] backed by a row per name in its table: an owner, a
// fencing token and an expiry (lock_until) on the database clock,
// extended every RenewInterval while the job runs and deleted when it
// ends. Unlike [Advisory] it needs no session state, so it works through
// PgBouncer in transaction mode. A holder can only renew or delete a row
// that still carries its own owner, so a stale holder cannot touch a
// newer holder's lease. A holder paused past its TTL may still act, for
// up to a renewal interval, after another took the lease over; writes
// that check its token ([Token]) against the lease row are refused from
// then on: see the package documentation, under "Fencing tokens".
//
// A Lease is safe for concurrent use.
type Lease struct {
	db     *pgxpool.Pool
	cfg    LeaseConfig
	logger *slog.Logger
	owner  string // process part of every owner token
	table  string // quoted
}

var _ Locker = (*Lease)(nil)

// NewLease returns a Lease on pool. Call [Lease.Migrate] once before use.
//
// It takes a pool, not a connection or a transaction: renewals run
// concurrently with the job, and the lease rows must be committed as soon
// as they are written. Each statement stands alone, so a pool behind
// PgBouncer in transaction mode works.
func NewLease(db *pgxpool.Pool, cfg LeaseConfig) (*Lease, error) {
	if nilness.Is(db) {
		return nil, fmt.Errorf("%w: nil database; pass a *pgxpool.Pool", ErrInvalid)
	}
	if err := checkName("namespace", cfg.Namespace, true); err != nil {
		return nil, err
	}
	if cfg.Table == "" {
		cfg.Table = DefaultLeaseTable
	}
	if !identRE.MatchString(cfg.Table) || len(cfg.Table) > 50 {
		return nil, fmt.Errorf("%w: LeaseConfig.Table %q must be 1 to 50 letters, digits or underscores, not starting with a digit", ErrInvalid, cfg.Table)
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultLeaseTTL
	}
	if cfg.RenewInterval == 0 {
		cfg.RenewInterval = cfg.TTL / 3
	}
	switch {
	case cfg.TTL < 2*minCheckInterval:
		return nil, fmt.Errorf("%w: TTL %v is too short; use at least %v, or 0 for the default %v",
			ErrInvalid, cfg.TTL, 2*minCheckInterval, DefaultLeaseTTL)
	case cfg.RenewInterval < minCheckInterval:
		return nil, fmt.Errorf("%w: RenewInterval %v is below the minimum %v; use 0 for TTL/3",
			ErrInvalid, cfg.RenewInterval, minCheckInterval)
	case 2*cfg.RenewInterval > cfg.TTL:
		return nil, fmt.Errorf("%w: RenewInterval %v is more than half of TTL %v, so a failed renewal could go unnoticed until the lease expires; use 0 for TTL/3",
			ErrInvalid, cfg.RenewInterval, cfg.TTL)
	case cfg.Wait < 0:
		return nil, fmt.Errorf("%w: Wait %v is negative; use 0 to try once without waiting", ErrInvalid, cfg.Wait)
	}
	host, _ := os.Hostname()
	return &Lease{db: db, cfg: cfg, logger: loggerOrDiscard(cfg.Logger), owner: fmt.Sprintf("%s/%d", host, os.Getpid()),
		table: pgx.Identifier{cfg.Table}.Sanitize()}, nil
}

// ErrNewerSchema is returned by [Lease.Migrate] when the lease table was
// migrated by a newer billonce than this binary. Migrate changes nothing
// then; upgrade the binary.
var ErrNewerSchema = migrate.ErrNewerSchema

// leaseMigrationFiles holds the lease table's migrations, one file each,
// named NNNN_name.sql with NNNN the version, written for
// DefaultLeaseTable.
//
//go:embed migrations/*.sql
var leaseMigrationFiles embed.FS

var leaseMigrations = migrate.Load(leaseMigrationFiles, "migrations")

// Migrate brings the lease table up to date: it applies each migration of
// the package's migrations directory that the record table (named after
// the lease table with _migrations appended) does not list, and lists it,
// in one transaction under an advisory lock, so every replica may call it
// at start-up at once. A table made by an earlier billonce is kept as it
// is; one made by applying the files with psql or a migration tool is
// found up to date. Once the table is up to date Migrate only reads the
// record, so a role without CREATE privileges can call it. If the record
// holds a version newer than this binary knows, it changes nothing and
// returns an error wrapping [ErrNewerSchema].
func (l *Lease) Migrate(ctx context.Context) error {
	if l == nil {
		return errNilGuard("*lock.Lease")
	}
	h := fnv.New64a()
	h.Write([]byte("billonce/lock/migrate " + l.table))
	return migrate.Set{
		Owner:  "lock",
		Record: l.cfg.Table + "_migrations", // at most 61 characters: Table is at most 50
		Table:  l.cfg.Table,
		Lock:   int64(h.Sum64()),
		Migrations: migrate.Rename(leaseMigrations, migrate.Names{
			Default: DefaultLeaseTable,
			Tables:  []string{"", "_migrations"},
			Others:  []string{"_token"}, // the index on token
			Name:    l.cfg.Table,
		}),
	}.Run(ctx, l.db)
}

func (l *Lease) log() *slog.Logger { return l.logger }

// Table returns the name of the lease table, LeaseConfig.Table or
// [DefaultLeaseTable], unquoted: the table a write checks a lease's
// fencing token against (the package documentation, under "Fencing
// tokens").
func (l *Lease) Table() string {
	if l == nil {
		return ""
	}
	return l.cfg.Table
}

// Lock implements [Locker]. It takes the lease if no row exists for name
// or the row's lock_until has passed on the database clock. The Lock it
// returns is [Fenced]: its token is the PostgreSQL transaction id (xid8)
// of the statement that took the lease, recorded in the lease row.
func (l *Lease) Lock(ctx context.Context, name string) (Lock, error) {
	if l == nil {
		return nil, errNilGuard("*lock.Lease")
	}
	if err := checkName("name", name, false); err != nil {
		return nil, err
	}
	var nonce [12]byte
	rand.Read(nonce[:])
	// A fresh token per acquisition: a second Lock in the same process
	// is a different owner and is refused while the first holds the lease.
	owner := l.owner + "/" + hex.EncodeToString(nonce[:])
	ttl := l.cfg.TTL.Microseconds()
	var token int64
	ok, err := pollUntil(ctx, l.cfg.Wait, func() (bool, error) {
		// The token is this statement's transaction id: transaction ids
		// only grow, so a holder that takes the lease after another gets
		// a greater one, and no two holders share one.
		err := l.db.QueryRow(ctx, `INSERT INTO `+l.table+` AS t (namespace, name, owner, locked_at, lock_until, token)
			VALUES ($1, $2, $3, now(), now() + $4 * interval '1 microsecond', pg_current_xact_id()::text::bigint)
			ON CONFLICT (namespace, name) DO UPDATE
			SET owner = excluded.owner, locked_at = excluded.locked_at, lock_until = excluded.lock_until, token = excluded.token
			WHERE t.lock_until <= now()
			RETURNING token`, l.cfg.Namespace, name, owner, ttl).Scan(&token)
		if errors.Is(err, pgx.ErrNoRows) {
			return false, nil
		}
		return err == nil, err
	})
	if err != nil {
		// The insert may have committed before the error: drop the row if it
		// is ours rather than leave it to expire.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), releaseTimeout)
		defer cancel()
		l.db.Exec(dctx, `DELETE FROM `+l.table+` WHERE namespace = $1 AND name = $2 AND owner = $3`, l.cfg.Namespace, name, owner)
		return nil, fmt.Errorf("lock: %q: taking the lease: %w", name, err)
	}
	if !ok {
		return nil, ErrNotAcquired
	}
	l.logger.Debug("lease acquired", "name", name, "owner", owner, "token", token)

	renew := func(ctx context.Context) error {
		tag, err := l.db.Exec(ctx, `UPDATE `+l.table+`
			SET lock_until = now() + $4 * interval '1 microsecond'
			WHERE namespace = $1 AND name = $2 AND owner = $3 AND lock_until > now()`,
			l.cfg.Namespace, name, owner, ttl)
		if err != nil {
			return fmt.Errorf("renewing the lease: %w", err)
		}
		if tag.RowsAffected() == 0 {
			return errors.New("the lease expired or was taken over")
		}
		return nil
	}
	release := func(ctx context.Context, lost bool) error {
		ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		tag, err := l.db.Exec(ctx, `DELETE FROM `+l.table+` WHERE namespace = $1 AND name = $2 AND owner = $3`,
			l.cfg.Namespace, name, owner)
		if err != nil {
			return fmt.Errorf("deleting the lease: %w; it expires by itself within %v", err, l.cfg.TTL)
		}
		if tag.RowsAffected() == 0 && !lost {
			return errors.New("the lease was no longer ours when released")
		}
		return nil
	}
	// A renewal may take until the lease would run out: the last success
	// was at most RenewInterval before it started, so TTL-RenewInterval
	// later the lease is either renewed or reported lost, never silently
	// expired. A slow database is not a lost lease.
	return newHeld(name, token, l.cfg.RenewInterval, l.cfg.TTL-l.cfg.RenewInterval, l.logger, renew, release), nil
}
