package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// A period's attempts are claimed one after the other: once attempt 2 of
// a scope has failed, a claim of attempt 1 of that scope and period (its
// failed claim deleted by hand) is not claimed afresh, since billing it
// would pay a period whose later attempt's payment can still be
// completed. The claim store answers Failed with the later attempt's
// claim, by Claim and ClaimBatch alike, and writes nothing; attempt 3
// still claims.
func TestFailedLaterAttemptHoldsItsPeriodAgainstEarlierAttempts(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	ctx := context.Background()
	first, second := scoped("cus_1", "cus_1/2025-01#1@s", "s", 1), scoped("cus_1", "cus_1/2025-01#2@s", "s", 2)
	mustClaim(t, s, first, claimengine.Won)
	if err := s.Fail(ctx, first.Key, "pi_1", "authentication_required"); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, s, second, claimengine.Won)
	if err := s.Fail(ctx, second.Key, "pi_2", "authentication_required"); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "DELETE FROM billonce_claims WHERE key = $1", first.Key); err != nil {
		t.Fatal(err)
	}

	res := mustClaim(t, s, first, claimengine.Failed)
	if res.Claim.Key != second.Key || res.Claim.Attempt != 2 {
		t.Errorf("Claim of attempt 1 after attempt 2 failed answered claim %s (attempt %d), want attempt 2's %s", res.Claim.Key, res.Claim.Attempt, second.Key)
	}
	batch, err := s.ClaimBatch(ctx, []claimengine.Request{first, scoped("cus_2", "cus_2/2025-01#1@s", "s", 1)})
	if err != nil || len(batch) != 2 || batch[0].Outcome != claimengine.Failed || batch[0].Claim.Key != second.Key || batch[1].Outcome != claimengine.Won {
		t.Fatalf("ClaimBatch of attempt 1 after attempt 2 failed = %+v, %v; want Failed with attempt 2's claim, and cus_2 won", batch, err)
	}
	if _, err := s.Get(ctx, first.Key); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get(%s) after the refusals = %v, want ErrNotFound: nothing written", first.Key, err)
	}

	// Another scope's attempt 1 is refused as before (a mismatch on
	// scope), and this scope's attempt 3 is the re-bill that follows.
	_, err = s.Claim(ctx, scoped("cus_1", "cus_1/2025-01#1@t", "t", 1))
	var mm *claim.MismatchError
	if !errors.As(err, &mm) || mm.Field != "scope" {
		t.Errorf("Claim under another scope = %v, want a *MismatchError on scope", err)
	}
	mustClaim(t, s, scoped("cus_1", "cus_1/2025-01#3@s", "s", 3), claimengine.Won)
}

// A claim of attempt 1 that starts while attempt 2 is pending, and
// inserts only after attempt 2 failed, is not claimed either: the
// statement reads the period as of its start, when attempt 2 held it.
func TestEarlierAttemptRacingTheLaterFailureIsNotClaimed(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	ctx := context.Background()
	first, second := scoped("cus_1", "cus_1/2025-01#1@s", "s", 1), scoped("cus_1", "cus_1/2025-01#2@s", "s", 2)
	mustClaim(t, s, second, claimengine.Won)

	claimBatchHeldBack(t, s, pool, []claimengine.Request{scoped("cus_9", "cus_9/2025-01#1@s", "s", 1), first}, func() {
		if err := s.Fail(ctx, second.Key, "pi_2", "authentication_required"); err != nil {
			t.Fatal(err)
		}
	})
	if _, err := s.Get(ctx, first.Key); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get(%s) after attempt 2 failed during its claim = %v, want ErrNotFound: attempt 1 not claimed", first.Key, err)
	}
}
