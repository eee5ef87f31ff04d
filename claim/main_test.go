package claim_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newPostgres returns a migrated store on a fresh database.
func newPostgres(tb testing.TB, cfg claim.Config) (*claim.Postgres, *pgxpool.Pool) {
	tb.Helper()
	pool := pgtest.Pool(tb)
	p, err := claim.NewPostgres(pool, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return p, pool
}

// A harness is a store under test and a way to let time pass for it.
type harness struct {
	store claim.Store
	// pass lets d pass on the store's clock for every claim.
	pass func(t *testing.T, d time.Duration)
}

// bothStores runs f against Postgres and Memory, with the given lease.
func bothStores(t *testing.T, lease time.Duration, f func(t *testing.T, h harness)) {
	cfg := claim.Config{Lease: lease}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		p, pool := newPostgres(t, cfg)
		f(t, harness{store: p, pass: func(t *testing.T, d time.Duration) {
			// Moving every timestamp back by d is time passing on the database clock.
			_, err := pool.Exec(context.Background(), `UPDATE billonce_claims SET created_at = created_at - $1::bigint * interval '1 microsecond',
				updated_at = updated_at - $1::bigint * interval '1 microsecond', lease_until = lease_until - $1::bigint * interval '1 microsecond',
				first_sent_at = first_sent_at - $1::bigint * interval '1 microsecond', reconciled_at = reconciled_at - $1::bigint * interval '1 microsecond',
				processing_at = processing_at - $1::bigint * interval '1 microsecond'`,
				d.Microseconds())
			if err != nil {
				t.Fatal(err)
			}
			_, err = pool.Exec(context.Background(), `UPDATE billonce_claims_events SET received_at = received_at - $1::bigint * interval '1 microsecond'`, d.Microseconds())
			if err != nil {
				t.Fatal(err)
			}
		}})
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f(t, harness{store: claim.NewMemory(cfg), pass: func(t *testing.T, d time.Duration) { time.Sleep(d) }})
		})
	})
}
