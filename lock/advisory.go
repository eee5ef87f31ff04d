package lock

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/internal/nilness"
)

// DefaultCheckInterval is how often a held advisory lock is confirmed when
// AdvisoryConfig.CheckInterval is zero.
const DefaultCheckInterval = time.Second

// minCheckInterval is the smallest accepted check or renew interval.
const minCheckInterval = 10 * time.Millisecond

// minCheckTimeout is the least time a single check is given to answer.
const minCheckTimeout = 5 * time.Second

// releaseTimeout bounds the unlock query; past it the connection is closed.
const releaseTimeout = 5 * time.Second

// AdvisoryConfig configures an [Advisory]. The zero value is usable.
type AdvisoryConfig struct {
	// Namespace is mixed into every key (see [Key]) so that unrelated
	// applications sharing a database do not collide. Defaults to "".
	Namespace string

	// CheckInterval is how often the lock is confirmed while a job runs.
	// A lost lock cancels the job within about one interval; a check that
	// gets no answer within max(CheckInterval, 5s) counts as lost.
	// Defaults to [DefaultCheckInterval]; at least 10ms.
	CheckInterval time.Duration

	// Wait is how long Lock (and so Do) keeps trying while another holder has
	// the lock. Defaults to 0: one try, no waiting.
	Wait time.Duration

	// Logger receives acquisitions, skips, lost locks and unconfirmed
	// releases. Defaults to discarding.
	Logger *slog.Logger
}

// Advisory is a [Locker] backed by a PostgreSQL session advisory lock
// (pg_try_advisory_lock) on a connection of its own.
//
// For each acquisition a connection is taken out of the pool for good
// (pgxpool's Hijack), the lock is taken on it, checked on it, released on it,
// and the connection is then closed: it never returns to the pool, so no
// pooled connection can carry a lock to an unrelated caller. The pool opens
// a replacement when it needs one. An attempt that does not win the lock
// gives the connection back untouched.
//
// An Advisory is safe for concurrent use.
type Advisory struct {
	pool   *pgxpool.Pool
	cfg    AdvisoryConfig
	logger *slog.Logger
}

var _ Locker = (*Advisory)(nil)

// NewAdvisory returns an Advisory that takes its connections from pool.
func NewAdvisory(pool *pgxpool.Pool, cfg AdvisoryConfig) (*Advisory, error) {
	if pool == nil {
		return nil, fmt.Errorf("%w: nil pool; pass the *pgxpool.Pool of the database that coordinates the replicas", ErrInvalid)
	}
	if err := checkName("namespace", cfg.Namespace, true); err != nil {
		return nil, err
	}
	if cfg.CheckInterval == 0 {
		cfg.CheckInterval = DefaultCheckInterval
	}
	if cfg.CheckInterval < minCheckInterval {
		return nil, fmt.Errorf("%w: CheckInterval %v is below the minimum %v; use 0 for the default %v",
			ErrInvalid, cfg.CheckInterval, minCheckInterval, DefaultCheckInterval)
	}
	if cfg.Wait < 0 {
		return nil, fmt.Errorf("%w: Wait %v is negative; use 0 to try once without waiting", ErrInvalid, cfg.Wait)
	}
	return &Advisory{pool: pool, cfg: cfg, logger: loggerOrDiscard(cfg.Logger)}, nil
}

func (a *Advisory) log() *slog.Logger { return a.logger }

