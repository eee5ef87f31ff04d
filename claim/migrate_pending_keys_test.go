package claim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A table at migration 12 whose index of pending claims by key was built
// CONCURRENTLY beforehand, as migration 13 says one may, is migrated with
// that index kept and the index by time dropped, and a pending claim left
// by a killed run is taken over afterwards.
func TestMigrationPendingKeysKeepsAnIndexBuiltConcurrently(t *testing.T) {
	t.Parallel()
	for _, cfg := range []claim.Config{{}, {Schema: "ops", Table: "charges_claimed"}} {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ms, err := claim.Migrations(cfg)
			if err != nil {
				t.Fatal(err)
			}
			pool := pgtest.Pool(t)
			for _, m := range ms[:12] {
				if _, err := pool.Exec(ctx, m.SQL); err != nil {
					t.Fatalf("applying migration %d: %v", m.Version, err)
				}
			}
			table, _ := names(cfg)
			idx := "billonce_claims_pending_keys"
			if cfg.Table != "" {
				idx = cfg.Table + "_pending_keys"
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (key, customer, period, amount, currency, owner, lease_until)
				VALUES ('k_killed', 'cus_1', '2025-01', 4200, 'usd', 'killed', now() - interval '1 hour')`); err != nil {
				t.Fatal(err)
			}
			if _, err := pool.Exec(ctx, `CREATE INDEX CONCURRENTLY `+idx+` ON `+table+` (key) WHERE state = 'pending'`); err != nil {
				t.Fatal(err)
			}
			s := migrate(t, pool, cfg)
			var byTime, byKey int
			if err := pool.QueryRow(ctx, `SELECT count(*) FILTER (WHERE pg_get_indexdef(indexrelid) LIKE '%(created_at) WHERE (state = ''pending''::text)'),
				count(*) FILTER (WHERE pg_get_indexdef(indexrelid) LIKE '%(key) WHERE (state = ''pending''::text)')
				FROM pg_index WHERE indrelid = to_regclass($1) AND indisvalid`, table).Scan(&byTime, &byKey); err != nil {
				t.Fatal(err)
			}
			if byTime != 0 || byKey != 1 {
				t.Errorf("after Migrate: %d index(es) of pending claims by time, %d by key; want 0 and 1", byTime, byKey)
			}
			mustClaim(t, engineOf(s), req("cus_1", "k_killed", "b"), claimengine.Resumed)
		})
	}
}
