package claim_test

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A usage claim records its meter's Stripe id, which names the meter on
// one Stripe account, as it records the meter's event name; other claims
// record none.
func TestUsageClaimRecordsItsMeterID(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		r := usageReq("cus_1", "k_usage", 0, 60)
		r.MeterID = "mtr_61Q8nQMqIFK9fRQmr41CMAXJrFdZ5MnA"
		if c := mustClaim(t, h.store, r, claimengine.Won).Claim; c.MeterID != r.MeterID || c.Meter != "api_calls" {
			t.Errorf("claim's meter = %q (%q), want %q (api_calls)", c.MeterID, c.Meter, r.MeterID)
		}
		if c, err := h.store.Get(ctx, "k_usage"); err != nil || c.MeterID != r.MeterID {
			t.Errorf("Get = meter id %q, %v; want %q", c.MeterID, err, r.MeterID)
		}
		charge := mustClaim(t, h.store, claimengine.Request{Customer: "cus_1", Period: "2026-09", Key: "k_charge", Amount: 2500, Currency: "usd", Owner: "a"}, claimengine.Won).Claim
		if charge.MeterID != "" {
			t.Errorf("a charge's claim records meter id %q", charge.MeterID)
		}
	})
}

// Migration 7 on a table with usage claims: they keep no meter id
// (unknown), the claims made from then on record theirs, and the table
// refuses a meter id on a claim without a meter.
func TestMigrationMeterIDsLeavesEarlierUsageClaimsUnknown(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			applyUpTo(t, pool, cfg, 6)
			table, _ := names(cfg)
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (customer, period, key, amount, currency, endpoint, meter, window_start, window_end) VALUES
				('cus_1', 'usage api_calls 2026-09-01T10:00:00Z increment', 'k_old', 7, '', 'meter_events', 'api_calls', '2026-09-01T10:00:00Z', '2026-09-01T11:00:00Z')`); err != nil {
				t.Fatal(err)
			}
			s := migrate(t, pool, cfg)
			if got, want := rows(t, pool, cfg, "key, meter_id IS NULL"), []string{"(k_old,t)"}; !slices.Equal(got, want) {
				t.Errorf("meter ids = %q, want %q", got, want)
			}
			r := usageReq("cus_1", "k_new", 60, 120)
			r.MeterID = "mtr_new"
			mustClaim(t, engineOf(s), r, claimengine.Won)
			if c, err := s.Get(ctx, "k_old"); err != nil || c.MeterID != "" {
				t.Errorf("earlier claim's meter id = %q, %v; want none", c.MeterID, err)
			}
			if c, err := s.Get(ctx, "k_new"); err != nil || c.MeterID != "mtr_new" {
				t.Errorf("new claim's meter id = %q, %v; want mtr_new", c.MeterID, err)
			}
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (customer, period, key, amount, currency, meter_id) VALUES
				('cus_1', '2026-09', 'k_charge', 2500, 'usd', 'mtr_new')`); err == nil {
				t.Error("the table took a meter id on a claim without a meter")
			}
		})
	}
}
