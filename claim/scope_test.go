package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// scoped is req under scope, for attempt.
func scoped(customer, key, scope string, attempt int) claimengine.Request {
	r := req(customer, key, "a")
	r.Scope, r.Attempt = scope, attempt
	return r
}

// A period declined under one scope is re-billed only from that scope: a
// claim of another, known scope (a renamed scope sharing the claim table)
// is refused with a *MismatchError on "scope" naming the failed claim, by
// Claim and ClaimBatch alike, and nothing is written; the failed claim's
// own scope still re-bills it.
func TestFailedClaimHoldsItsPeriodAgainstOtherScopes(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		mustClaim(t, h.store, scoped("cus_1", "cus_1/2025-01#1@old", "old", 1), claimengine.Won)
		if err := h.store.Fail(ctx, "cus_1/2025-01#1@old", "pi_1", "authentication_required"); err != nil {
			t.Fatal(err)
		}

		other := scoped("cus_1", "cus_1/2025-01#1@new", "new", 1)
		_, err := h.store.Claim(ctx, other)
		var mm *claim.MismatchError
		if !errors.As(err, &mm) || mm.Field != "scope" || mm.Have != "old" || mm.Want != "new" || mm.Existing.Key != "cus_1/2025-01#1@old" {
			t.Fatalf("Claim under another scope of a period failed under %q = %v (%+v), want a *MismatchError on scope naming the failed claim", "old", err, mm)
		}
		res, err := h.store.ClaimBatch(ctx, []claimengine.Request{other, scoped("cus_2", "cus_2/2025-01#1@new", "new", 1)})
		if !errors.As(err, &mm) || mm.Field != "scope" || len(res) != 2 || res[0].Outcome != claimengine.Mismatch || res[1].Outcome != claimengine.Won {
			t.Fatalf("ClaimBatch under another scope = %v, %+v; want a mismatch on scope for cus_1 and cus_2 won", err, res)
		}
		if _, err := h.store.Get(ctx, other.Key); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get(%s) after the refusals = %v, want ErrNotFound: nothing written", other.Key, err)
		}

		mustClaim(t, h.store, scoped("cus_1", "cus_1/2025-01#2@old", "old", 2), claimengine.Won)
	})
}

// A failed claim of unknown scope (made before claims recorded their
// scope) blocks no scope's claim of its period, and a request of unknown
// scope is blocked by none.
func TestFailedClaimOfUnknownScopeBlocksNothing(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		mustClaim(t, h.store, scoped("cus_1", "legacy", "", 0), claimengine.Won)
		if err := h.store.Fail(ctx, "legacy", "", "card_declined"); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, h.store, scoped("cus_1", "cus_1/2025-01#2@new", "new", 2), claimengine.Won)

		mustClaim(t, h.store, scoped("cus_2", "cus_2/2025-01#1@new", "new", 1), claimengine.Won)
		if err := h.store.Fail(ctx, "cus_2/2025-01#1@new", "", "card_declined"); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, h.store, scoped("cus_2", "unscoped", "", 0), claimengine.Won)
	})
}

// A claim of another scope that started while the period's claim was
// pending, and inserts only after that claim failed, is refused too: the
// statement reads the period as of its start, when it was held.
func TestClaimOfAnotherScopeRacingTheFailureIsRefused(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	ctx := context.Background()
	mustClaim(t, s, scoped("cus_1", "cus_1/2025-01#1@old", "old", 1), claimengine.Won)

	res, err := claimBatchHeldBack(t, s, pool, []claimengine.Request{scoped("cus_9", "cus_9/2025-01#1@new", "new", 1), scoped("cus_1", "cus_1/2025-01#1@new", "new", 1)}, func() {
		if err := s.Fail(ctx, "cus_1/2025-01#1@old", "pi_1", "authentication_required"); err != nil {
			t.Fatal(err)
		}
	})
	var mm *claim.MismatchError
	if len(res) != 2 || res[1].Outcome != claimengine.Mismatch || !errors.As(res[1].Conflict, &mm) {
		t.Fatalf("the other scope's claim of cus_1 = %+v, %v; want a mismatch", res, err)
	}
	if _, err := s.Get(ctx, "cus_1/2025-01#1@new"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get of the refused claim = %v, want ErrNotFound", err)
	}
}

// A usage report rejected under one scope is refused to another scope in
// the words of usage: the refusal says to report it again from the scope
// that claimed it, with the next attempt, not to re-bill it.
func TestRejectedUsageOfAnotherScopeIsRefusedInTheWordsOfUsage(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		old := usageReq("cus_1", "usage#1@old", 0, 60)
		old.Scope, old.Attempt = "old", 1
		mustClaim(t, h.store, old, claimengine.Won)
		if err := h.store.Fail(ctx, old.Key, "", "meter_event_customer_not_found"); err != nil {
			t.Fatal(err)
		}
		other := usageReq("cus_1", "usage#1@new", 0, 60)
		other.Scope, other.Attempt = "new", 1
		_, err := h.store.Claim(ctx, other)
		var mm *claim.MismatchError
		if !errors.As(err, &mm) || mm.Field != "scope" || !strings.Contains(err.Error(), "ReportUsage") || strings.Contains(err.Error(), "Rebill") {
			t.Fatalf("Claim of a usage report rejected under another scope = %v, want a *MismatchError on scope that says to report it again with ReportUsage", err)
		}
	})
}

// claimBatchHeldBack runs s.ClaimBatch(reqs) while an uncommitted claim of
// reqs[0]'s key (customer cus_9) holds that request back after the
// statement has read the table; meanwhile runs once the statement waits
// for it, then the holding claim commits. It returns the batch's answer.
func claimBatchHeldBack(t *testing.T, s pgStore, pool *pgxpool.Pool, reqs []claimengine.Request, meanwhile func()) ([]result, error) {
	t.Helper()
	ctx := context.Background()
	blocker, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer blocker.Rollback(ctx)
	if _, err := blocker.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency) VALUES ('cus_9', '2025-01', $1, 4200, 'usd')`, reqs[0].Key); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res []result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := s.ClaimBatch(ctx, reqs)
		done <- answer{res, err}
	}()
	for {
		var waiting int
		if err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE '%unnest%'`).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			break
		}
		select {
		case a := <-done:
			t.Fatalf("the batch returned %+v, %v while a claim of its first customer was uncommitted; want it to wait", a.res, a.err)
		default:
		}
	}
	meanwhile()
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	return a.res, a.err
}
