package claim_test

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// newPostgres returns a migrated store on a fresh database.
func newPostgres(tb testing.TB, cfg claim.Config) (pgStore, *pgxpool.Pool) {
	tb.Helper()
	pool := pgtest.Pool(tb)
	p, err := claim.NewPostgres(pool, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := p.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return pgStore{p, engineOf(p)}, pool
}

// pgStore is a Postgres store with its engine's methods, for tests.
type pgStore struct {
	*claim.Postgres
	engine
}

func (s pgStore) Get(ctx context.Context, key string) (claim.Claim, error) {
	return s.Postgres.Get(ctx, key)
}

func (s pgStore) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	return s.Postgres.PruneEvents(ctx, olderThan)
}

func (s pgStore) CheckSendSucceed(ctx context.Context, window time.Duration, checks []claimengine.SendCheck, done []claimengine.Success) ([]error, []error) {
	return s.engine.(claimengine.Batcher).CheckSendSucceed(ctx, window, checks, done)
}

// The claim engine, as claim's tests drive it.
type (
	engine  = claimengine.Engine[claim.Claim]
	result  = claimengine.Result[claim.Claim]
	applied = claimengine.Applied[claim.Claim]
)

// engineOf returns the engine of s.
func engineOf(s claim.Store) engine { return claimengine.Of[claim.Claim](s) }

// A harness is a store under test and a way to let time pass for it.
type harness struct {
	store engine
	// pass lets d pass on the store's clock for every claim.
	pass func(t *testing.T, d time.Duration)
}

// bothStores runs f against Postgres and Memory, with the given lease.
func bothStores(t *testing.T, lease time.Duration, f func(t *testing.T, h harness)) {
	cfg := claim.Config{Lease: lease}
	t.Run("postgres", func(t *testing.T) {
		t.Parallel()
		p, pool := newPostgres(t, cfg)
		f(t, harness{store: p, pass: pgPass(pool)})
	})
	t.Run("memory", func(t *testing.T) {
		t.Parallel()
		synctest.Test(t, func(t *testing.T) {
			f(t, harness{store: engineOf(claim.NewMemory(cfg)), pass: func(t *testing.T, d time.Duration) { time.Sleep(d) }})
		})
	})
}

// pgPass lets time pass on the database clock for every claim in pool's
// table, by moving every timestamp back.
func pgPass(pool *pgxpool.Pool) func(t *testing.T, d time.Duration) {
	return func(t *testing.T, d time.Duration) {
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
	}
}

// awaitLockWait returns once a statement of the test's database whose
// text is like like waits for a lock. It fails t if done delivers first:
// what returned instead of waiting.
func awaitLockWait[T any](t *testing.T, pool *pgxpool.Pool, like string, done <-chan T, what string) {
	t.Helper()
	for {
		var waiting int
		if err := pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND query LIKE $1`, like).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == 1 {
			return
		}
		select {
		case a := <-done:
			t.Fatalf("%s returned %+v before it waited for the other transaction; want it to wait", what, a)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// poolOfOne returns a pool of at most one connection on a fresh
// database, and a migrated store on it.
func poolOfOne(t *testing.T, url string) (*pgxpool.Pool, *claim.Postgres) {
	t.Helper()
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	s, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	return pool, s
}
