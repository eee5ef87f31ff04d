package claim_test

import (
	"context"
	"testing"

	"github.com/billonce/billonce/internal/claimengine"
	"github.com/jackc/pgx/v5/pgxpool"
)

// A takeover of a pending claim is never taken back, whatever the row's
// count of leases says: a table edited by hand or restored from a dump
// may hold a pending claim with no lease counted (attempts 0), next to a
// failed claim of another scope for its period. The claim's key may have
// reached Stripe; its runner resumes it and must find it recorded when
// Stripe answers.
func TestTakeoverOfAPendingClaimWithNoLeaseCountedKeepsTheClaim(t *testing.T) {
	t.Parallel()
	forEachIsolation(t, func(t *testing.T, s pgStore, pool *pgxpool.Pool) {
		ctx := context.Background()
		if _, err := pool.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency, scope, attempt, owner, lease_until, attempts, state, failure_code)
			VALUES ('cus_1', '2025-01', 'cus_1/2025-01#1@new', 4200, 'usd', 'new', 1, 'a', now() - interval '1 hour', 0, 'pending', ''),
			('cus_1', '2025-01', 'cus_1/2025-01#1@old', 4200, 'usd', 'old', 1, '', now() - interval '1 day', 1, 'failed', 'card_declined')`); err != nil {
			t.Fatal(err)
		}
		r := scoped("cus_1", "cus_1/2025-01#1@new", "new", 1)
		r.Owner = "b"
		mustClaim(t, s.engine, r, claimengine.Resumed)
		c, err := s.Get(ctx, r.Key)
		if err != nil {
			t.Fatalf("Get of the claim resumed = %v; want the pending claim, held by b", err)
		}
		if c.State != "pending" || c.Owner != "b" {
			t.Fatalf("claim resumed = %+v; want pending, held by b", c)
		}
		if err := s.Succeed(ctx, r.Key, "pi_1"); err != nil {
			t.Fatalf("Succeed of the claim resumed = %v; want its payment recorded", err)
		}
	})
}
