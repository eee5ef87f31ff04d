package claim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A batch claim reads the rows its requests name, through indexes, however
// large the claim table has grown since the connection planned the
// statement: the generic plan a connection caches for it was made on a
// small table, and must not read the whole table (a sequential scan, or
// every failed claim) for each batch, or a billing run slows down with
// every claim it makes. Work is counted in rows PostgreSQL read, not time.
// The table grows with finished claims, and with pending ones: a run
// killed mid-way leaves its claims pending, and every later batch must
// not read them all.
func TestClaimBatchReadsNoMoreWhenTheTableGrows(t *testing.T) {
	for _, grown := range []struct{ name, state string }{
		{"succeeded and failed", "CASE WHEN g % 10 = 0 THEN 'failed' ELSE 'succeeded' END"},
		{"pending", "'pending'"},
	} {
		t.Run(grown.name, func(t *testing.T) { claimBatchReadsNoMoreWhenTheTableGrows(t, grown.state) })
	}
}

func claimBatchReadsNoMoreWhenTheTableGrows(t *testing.T, state string) {
	ctx := context.Background()
	pool, store := genericPlanStore(t)
	eng := engineOf(store)
	const size = 100
	batch := func(n int) {
		t.Helper()
		reqs := make([]claimengine.Request, size)
		for i := range reqs {
			reqs[i] = req(fmt.Sprintf("cus_b%d_%d", n, i), fmt.Sprintf("key_b%d_%d", n, i), "runner")
		}
		res, err := eng.ClaimBatch(ctx, reqs)
		if err != nil || len(res) != size {
			t.Fatalf("batch %d: %d results, %v", n, len(res), err)
		}
		for i, r := range res {
			if r.Outcome != claimengine.Won {
				t.Fatalf("batch %d, request %d: %v, want won", n, i, r.Outcome)
			}
		}
	}
	// The plan is made, and cached, on an almost empty table.
	for n := range 6 {
		batch(n)
	}
	// The table grows, unanalyzed; pending claims hold other runners'
	// leases, some expired.
	if _, err := pool.Exec(ctx, `INSERT INTO `+claim.DefaultTable+` (key, customer, period, amount, currency, state, stripe_id, owner, lease_until)
		SELECT 'old_' || g, 'cus_old_' || g, '2025-01', 4200, 'usd', `+state+`, 'ch_' || g, 'killed', now() + (g % 2) * interval '1 hour' - interval '30 minutes'
		FROM generate_series(1, 30000) g`); err != nil {
		t.Fatal(err)
	}
	read := func() int64 { return rowsRead(t, pool) }
	before := read()
	batch(100)
	got := read() - before
	t.Logf("a batch of %d claims read %d rows of a table of 30,000", size, got)
	if got > 20*size {
		t.Fatalf("a batch of %d claims read %d rows of a table of 30,000: want a few per claim, through indexes", size, got)
	}
}

// genericPlanStore returns a claim store on a pool of one connection
// that plans generic plans only, as a connection settles on after five
// runs of a statement, so that every call runs on the plan it cached;
// autovacuum is off, so that the table's statistics stay those the plans
// were made with.
func genericPlanStore(t *testing.T) (*pgxpool.Pool, *claim.Postgres) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "ALTER TABLE "+claim.DefaultTable+" SET (autovacuum_enabled = false)"); err != nil {
		t.Fatal(err)
	}
	return pool, store
}

// rowsRead is how many rows of the claim table PostgreSQL has read so
// far, by sequential scans and through indexes.
func rowsRead(t *testing.T, pool *pgxpool.Pool) (n int64) {
	t.Helper()
	ctx := context.Background()
	// This connection's counts reach the view once flushed.
	if _, err := pool.Exec(ctx, "SELECT pg_stat_force_next_flush()"); err != nil {
		t.Fatal(err)
	}
	if err := pool.QueryRow(ctx, `SELECT coalesce(seq_tup_read, 0) + coalesce(idx_tup_fetch, 0) FROM pg_stat_user_tables WHERE relname = $1`,
		claim.DefaultTable).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}
