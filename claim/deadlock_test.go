package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// A claim batch that PostgreSQL ends as one side of a deadlock (another
// transaction claims two of its periods in the other order) is rolled
// back whole and runs again, as for a race: its requests are answered,
// not failed with the deadlock.
func TestClaimBatchEndedByADeadlockRunsAgain(t *testing.T) {
	t.Parallel()
	s, pool := newPostgres(t, claim.Config{Lease: lease})
	ctx := context.Background()
	other, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer other.Rollback(ctx)
	// The other side waits long before it looks for a deadlock, so that
	// the batch, waiting since earlier, is the side PostgreSQL ends.
	if _, err := other.Exec(ctx, "SET LOCAL deadlock_timeout = '10min'"); err != nil {
		t.Fatal(err)
	}
	insert := func(customer, key string) {
		t.Helper()
		if _, err := other.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency) VALUES ($1, '2025-01', $2, 4200, 'usd')`, customer, key); err != nil {
			t.Fatal(err)
		}
	}
	insert("cus_b", "other_b")
	type answer struct {
		res []result
		err error
	}
	done := make(chan answer, 1)
	go func() {
		res, err := engineOf(s).ClaimBatch(ctx, []claimengine.Request{req("cus_a", "batch_a", "runner"), req("cus_b", "batch_b", "runner")})
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
			t.Fatalf("the batch returned %+v, %v while a claim of cus_b was uncommitted; want it to wait", a.res, a.err)
		default:
		}
	}
	insert("cus_a", "other_a") // waits for the batch's claim of cus_a: a deadlock
	if err := other.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	a := <-done
	var mm *claim.MismatchError
	if len(a.res) != 2 || a.res[0].Outcome != claimengine.Mismatch || a.res[1].Outcome != claimengine.Mismatch || !errors.As(a.err, &mm) {
		t.Fatalf("ClaimBatch = %+v, %v; want both requests answered: a mismatch with the other transaction's claims", a.res, a.err)
	}
	for _, key := range []string{"batch_a", "batch_b"} {
		if _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want ErrNotFound", key, err)
		}
	}
}