// Lock implements [Locker]: it takes the session advisory lock [Key] of the
// namespace and name on a connection of its own. The Lock it returns is
// [Fenced]: its token is the PostgreSQL transaction id (xid8) of the
// statement that took the lock. An advisory lock has no row to check the
// token against; the package documentation, under "Fencing tokens", says
// how to check it in a table of your own.
func (a *Advisory) Lock(ctx context.Context, name string) (Lock, error) {
	if a == nil {
		return nil, errNilGuard("*lock.Advisory")
	}
	if err := checkName("name", name, false); err != nil {
		return nil, err
	}
	key := Key(a.cfg.Namespace, name)
	pc, err := a.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("lock: %q: taking a connection from the pool: %w", name, err)
	}
	var token *int64
	ok, err := pollUntil(ctx, a.cfg.Wait, func() (bool, error) {
		// Once the lock is granted, the statement's transaction id is the
		// holder's fencing token: the previous holder's session had let
		// the lock go, after its own token was taken.
		err := pc.QueryRow(ctx, "SELECT CASE WHEN pg_try_advisory_lock($1) THEN pg_current_xact_id()::text::bigint END", key).Scan(&token)
		return token != nil, err
	})
	if err != nil {
		// The lock may or may not have been taken: the connection must not
		// go back to the pool.
		closeConn(pc.Hijack())
		return nil, fmt.Errorf("lock: %q: pg_try_advisory_lock: %w", name, err)
	}
	if !ok {
		pc.Release() // pg_try_advisory_lock returned false: nothing was taken
		return nil, ErrNotAcquired
	}
	conn := pc.Hijack()
	pid := conn.PgConn().PID()
	classID, objID := splitKey(key)
	a.logger.Debug("advisory lock acquired", "name", name, "key", key, "backend_pid", pid, "token", *token)

	check := func(ctx context.Context) error {
		var held bool
		if err := conn.QueryRow(ctx, checkSQL, classID, objID).Scan(&held); err != nil {
			return fmt.Errorf("checking the lock on backend %d: %w", pid, err)
		}
		if !held {
			return fmt.Errorf("backend %d no longer holds advisory lock %d", pid, key)
		}
		return nil
	}
	release := func(ctx context.Context, lost bool) error {
		defer closeConn(conn) // the server drops whatever the session still holds
		if lost {
			return nil
		}
		if conn.IsClosed() {
			return fmt.Errorf("the connection to backend %d closed before the release; the lock ended with it", pid)
		}
		ctx, cancel := context.WithTimeout(ctx, releaseTimeout)
		defer cancel()
		var unlocked bool
		if err := conn.QueryRow(ctx, "SELECT pg_advisory_unlock($1)", key).Scan(&unlocked); err != nil {
			return fmt.Errorf("pg_advisory_unlock on backend %d: %w; connection closed instead", pid, err)
		}
		if !unlocked {
			return fmt.Errorf("pg_advisory_unlock on backend %d: the session did not hold lock %d", pid, key)
		}
		return nil
	}
	return newHeld(name, *token, a.cfg.CheckInterval, max(a.cfg.CheckInterval, minCheckTimeout), a.logger, check, release), nil
}

// checkSQL reports whether this session holds the advisory lock whose
// bigint key is split into classid (high 32 bits) and objid (low 32 bits);
// objsubid 1 marks a single-bigint key.
const checkSQL = `SELECT EXISTS (
	SELECT 1 FROM pg_locks
	WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid()
	  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
	  AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1)`

func splitKey(key int64) (classID, objID int64) {
	u := uint64(key)
	return int64(u >> 32), int64(u & 0xffffffff)
}

func closeConn(conn *pgx.Conn) {
	ctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
	defer cancel()
	conn.Close(ctx)
}

// TryXact takes the transaction-scoped advisory lock for namespace and name
// (pg_try_advisory_xact_lock with [Key]) inside the caller's transaction and
// reports whether it got it. The lock is released when tx commits or rolls
// back; there is no unlock. Use it for short critical sections that already
// run in a transaction; it also works through PgBouncer in transaction mode.
func TryXact(ctx context.Context, tx pgx.Tx, namespace, name string) (bool, error) {
	if nilness.Is(tx) {
		return false, fmt.Errorf("%w: nil transaction; begin one and pass it, the lock lives until it ends", ErrInvalid)
	}
	if err := checkName("namespace", namespace, true); err != nil {
		return false, err
	}
	if err := checkName("name", name, false); err != nil {
		return false, err
	}
	var ok bool
	if err := tx.QueryRow(ctx, "SELECT pg_try_advisory_xact_lock($1)", Key(namespace, name)).Scan(&ok); err != nil {
		return false, fmt.Errorf("lock: %q: pg_try_advisory_xact_lock: %w", name, err)
	}
	return ok, nil
}
