package locks

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jmoiron/sqlx"
)

// ---- reported ----

func sqlxLock(db *sqlx.DB, key int64) error {
	var ok bool
	return db.Get(&ok, "SELECT pg_try_advisory_lock($1)", key) // want `session advisory lock taken through a \*sqlx.DB`
}

func sqlxUnlock(ctx context.Context, db *sqlx.DB, key int64) error {
	_, err := db.ExecContext(ctx, "SELECT pg_advisory_unlock($1)", key) // want `pg_advisory_unlock sent through a \*sqlx.DB`
	return err
}

type store struct{ db *sql.DB }

func (s *store) unlock(ctx context.Context, key int64) error {
	_, err := s.db.ExecContext(ctx, fmt.Sprintf("SELECT pg_advisory_unlock(%d)", key)) // want `pg_advisory_unlock sent through a \*sql.DB`
	return err
}

func concatenated(ctx context.Context, db *sqlx.DB, key int64) error {
	_, err := db.ExecContext(ctx, "SELECT pg_advisory_lock("+strconv.FormatInt(key, 10)+")") // want `session advisory lock taken through a \*sqlx.DB`
	return err
}

func declaredQuery(ctx context.Context, db *sql.DB, key int64) error {
	var q string
	q = "SELECT pg_advisory_unlock($1)"
	_, err := db.ExecContext(ctx, q, key) // want `pg_advisory_unlock sent through a \*sql.DB`
	return err
}

// ---- not reported ----

func pgxConn(ctx context.Context, dsn string, key int64) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return err
	}
	if _, err := conn.Exec(ctx, "SELECT pg_advisory_lock($1)", key); err != nil {
		return err
	}
	_, err = conn.Exec(ctx, "SELECT pg_advisory_unlock($1)", key)
	return err
}

func sqlxConn(ctx context.Context, db *sqlx.DB, key int64) error {
	conn, err := db.Connx(ctx)
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

func sqlTx(ctx context.Context, db *sql.DB, key int64) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "SELECT pg_advisory_xact_lock($1)", key); err != nil {
		return err
	}
	return tx.Commit()
}
