package claim_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// The records of applied events are pruned once Stripe can no longer
// deliver them again (billing.Biller.Reconcile does it with
// Config.EventRetention). Should an event come after all, it is applied
// afresh and changes nothing.
func TestPrunedEventAppliedAgainChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out strings.Builder
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	engineOf(store).Claim(ctx, claimengine.Request{Customer: "cus_1", Period: "2026-09", Key: "key_1", Amount: 2500, Currency: "usd", Owner: "run-1"})
	engineOf(store).Process(ctx, "key_1", "py_1")
	settled := claimengine.Update{EventID: "evt_1", EventType: "charge.succeeded", Key: "key_1", StripeID: "py_1",
		State: string(claim.StateSucceeded), Created: time.Now()}
	a, _ := engineOf(store).Apply(ctx, settled)
	fmt.Fprintln(&out, "first delivery:", a.Outcome, a.Claim.State)
	a, _ = engineOf(store).Apply(ctx, settled)
	fmt.Fprintln(&out, "redelivered:", a.Outcome)

	// Ninety days later, in production: PruneEvents(ctx, 90*24*time.Hour).
	n, err := store.PruneEvents(ctx, 0)
	fmt.Fprintln(&out, "pruned:", n, err)
	a, _ = engineOf(store).Apply(ctx, settled)
	fmt.Fprintln(&out, "redelivered after pruning:", a.Outcome, a.Claim.State)
	const want = `first delivery: Changed succeeded
redelivered: Duplicate
pruned: 1 <nil>
redelivered after pruning: Unchanged succeeded
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}
