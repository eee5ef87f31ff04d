package main

import (
	"context"
	"io"
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

// benchPeriod returns a claim store whose period holds benchClaims
// claims, one in a hundred declined (so that status lists its failures).
func benchPeriod(b *testing.B) (*pgxpool.Pool, *claim.Postgres) {
	b.Helper()
	ctx := context.Background()
	pool := pgtest.Pool(b)
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
	if _, err := pool.Exec(ctx, `ANALYZE billonce_claims`); err != nil {
		b.Fatal(err)
	}
	return pool, store
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
// claims against the baseline of one query per claim, in the same run:
//
//	go test -run '^$' -bench BenchmarkReadAPeriod -benchtime 3x ./billing/cmd/billonce/
func BenchmarkReadAPeriod(b *testing.B) {
	pool, store := benchPeriod(b)
	ctx := context.Background()
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
			st, err := statusOf(ctx, pool, store, period, billing.DefaultSettleAfter)
			if err != nil || len(st.Failures) != benchClaims/100 {
				b.Fatalf("%d failures, %v", len(st.Failures), err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/period")
	})
	b.Run("export", func(b *testing.B) {
		for b.Loop() {
			rows, err := exportRows(ctx, store, period)
			if err != nil || len(rows) != benchClaims {
				b.Fatalf("%d rows, %v", len(rows), err)
			}
			if err := writeCSV(io.Discard, rows); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Milliseconds())/float64(b.N), "ms/period")
	})
}
