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

// List reads a period's claims, every attempt, in one query: in customer
// and attempt order, only that period's, only one customer's when asked.
func TestListByPeriodAndCustomer(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	eng := engineOf(store)
	for _, c := range []string{"cus_2", "cus_1"} {
		mustClaim(t, eng, req(c, "key_"+c, "run-1"), claimengine.Won)
	}
	if err := eng.Fail(ctx, "key_cus_1", "", "card_declined"); err != nil {
		t.Fatal(err)
	}
	again := req("cus_1", "key_cus_1_2", "run-1")
	again.Attempt = 2
	mustClaim(t, eng, again, claimengine.Won)
	other := req("cus_1", "key_other", "run-1")
	other.Period = "2026-10"
	mustClaim(t, eng, other, claimengine.Won)

	keys := func(cs []claim.Claim) (out []string) {
		for _, c := range cs {
			out = append(out, c.Key)
		}
		return out
	}
	all, err := store.List(ctx, "2025-01", "") // req's period
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"key_cus_1", "key_cus_1_2", "key_cus_2"}, keys(all)); diff != "" {
		t.Errorf("List of the period (-want +got):\n%s", diff)
	}
	if all[0].State != claim.StateFailed || all[1].Attempt != 2 || all[2].Customer != "cus_2" {
		t.Errorf("List read %+v", all)
	}
	one, err := store.List(ctx, "2025-01", "cus_1")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"key_cus_1", "key_cus_1_2"}, keys(one)); diff != "" {
		t.Errorf("List of cus_1 (-want +got):\n%s", diff)
	}
	if none, err := store.List(ctx, "2027-01", ""); err != nil || len(none) != 0 {
		t.Errorf("List of a period without claims = %v, %v; want none", none, err)
	}
}

// ListPeriods reads the claims of several periods, and of the periods
// that start with a prefix, in one query: byte for byte, so that a
// prefix's _ or % is no wildcard and a longer period is not its own.
func TestListPeriodsMatchesPeriodsAndPrefixesExactly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for i, p := range []string{"2026-09", "transfer 2026-09", "2026-09 refund a_%", "2026-09 refund b",
		"2026-09-15", "2026-09-15 refund c", "transfer 2026-09-15", "2026-0 refund d", "2026-09 refunds e", "x2026-09 refund f"} {
		r := req("cus_"+string(rune('a'+i)), "key_"+string(rune('a'+i)), "run-1")
		r.Period = p
		mustClaim(t, engineOf(store), r, claimengine.Won)
	}
	periods := func(cs []claim.Claim) []string {
		var out []string
		for _, c := range cs {
			out = append(out, c.Period)
		}
		return out
	}
	got, err := store.ListPeriods(ctx, []string{"2026-09", "transfer 2026-09"}, []string{"2026-09 refund "}, "")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"2026-09", "transfer 2026-09", "2026-09 refund a_%", "2026-09 refund b"}, periods(got)); diff != "" {
		t.Errorf("ListPeriods (-want +got):\n%s", diff)
	}
	got, err = store.ListPeriods(ctx, nil, []string{"2026-09 refund a_"}, "")
	if err != nil || len(got) != 1 || got[0].Period != "2026-09 refund a_%" {
		t.Errorf("ListPeriods of the prefix %q = %v, %v; want the one claim whose period starts so", "2026-09 refund a_", periods(got), err)
	}
	got, err = store.ListPeriods(ctx, []string{"2026-09"}, []string{"2026-09 refund "}, "cus_d")
	if err != nil || len(got) != 1 || got[0].Period != "2026-09 refund b" {
		t.Errorf("ListPeriods of cus_d = %v, %v; want its refund", periods(got), err)
	}
	if got, err := store.ListPeriods(ctx, nil, nil, ""); err != nil || len(got) != 0 {
		t.Errorf("ListPeriods of nothing = %v, %v; want none", periods(got), err)
	}
}
