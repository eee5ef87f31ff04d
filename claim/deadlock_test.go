package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

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
	// PostgreSQL looks for a deadlock once, deadlock_timeout after a
	// wait begins, and ends the side that looks. The batch waits first
	// and looks after 1 s, the other side after 20 s: when the other side
	// has not begun to wait by the batch's look (a busy machine), the
	// other side is ended instead, and the scenario runs again.
	for try := 1; ; try++ {
		a, b := fmt.Sprintf("cus_a%d", try), fmt.Sprintf("cus_b%d", try)
		other, err := pool.Begin(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer other.Rollback(ctx)
		if _, err := other.Exec(ctx, "SET LOCAL deadlock_timeout = '20s'"); err != nil {
			t.Fatal(err)
		}
		insert := func(customer string) error {
			_, err := other.Exec(ctx, `INSERT INTO billonce_claims (customer, period, key, amount, currency) VALUES ($1, '2025-01', $2, 4200, 'usd')`, customer, "other_"+customer)
			return err
		}
		if err := insert(b); err != nil {
			t.Fatal(err)
		}
		type answer struct {
			res []result
			err error
		}
		done := make(chan answer, 1)
		go func() {
			res, err := engineOf(s).ClaimBatch(ctx, []claimengine.Request{req(a, "batch_"+a, "runner"), req(b, "batch_"+b, "runner")})
			done <- answer{res, err}
		}()
		awaitLockWait(t, pool, "%unnest%", done, "the batch")
		// This insert waits for the batch's claim of a: a deadlock.
		var pgErr *pgconn.PgError
		if err := insert(a); errors.As(err, &pgErr) && pgErr.Code == "40P01" && try < 5 {
			other.Rollback(ctx)
			<-done
			t.Logf("try %d: the other side was ended, not the batch; again", try)
			continue
		} else if err != nil {
			t.Fatal(err)
		}
		if err := other.Commit(ctx); err != nil {
			t.Fatal(err)
		}
		ans := <-done
		var mm *claim.MismatchError
		if len(ans.res) != 2 || ans.res[0].Outcome != claimengine.Mismatch || ans.res[1].Outcome != claimengine.Mismatch || !errors.As(ans.err, &mm) {
			t.Fatalf("ClaimBatch = %+v, %v; want both requests answered: a mismatch with the other transaction's claims", ans.res, ans.err)
		}
		for _, key := range []string{"batch_" + a, "batch_" + b} {
			if _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrNotFound) {
				t.Errorf("Get(%s) = %v, want ErrNotFound", key, err)
			}
		}
		return
	}
}
