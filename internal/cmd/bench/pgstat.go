package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// roundTrips is a pgx tracer that counts what a pool sends to PostgreSQL
// and waits for: each query or exec (a transaction's begin and commit
// included), each batch (one round trip however many statements it
// holds), each COPY, and each statement prepared anew on a connection.
// The pool's pings of idle connections go below pgx's tracing and are not
// counted.
type roundTrips struct{ n atomic.Int64 }

func (t *roundTrips) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (*roundTrips) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (t *roundTrips) TraceBatchStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceBatchStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (*roundTrips) TraceBatchQuery(context.Context, *pgx.Conn, pgx.TraceBatchQueryData) {}
func (*roundTrips) TraceBatchEnd(context.Context, *pgx.Conn, pgx.TraceBatchEndData)     {}

func (t *roundTrips) TraceCopyFromStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceCopyFromStartData) context.Context {
	t.n.Add(1)
	return ctx
}

func (*roundTrips) TraceCopyFromEnd(context.Context, *pgx.Conn, pgx.TraceCopyFromEndData) {}

func (*roundTrips) TracePrepareStart(ctx context.Context, _ *pgx.Conn, _ pgx.TracePrepareStartData) context.Context {
	return ctx
}

func (t *roundTrips) TracePrepareEnd(_ context.Context, _ *pgx.Conn, d pgx.TracePrepareEndData) {
	if !d.AlreadyPrepared {
		t.n.Add(1)
	}
}

// newPool is pgxpool.New with a roundTrips tracer on every connection.
func newPool(ctx context.Context, url string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.ConnConfig.Tracer = &roundTrips{}
	return pgxpool.NewWithConfig(ctx, cfg)
}

// tripsOf is the round-trip counter of a pool made by newPool.
func tripsOf(p *pgxpool.Pool) *roundTrips {
	t, _ := p.Config().ConnConfig.Tracer.(*roundTrips)
	if t == nil {
		panic("bench: pool without a round-trip counter")
	}
	return t
}

// pgMark is a reading of what PostgreSQL has done so far: the round trips
// one pool sent, and the position in the WAL of the whole cluster.
type pgMark struct{ trips, wal int64 }

// mark reads pool's round trips and the cluster's WAL insert position, the
// latter on a connection of its own (not counted, and not pool's).
// pg_current_wal_insert_lsn, not pg_current_wal_lsn: with
// synchronous_commit off, the write position lags the records inserted.
func (e *env) mark(ctx context.Context, pool *pgxpool.Pool) (pgMark, error) {
	if e.walConn == nil {
		u, err := e.cluster.NewDatabase(ctx)
		if err != nil {
			return pgMark{}, err
		}
		if e.walConn, err = pgx.Connect(ctx, u); err != nil {
			return pgMark{}, err
		}
	}
	var m pgMark
	if err := e.walConn.QueryRow(ctx, `SELECT (pg_current_wal_insert_lsn() - '0/0'::pg_lsn)::bigint`).Scan(&m.wal); err != nil {
		return pgMark{}, fmt.Errorf("reading the WAL position: %w", err)
	}
	m.trips = tripsOf(pool).n.Load()
	return m, nil
}

// pgPer is what PostgreSQL did per unit between two marks.
type pgPer struct{ trips, wal float64 }

func (m pgMark) per(from pgMark, units int) pgPer {
	return pgPer{float64(m.trips-from.trips) / float64(units), float64(m.wal-from.wal) / float64(units)}
}

// pgNote is the note of the medians of ps: "PostgreSQL per charge: 0.03
// round trips, 1,310 B WAL".
func pgNote(unit string, ps []pgPer) string {
	var trips, wal []float64
	for _, p := range ps {
		trips, wal = append(trips, p.trips), append(wal, p.wal)
	}
	return fmt.Sprintf("PostgreSQL per %s: %.2f round trips, %s B WAL", unit, median(trips), thousands(median(wal)))
}

// thousands is x rounded, with commas between groups of three digits.
func thousands(x float64) string {
	s := strconv.FormatInt(int64(x+0.5), 10)
	for i := len(s) - 3; i > 0 && s[i-1] != '-'; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
