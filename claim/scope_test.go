package claim_test

import (
	"context"
	"errors"
	"fmt"
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
	awaitLockWait(t, pool, "%unnest%", done, "the batch")
	meanwhile()
	if err := blocker.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	return a.res, a.err
}

// claimWhileInsertedAndFailed runs s.Claim(r) while another transaction
// has inserted the claim key of customer cus_1 and period 2025-01, under
// scope and attempt, and failed it, uncommitted: the statement's snapshot
// does not see that claim, and its insert waits for the transaction,
// whose row was live when inserted. Then that transaction commits, and
// Claim's answer is returned. One transaction stands for a claim that
// committed and then failed before the waiting insert looked again, which
// a busy database makes as likely as it is rare.
func claimWhileInsertedAndFailed(t *testing.T, s pgStore, pool *pgxpool.Pool, r claimengine.Request, key, scope string, attempt int) (result, error) {
	t.Helper()
	ctx := context.Background()
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	if _, err := other.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency, scope, attempt)
		VALUES ('cus_1', '2025-01', $1, 4200, 'usd', $2, $3)`, key, scope, attempt); err != nil {
		t.Fatal(err)
	}
	if _, err := other.Exec(ctx, `UPDATE billonce_claims SET state = 'failed', failure_code = 'card_declined' WHERE key = $1`, key); err != nil {
		t.Fatal(err)
	}
	type answer struct {
		res result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := engineOf(s).Claim(ctx, r)
		done <- answer{res, err}
	}()
	awaitLockWait(t, pool, "%unnest%", done, "Claim")
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	return a.res, a.err
}

// A claim of another scope committed after the statement's snapshot, and
// failed before the statement's insert looked at it again, holds its
// period all the same: the unique index of live claims no longer sees it,
// and the snapshot never did. Letting the second scope in would leave the
// period billed under two scopes (the first's declined payment may still
// be completed) or, both declined, re-billed by neither.
// Under every default isolation: the check reads at read committed.
func TestClaimOfAnotherScopeCommittedAndFailedDuringTheStatementIsRefused(t *testing.T) {
	t.Parallel()
	forEachIsolation(t, func(t *testing.T, s pgStore, pool *pgxpool.Pool) {
		claimOfAnotherScopeCommittedAndFailedDuringTheStatementIsRefused(t, s, pool)
	})
}

func claimOfAnotherScopeCommittedAndFailedDuringTheStatementIsRefused(t *testing.T, s pgStore, pool *pgxpool.Pool) {
	ctx := context.Background()
	res, err := claimWhileInsertedAndFailed(t, s, pool, scoped("cus_1", "cus_1/2025-01#1@new", "new", 1), "cus_1/2025-01#1@old", "old", 1)
	var mm *claim.MismatchError
	if !errors.As(err, &mm) || mm.Field != "scope" || mm.Have != "old" {
		t.Fatalf("Claim under scope new = %+v, %v; want a *MismatchError on scope naming old's failed claim", res, err)
	}
	if _, err := s.Get(ctx, "cus_1/2025-01#1@new"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get of the refused claim = %v, want ErrNotFound: nothing written", err)
	}
}

// Likewise a later attempt of the scope, committed and failed during the
// statement, holds the period against an earlier attempt: a stale run's
// attempt 1 is not claimed once a re-bill's attempt 2 exists.
func TestEarlierAttemptRacingALaterAttemptsFailureIsNotClaimed(t *testing.T) {
	t.Parallel()
	forEachIsolation(t, func(t *testing.T, s pgStore, pool *pgxpool.Pool) {
		earlierAttemptRacingALaterAttemptsFailureIsNotClaimed(t, s, pool)
	})
}

func earlierAttemptRacingALaterAttemptsFailureIsNotClaimed(t *testing.T, s pgStore, pool *pgxpool.Pool) {
	ctx := context.Background()
	res, err := claimWhileInsertedAndFailed(t, s, pool, scoped("cus_1", "cus_1/2025-01#1@new", "new", 1), "cus_1/2025-01#2@new", "new", 2)
	if err != nil || res.Outcome != claimengine.Failed || res.Claim.Key != "cus_1/2025-01#2@new" {
		t.Fatalf("Claim of attempt 1 = %+v, %v; want Failed with attempt 2's claim", res, err)
	}
	if _, err := s.Get(ctx, "cus_1/2025-01#1@new"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get of attempt 1 = %v, want ErrNotFound: nothing written", err)
	}
}

// forEachIsolation runs f, in parallel, on a store whose database's
// default transaction isolation is each of PostgreSQL's.
func forEachIsolation(t *testing.T, f func(t *testing.T, s pgStore, pool *pgxpool.Pool)) {
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run(fmt.Sprintf("%q", isolation), func(t *testing.T) {
			t.Parallel()
			s, pool := isolatedStore(t, isolation)
			f(t, s, pool)
		})
	}
}
