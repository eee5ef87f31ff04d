package claim_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// Count reports a period's claims by state, and only that period's.
func TestCountByPeriod(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cus_1", "cus_2", "cus_3"} {
		mustClaim(t, engineOf(store), req(c, "key_"+c, "run-1"), claimengine.Won)
	}
	other := req("cus_1", "key_other", "run-1")
	other.Period = "2026-10"
	mustClaim(t, engineOf(store), other, claimengine.Won)
	if err := engineOf(store).Succeed(ctx, "key_cus_1", "ch_1"); err != nil {
		t.Fatal(err)
	}
	if err := engineOf(store).Fail(ctx, "key_cus_2", "", "card_declined"); err != nil {
		t.Fatal(err)
	}
	got, err := store.Count(ctx, "2025-01") // req's period
	if err != nil {
		t.Fatal(err)
	}
	want := map[claim.State]int{claim.StateSucceeded: 1, claim.StateFailed: 1, claim.StatePending: 1}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("Count (-want +got):\n%s", diff)
	}
	if got, err := store.Count(ctx, "2027-01"); err != nil || len(got) != 0 {
		t.Errorf("Count of a period without claims = %v, %v; want empty", got, err)
	}
}
