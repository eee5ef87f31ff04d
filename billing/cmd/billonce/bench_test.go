package main

import (
	"context"
	"io"
	"sync/atomic"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// benchClaims is the size of the period status and export read in the
// benchmarks: a large month.
const benchClaims = 100_000

// benchRefunds and benchTransfers are the claims made for the period
// beside its bills: refunds of its payments, and a transfer to each of as
// many connected accounts.
const (
	benchRefunds   = benchClaims / 100
	benchTransfers = 100
)

// queries counts the queries a pool's connections send.
type queries struct{ n atomic.Int64 }

func (q *queries) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	q.n.Add(1)
	return ctx
}

func (q *queries) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// benchPeriod returns a claim store whose period holds benchClaims
// claims, one in a hundred declined (so that status lists its failures),
// with benchRefunds refunds and benchTransfers transfers made for it, on
// a pool that counts its queries.
func benchPeriod(b *testing.B) (*pgxpool.Pool, *claim.Postgres, *queries) {
	b.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(b))
	if err != nil {
		b.Fatal(err)
	}
	q := &queries{}
	cfg.ConnConfig.Tracer = q
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(pool.Close)
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		b.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billonce_claims (key, customer, period, amount, currency, state, stripe_id, last_error, attempt, scope, endpoint)
		SELECT 'bo1_bench_' || i, 'cus_' || i, $1, 2500, 'usd',
			CASE WHEN i % 100 = 0 THEN 'failed' ELSE 'succeeded' END, 'ch_' || i,
			CASE WHEN i % 100 = 0 THEN 'card_declined (insufficient_funds): Your card has insufficient funds.' ELSE '' END,
			1, 'billonce', 'charges'
		FROM generate_series(1, $2::int) AS i`, period, benchClaims); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billonce_claims (key, customer, period, amount, currency, state, stripe_id, attempt, scope, endpoint, refund_of)
		SELECT 'bo1_bench_refund_' || i, 'cus_' || i, $1 || ' refund rma-' || i, 500, 'usd', 'succeeded', 're_' || i, 1, 'billonce', 'refunds', 'bo1_bench_' || i
		FROM generate_series(1, $2::int) AS i`, period, benchRefunds); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO billonce_claims (key, customer, period, amount, currency, state, stripe_id, attempt, scope, endpoint)
		SELECT 'bo1_bench_transfer_' || i, 'acct_' || i, 'transfer ' || $1, 3000, 'usd', 'succeeded', 'tr_' || i, 1, 'billonce', 'transfers'
		FROM generate_series(1, $2::int) AS i`, period, benchTransfers); err != nil {
		b.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `ANALYZE billonce_claims`); err != nil {
		b.Fatal(err)
	}
	return pool, store, q
}

// perClaim reads a period as status and export did before they read it
// in one query: its keys, then each claim by its key. It is the baseline
// the benchmarks compare the commands with.
func perClaim(ctx context.Context, pool *pgxpool.Pool, store *claim.Postgres, period string) ([]claim.Claim, error) {
	rows, err := pool.Query(ctx, "SELECT key FROM billonce_claims WHERE period = $1 ORDER BY customer, attempt, created_at, key", period)
	if err != nil {
		return nil, err
	}
	keys, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, err
	}
	out := make([]claim.Claim, 0, len(keys))
	for _, k := range keys {
		c, err := store.Get(ctx, k)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, nil
}

// BenchmarkReadAPeriod measures status and export of a period of 100,000
// claims, with the refunds and transfers made for it, against the
// baseline of one query per claim, in the same run, and fails unless
// status and export each read them in one query:
//
//	go test -run '^$' -bench BenchmarkReadAPeriod -benchtime 3x ./billing/cmd/billonce/
func BenchmarkReadAPeriod(b *testing.B) {
	pool, store, q := benchPeriod(b)
	ctx := context.Background()
	// oneQuery runs read and fails unless it sent one query.
	oneQuery := func(b *testing.B, read func() error) {
		b.Helper()
		before := q.n.Load()
		if err := read(); err != nil {
			b.Fatal(err)
		}
		if n := q.n.Load() - before; n != 1 {
			b.Fatalf("%d queries; want one", n)
		}
	}
	b.Run("one query per claim", func(b *testing.B) {
		for b.Loop() {
			cs, err := perClaim(ctx, pool, store, period)
			if err != nil || len(cs) != benchClaims {
				b.Fatalf("%d claims, %v", len(cs), err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/period")
	})
	b.Run("status", func(b *testing.B) {
		for b.Loop() {
			oneQuery(b, func() error {
				st, err := statusOf(ctx, store, period, "", billing.DefaultSettleAfter)
				if err != nil || len(st.Failures) != benchClaims/100 || st.Refunds.Count != benchRefunds || st.Transfers.Count != benchTransfers {
					b.Fatalf("%d failures, %d refunds, %d transfers, %v", len(st.Failures), st.Refunds.Count, st.Transfers.Count, err)
				}
				return nil
			})
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/period")
	})
	b.Run("export", func(b *testing.B) {
		for b.Loop() {
			var rows []exportRow
			oneQuery(b, func() (err error) {
				rows, err = exportRows(ctx, store, period, "")
				return err
			})
			if len(rows) != benchClaims+benchRefunds+benchTransfers {
				b.Fatalf("%d rows", len(rows))
			}
			if err := writeCSV(io.Discard, rows); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/period")
	})
}
