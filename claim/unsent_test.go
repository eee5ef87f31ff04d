package claim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A claim released as unsent keeps the mark through every later release
// and takeover, until a lookup reopens its key's window: the mark is the
// claim's state, not words in its last error.
func TestUnsentMarkLastsUntilTheWindowIsReopened(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		if err := s.ReleaseUnsent(ctx, "k1", "a", "identifier taken"); err != nil {
			t.Fatal(err)
		}
		c := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed).Claim
		if !c.Unsent {
			t.Fatalf("resumed claim %+v; want it unsent", c)
		}
		if err := s.Release(ctx, "k1", "b", "", "timeout after 30s"); err != nil {
			t.Fatal(err)
		}
		c = mustClaim(t, s, req("cus_1", "k1", "c"), claimengine.Resumed).Claim
		if !c.Unsent || c.LastError != "timeout after 30s" {
			t.Fatalf("claim after a plain release %+v; want still unsent, with the new last error", c)
		}
		if err := s.Reopen(ctx, "k1", "c", "meter_events", "cred"); err != nil {
			t.Fatal(err)
		}
		if c, err := s.Get(ctx, "k1"); err != nil || c.Unsent {
			t.Fatalf("claim after Reopen = %+v, %v; want the mark cleared", c, err)
		}
	})
}

// Migration 8 marks the pending claims an earlier version released for an
// identifier another writer took, as it said in their last error, and no
// other claim.
func TestMigrationUnsentMarksClaimsReleasedForATakenIdentifier(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			applyUpTo(t, pool, cfg, 7)
			table, _ := names(cfg)
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (customer, period, key, amount, currency, state, stripe_id, last_error) VALUES
				('cus_1', 'p1', 'k_taken', 7, '', 'pending', '', 'identifier taken: Stripe already has a meter event with this report''s identifier'),
				('cus_2', 'p1', 'k_other', 7, '', 'pending', '', 'timeout'),
				('cus_3', 'p1', 'k_done', 7, '', 'succeeded', 'k_done', 'identifier taken: once')`); err != nil {
				t.Fatal(err)
			}
			migrate(t, pool, cfg)
			got := rows(t, pool, cfg, "key, unsent")
			slices.Sort(got)
			if want := []string{"(k_done,f)", "(k_other,f)", "(k_taken,t)"}; !slices.Equal(got, want) {
				t.Errorf("unsent = %q, want %q", got, want)
			}
		})
	}
}
