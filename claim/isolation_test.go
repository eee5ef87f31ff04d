package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// isolatedStore returns a migrated store on a fresh database whose
// default transaction isolation is isolation ("" keeps PostgreSQL's).
func isolatedStore(t *testing.T, isolation string) (pgStore, *pgxpool.Pool) {
	t.Helper()
	ctx := context.Background()
	url := pgtest.URL(t)
	if isolation != "" {
		admin, err := pgxpool.New(ctx, url)
		if err != nil {
			t.Fatal(err)
		}
		_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{admin.Config().ConnConfig.Database}.Sanitize()+
			" SET default_transaction_isolation = '"+isolation+"'")
		admin.Close()
		if err != nil {
			t.Fatal(err)
		}
	}
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	p, err := claim.NewPostgres(pool, claim.Config{Lease: lease})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pgStore{p, engineOf(p)}, pool
}

// Refunds of one payment claimed at once never add up to more than it,
// whatever the database's default isolation level: each refund's claim
// sees the refunds claimed before it.
func TestConcurrentRefundsNeverAddUpToMoreThanThePaymentUnderAnyDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run(fmt.Sprintf("%q", isolation), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := isolatedStore(t, isolation)
			paid(t, s, "pay", 1000)
			var mu sync.Mutex
			var refusals int
			counts := race(t, 24, func(i int) (result, error) {
				r, err := s.Claim(ctx, refundReq("pay", fmt.Sprint(i), 100))
				var m *claim.MismatchError
				if errors.As(err, &m) && m.Field == "refund" {
					mu.Lock()
					refusals++
					mu.Unlock()
					return result{Outcome: claimengine.Mismatch}, nil
				}
				return r, err
			})
			var sum int64
			for i := range 24 {
				if c, err := s.Get(ctx, fmt.Sprintf("pay/refund/%d", i)); err == nil {
					sum += c.Amount
				}
			}
			if sum > 1000 {
				t.Errorf("refund claims of a payment of 1000 add up to %d", sum)
			}
			if counts[claimengine.Won] != 10 || refusals != 14 {
				t.Errorf("outcomes = %v, %d refused; want 10 Won and 14 refused", counts, refusals)
			}
		})
	}
}

// Runners claiming the same customer and period at once: one wins, the
// others are told it is in progress, whatever the database's default
// isolation level; none gets an error.
func TestConcurrentClaimsOfOnePeriodUnderAnyDefaultIsolation(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run(fmt.Sprintf("%q", isolation), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			s, _ := isolatedStore(t, isolation)
			counts := race(t, 16, func(i int) (result, error) {
				return s.Claim(ctx, req("cus_1", "k", fmt.Sprint("runner-", i)))
			})
			if counts[claimengine.Won] != 1 || counts[claimengine.InProgress] != 15 {
				t.Errorf("outcomes = %v; want 1 Won and 15 InProgress", counts)
			}
		})
	}
}
