package claim_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/lock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// newLeaseHolder takes the lease "run" in pool's lease table and returns
// the fence of claims made under it.
func newLeaseHolder(t *testing.T, pool *pgxpool.Pool) (*lock.Lease, claimengine.Fence) {
	t.Helper()
	l, err := lock.NewLease(pool, lock.LeaseConfig{TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := l.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return l, takeLease(t, l)
}

// takeLease takes l's lease "run", expired or free, and returns its fence.
func takeLease(t *testing.T, l *lock.Lease) claimengine.Fence {
	t.Helper()
	ctx := context.Background()
	h, err := l.Lock(ctx, "run")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { h.Unlock(ctx) })
	return claimengine.Fence{Table: l.Table(), Token: h.(lock.Fenced).Token()}
}

func fencedReq(customer, key, owner string, f claimengine.Fence) claimengine.Request {
	r := req(customer, key, owner)
	r.Fence = f
	return r
}

// A claim under a lease's fence is made while the lease row carries the
// fence's token; once another holder has taken the lease over, no claim
// under the old fence is made, new or resumed, and the error says so.
func TestFencedClaimRefusedAfterTakeover(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	l, stale := newLeaseHolder(t, pool)
	ctx := context.Background()

	mustClaim(t, s, fencedReq("cus_1", "k1", "a", stale), claimengine.Won)
	if res, err := s.ClaimBatch(ctx, []claimengine.Request{fencedReq("cus_2", "k2", "a", stale), fencedReq("cus_3", "k3", "a", stale)}); err != nil ||
		res[0].Outcome != claimengine.Won || res[1].Outcome != claimengine.Won {
		t.Fatalf("ClaimBatch under the current fence: %v, %v", res, err)
	}
	// cus_1's claim is left to its lease, which runs out.
	if _, err := pool.Exec(ctx, `UPDATE billonce_claims SET lease_until = now() WHERE key = 'k1'`); err != nil {
		t.Fatal(err)
	}

	if _, err := pool.Exec(ctx, `UPDATE `+l.Table()+` SET lock_until = now()`); err != nil {
		t.Fatal(err)
	}
	current := takeLease(t, l)
	for _, tc := range []struct {
		name string
		reqs []claimengine.Request
	}{
		{"new", []claimengine.Request{fencedReq("cus_4", "k4", "a", stale)}},
		{"resumed", []claimengine.Request{fencedReq("cus_1", "k1", "a", stale)}},
		{"batch", []claimengine.Request{fencedReq("cus_1", "k1", "a", stale), fencedReq("cus_5", "k5", "a", stale)}},
	} {
		_, err := s.ClaimBatch(ctx, tc.reqs)
		if !errors.Is(err, claimengine.ErrFenced) || !strings.Contains(err.Error(), l.Table()) {
			t.Errorf("%s claim under the stale fence: %v; want ErrFenced naming the lease table", tc.name, err)
		}
	}
	if _, err := s.Claim(ctx, fencedReq("cus_4", "k4", "a", stale)); !errors.Is(err, claimengine.ErrFenced) {
		t.Errorf("Claim under the stale fence: %v; want ErrFenced", err)
	}
	for _, key := range []string{"k4", "k5"} {
		if _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("claim %s after the refusal: %v; want none", key, err)
		}
	}
	if c, _ := s.Get(ctx, "k1"); c.Leases != 1 {
		t.Errorf("claim k1 was resumed under the stale fence: %+v", c)
	}

	// The new holder claims.
	mustClaim(t, s, fencedReq("cus_1", "k1", "b", current), claimengine.Resumed)
	mustClaim(t, s, fencedReq("cus_4", "k4", "b", current), claimengine.Won)
}

// A fenced claim that meets a takeover in progress waits for it, and
// then claims nothing: the lease row is read FOR SHARE in the claim's
// statement.
func TestFencedClaimWaitsForTakeoverInProgress(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	l, stale := newLeaseHolder(t, pool)
	ctx := context.Background()
	takeover, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer takeover.Rollback(ctx)
	if _, err := takeover.Exec(ctx, `UPDATE `+l.Table()+` SET token = token + 1000000, owner = 'another'`); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := s.Claim(ctx, fencedReq("cus_1", "k1", "a", stale))
		done <- err
	}()
	// The claim waits for the row lock.
	awaitLockWait(t, pool, "%FOR SHARE%", done, "the claim")
	if err := takeover.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; !errors.Is(err, claimengine.ErrFenced) {
		t.Fatalf("claim after the takeover committed: %v; want ErrFenced", err)
	}
	if _, err := s.Get(ctx, "k1"); !errors.Is(err, claim.ErrNotFound) {
		t.Fatalf("claim k1 after the refusal: %v; want none", err)
	}
}

// A fence that names no identifier or no token, or a batch under two
// fences, is refused before any statement; a lease table the claim
// store's database does not have is an error that says so.
func TestFenceBadInput(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	_, f := newLeaseHolder(t, pool)
	ctx := context.Background()
	for _, bad := range []claimengine.Fence{{Table: "x; DROP TABLE t", Token: 1}, {Table: f.Table}, {Token: 5}} {
		if _, err := s.Claim(ctx, fencedReq("cus_1", "k1", "a", bad)); !errors.Is(err, claim.ErrInvalid) {
			t.Errorf("fence %+v: %v; want ErrInvalid", bad, err)
		}
	}
	other := f
	other.Token++
	if _, err := s.ClaimBatch(ctx, []claimengine.Request{fencedReq("cus_1", "k1", "a", f), fencedReq("cus_2", "k2", "a", other)}); !errors.Is(err, claim.ErrInvalid) {
		t.Errorf("a batch under two fences: %v; want ErrInvalid", err)
	}
	missing := claimengine.Fence{Table: "no_such_leases", Token: f.Token}
	if _, err := s.Claim(ctx, fencedReq("cus_1", "k1", "a", missing)); err == nil || !strings.Contains(err.Error(), "claim store's database") {
		t.Errorf("a fence on a missing lease table: %v; want an error about where the lease table is", err)
	}
	if n, err := s.Get(ctx, "k1"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("claim k1 after the refusals: %+v, %v; want none", n, err)
	}
}
