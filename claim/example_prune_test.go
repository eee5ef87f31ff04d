package claim_test

import (
	"context"
	"fmt"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// The records of applied events are pruned once Stripe can no longer
// deliver them again (billing.Biller.Reconcile does it with
// Config.EventRetention). Should an event come after all, it is applied
// afresh and changes nothing.
func ExamplePostgres_PruneEvents() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		fmt.Println(err)
		return
	}
	if err := store.Migrate(ctx); err != nil {
		fmt.Println(err)
		return
	}
	store.Claim(ctx, claim.Request{Customer: "cus_1", Period: "2026-09", Key: "key_1", Amount: 2500, Currency: "usd", Owner: "run-1"})
	store.Process(ctx, "key_1", "py_1")
	settled := claim.Update{EventID: "evt_1", EventType: "charge.succeeded", Key: "key_1", StripeID: "py_1",
		State: claim.StateSucceeded, Created: time.Now()}
	a, _ := store.Apply(ctx, settled)
	fmt.Println("first delivery:", a.Outcome, a.Claim.State)
	a, _ = store.Apply(ctx, settled)
	fmt.Println("redelivered:", a.Outcome)

	// Ninety days later, in production: PruneEvents(ctx, 90*24*time.Hour).
	n, err := store.PruneEvents(ctx, 0)
	fmt.Println("pruned:", n, err)
	a, _ = store.Apply(ctx, settled)
	fmt.Println("redelivered after pruning:", a.Outcome, a.Claim.State)
	// Output:
	// first delivery: Changed succeeded
	// redelivered: Duplicate
	// pruned: 1 <nil>
	// redelivered after pruning: Unchanged succeeded
}
