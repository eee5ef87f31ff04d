package claim_test

import (
	"context"
	"slices"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// Tables whose names contain the default name, and a schema named like the
// table, share one database with a default table, all made by v1 billonce.
// Migrating each upgrades that table alone, keeps its rows, and leaves the
// others as they were until their own Migrate.
func TestMigrateNamesAroundTheDefaultReachOnlyTheirTable(t *testing.T) {
	cfgs := []claim.Config{
		{Table: "billonce_claims_v2"},
		{Table: "x_billonce_claims"},
		{Table: "billonce_claims_events_archive"},
		{Schema: "billonce_claims"},
		{Schema: "billonce_claims", Table: "billonce_claims_migrations_x"},
		{},
	}
	pool := pgtest.Pool(t)
	ctx := context.Background()
	if _, err := pool.Exec(ctx, "CREATE SCHEMA billonce_claims"); err != nil {
		t.Fatal(err)
	}
	for _, cfg := range cfgs {
		table, _ := names(cfg)
		if _, err := pool.Exec(ctx, v1SQL(t, cfg)); err != nil {
			t.Fatal(err)
		}
		if _, err := pool.Exec(ctx, "INSERT INTO "+table+` (key, customer, period, amount, currency, state, stripe_id, owner, lease_until) VALUES
			('k_pending', 'cus_1', '2025-01', 4200, 'usd', 'pending', '', 'pod-a', '2025-01-01 10:02:00Z'),
			('k_ok', 'cus_2', '2025-01', 1500, 'eur', 'succeeded', 'ch_1', 'pod-a', '2025-01-01 10:02:00Z'),
			('k_fail', 'cus_3', '2025-01', 900, 'usd', 'failed', '', 'pod-b', '2025-01-01 10:02:00Z')`); err != nil {
			t.Fatal(err)
		}
	}
	before := make([][]string, len(cfgs))
	for i, cfg := range cfgs {
		before[i] = rows(t, pool, cfg, v1Columns)
	}
	for i, cfg := range cfgs {
		s := migrate(t, pool, cfg)
		for j, other := range cfgs {
			if got := rows(t, pool, other, v1Columns); !slices.Equal(got, before[j]) {
				t.Errorf("after migrating %+v, the rows of %+v are %q, want %q", cfg, other, got, before[j])
			}
			if j > i {
				table, _ := names(other)
				var n int
				if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_attribute WHERE attrelid = to_regclass($1) AND attname = 'scope'", table).Scan(&n); err != nil {
					t.Fatal(err)
				}
				if n != 0 {
					t.Errorf("migrating %+v reached %+v's table", cfg, other)
				}
			}
			// Migration 13 drops the index of pending claims by time of
			// its own table only, wherever the other tables are.
			table, _ := names(other)
			var byTime, byKey int
			if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_get_indexdef(indexrelid) LIKE '%(created_at) WHERE (state = ''pending''::text)'),
				count(*) FILTER (WHERE pg_get_indexdef(indexrelid) LIKE '%(key) WHERE (state = ''pending''::text)')
				FROM pg_index WHERE indrelid = to_regclass($1)`, table).Scan(&byTime, &byKey); err != nil {
				t.Fatal(err)
			}
			if migrated := j <= i; byTime != map[bool]int{false: 1}[migrated] || byKey != map[bool]int{true: 1}[migrated] {
				t.Errorf("after migrating %+v, %+v's table has %d index(es) of pending claims by time and %d by key; want them migrated: %v", cfg, other, byTime, byKey, migrated)
			}
		}
		if got, want := record(t, pool, cfg), wantRecord(t); !slices.Equal(got, want) {
			t.Errorf("%+v: record = %q, want %q", cfg, got, want)
		}
		mustClaim(t, engineOf(s), claimengine.Request{Customer: "cus_2", Period: "2025-01", Key: "k_ok", Amount: 1500, Currency: "eur", Owner: "pod-c"}, claimengine.Succeeded)
		mustClaim(t, engineOf(s), claimengine.Request{Customer: "cus_1", Period: "2025-01", Key: "k_pending", Amount: 4200, Currency: "usd", Owner: "pod-c"}, claimengine.Resumed)
		before[i] = rows(t, pool, cfg, v1Columns)
	}
}
