package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A claim that fails in the database (a fence on a missing lease table,
// a context cancelled while the claim waits for another transaction's
// claim) leaves no connection in a failed transaction: a pool of one
// connection claims on afterwards. The failed fenced claim commits
// nothing.
func TestPoolOfOneConnectionClaimsOnAfterAFailedClaim(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	_, s := poolOfOne(t, url)
	e := engineOf(s)
	other := pgtestPool(t, url)

	missing := claimengine.Fence{Table: "no_such_leases", Token: 1}
	if _, err := e.ClaimBatch(ctx, []claimengine.Request{fencedReq("cus_2", "k2", "a", missing)}); err == nil {
		t.Fatal("a claim fenced by a missing lease table succeeded")
	}
	mustClaim(t, e, req("cus_1", "k1", "a"), claimengine.Won)

	// Another transaction's uncommitted claim of cus_3's period: the claim
	// of k3 waits for it, and its context is cancelled while it waits.
	tx, err := other.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := tx.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency) VALUES ('cus_3', '2025-01', 'k3other', 4200, 'usd')`); err != nil {
		t.Fatal(err)
	}
	cctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.Claim(cctx, req("cus_3", "k3", "a"))
		done <- err
	}()
	awaitLockWait(t, other, "%unnest%", done, "Claim of k3")
	cancel()
	if err := <-done; err == nil {
		t.Fatal("Claim of k3 with its context cancelled succeeded")
	}
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	mustClaim(t, e, req("cus_4", "k4", "a"), claimengine.Won)
	// The cancelled claim's statements were all sent: the server, blocked
	// on the lock, may still have committed them after the connection
	// closed, as after any answer lost on the way. Its owner then resumes
	// it; it is never half made.
	if res, err := e.Claim(ctx, req("cus_3", "k3", "a")); err != nil || res.Outcome != claimengine.Won && res.Outcome != claimengine.Resumed {
		t.Fatalf("Claim of k3 after the cancelled one = %+v, %v; want Won, or Resumed by its owner", res, err)
	}

	check, err := claim.NewPostgres(other, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"k1", "k3", "k4"} {
		if _, err := check.Get(ctx, k); err != nil {
			t.Errorf("claim %s, read on another pool: %v; want it committed", k, err)
		}
	}
	if _, err := check.Get(ctx, "k2"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("claim k2 of the failed fenced claim: %v; want ErrNotFound", err)
	}
}
