package locks

import (
	"context"
	"database/sql"

	"github.com/jackc/pgx/v5/pgxpool"
)

// ---- reported ----

func poolLockUnlock(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	var ok bool
	if err := pool.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil { // want `session advisory lock taken through a \*pgxpool.Pool: the lock belongs to whichever pooled session ran the statement`
		return err
	}
	_, err := pool.Exec(ctx, "SELECT pg_advisory_unlock($1)", key) // want `pg_advisory_unlock sent through a \*pgxpool.Pool runs on whichever pooled session is free`
	return err
}

const unlockSQL = "select PG_ADVISORY_UNLOCK($1)"

func dbUnlock(ctx context.Context, db *sql.DB, key int64) error {
	q := unlockSQL
	_, err := db.ExecContext(ctx, q, key) // want `pg_advisory_unlock sent through a \*sql.DB`
	return err
}

func dbLock(ctx context.Context, db *sql.DB, key int64) error {
	_, err := db.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key) // want `session advisory lock taken through a \*sql.DB`
	return err
}

func xactOutsideTx(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	_, err := pool.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key) // want `transaction advisory lock taken through a \*pgxpool.Pool outside a transaction: the statement is its own transaction, so the lock is released as soon as it returns`
	return err
}

// ---- not reported ----

func pinned(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	var ok bool
	if err := conn.QueryRow(ctx, "SELECT pg_try_advisory_lock($1)", key).Scan(&ok); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	return err
}

func sqlConn(ctx context.Context, db *sql.DB, key int64) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return err
	}
	_, err = conn.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key)
	return err
}

func xactInTx(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	tx, err := pool.Begin(ctx)
	if err != nil {
		return err
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		return err
	}
	return tx.Commit(ctx)
}

// Locked and unlocked in one statement: one session.
func oneStatement(ctx context.Context, pool *pgxpool.Pool, key int64) error {
	_, err := pool.Exec(ctx, "SELECT pg_advisory_lock_shared($1), pg_advisory_unlock_shared($1)", key)
	return err
}

// Asking about locks is not taking one.
func inspect(ctx context.Context, pool *pgxpool.Pool) error {
	_, err := pool.Exec(ctx, "SELECT objid FROM pg_locks WHERE locktype = 'advisory'")
	return err
}
