package lock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/lock"
	"github.com/jackc/pgx/v5/pgxpool"
)

func newLease(t *testing.T, pool *pgxpool.Pool, cfg lock.LeaseConfig) *lock.Lease {
	t.Helper()
	g, err := lock.NewLease(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := g.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	return g
}

func leaseOwner(t *testing.T, pool *pgxpool.Pool, name string) string {
	t.Helper()
	var owner string
	if err := pool.QueryRow(context.Background(), `SELECT owner FROM `+lock.DefaultLeaseTable+` WHERE name = $1`, name).Scan(&owner); err != nil {
		t.Fatalf("reading the lease of %q: %v", name, err)
	}
	return owner
}

// Database time: a holder whose process dies stops renewing; after the lease expires
// on the database clock another process takes over.
func TestLeaseTakeoverAfterHolderDies(t *testing.T) {
	t.Parallel()
	pool, url := newPool(t, 0)
	const name = "monthly-billing:2026-09"
	const ttl = time.Second
	g := newLease(t, pool, lock.LeaseConfig{TTL: ttl})
	holder := startHelper(t, "lease-hold", url, name, ttl.String())
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM held`) == 1 })

	ctx := context.Background()
	job := func(context.Context) error { return nil }
	if ran, err := lock.Do(ctx, g, name, job); ran || err != nil {
		t.Fatalf("while the holder lives: Do = %v, %v; want ran=false, nil", ran, err)
	}
	// The holder renews: its lease reaches past its first TTL.
	poll(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM `+lock.DefaultLeaseTable+` WHERE lock_until > locked_at + $1 * interval '1 microsecond'`, ttl.Microseconds()) == 1
	})
	if err := holder.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killedAt := time.Now()
	var ran bool
	poll(t, func() bool {
		var err error
		ran, err = lock.Do(ctx, g, name, job)
		if err != nil {
			t.Fatal(err)
		}
		return ran
	})
	t.Logf("holder killed -> lease taken over after %v (TTL %v)", time.Since(killedAt), ttl)
	if n := count(t, pool, `SELECT count(*) FROM `+lock.DefaultLeaseTable); n != 0 {
		t.Fatalf("%d lease rows left after the job; want 0", n)
	}
}

// An expired row is taken over at once; a live one is not. Expiry is set on
// the database clock.
func TestLeaseExpiryOnDatabaseClock(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	g := newLease(t, pool, lock.LeaseConfig{})
	ctx := context.Background()
	job := func(context.Context) error { return nil }
	mustExec(t, pool, `INSERT INTO `+lock.DefaultLeaseTable+` VALUES ('', 'live', 'someone-else', now(), now() + interval '1 hour'),
		('', 'expired', 'someone-else', now() - interval '2 hour', now() - interval '1 second')`)
	if ran, err := lock.Do(ctx, g, "live", job); ran || err != nil {
		t.Fatalf("live lease: Do = %v, %v; want ran=false, nil", ran, err)
	}
	if owner := leaseOwner(t, pool, "live"); owner != "someone-else" {
		t.Fatalf("live lease owner changed to %q", owner)
	}
	if ran, err := lock.Do(ctx, g, "expired", job); !ran || err != nil {
		t.Fatalf("expired lease: Do = %v, %v; want it taken over", ran, err)
	}
}

// A stale holder (its lease expired and was taken over) learns it lost the
// lease and can neither renew nor release the newer holder's lease.
func TestLeaseStaleHolderCannotTouchNewLease(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	cfg := lock.LeaseConfig{TTL: time.Hour, RenewInterval: 50 * time.Millisecond}
	a, b := newLease(t, pool, cfg), newLease(t, pool, cfg)

	stale, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	staleOwner := leaseOwner(t, pool, "job")
	if _, err := b.Lock(ctx, "job"); !errors.Is(err, lock.ErrNotAcquired) {
		t.Fatalf("second Acquire error = %v; want ErrNotAcquired", err)
	}
	mustExec(t, pool, `UPDATE `+lock.DefaultLeaseTable+` SET lock_until = now() - interval '1 second'`)
	fresh, err := b.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("takeover of the expired lease: %v", err)
	}
	freshOwner := leaseOwner(t, pool, "job")
	if freshOwner == staleOwner {
		t.Fatal("the new holder reused the stale owner token")
	}

	<-stale.Lost() // the stale holder is told it lost the lease
	if !errors.Is(stale.Err(), lock.ErrLockLost) {
		t.Fatalf("stale Err = %v; want ErrLockLost", stale.Err())
	}
	if err := stale.Unlock(ctx); !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("stale Unlock = %v; want ErrLockLost", err)
	}
	if owner := leaseOwner(t, pool, "job"); owner != freshOwner {
		t.Fatalf("after the stale holder's Unlock, owner = %q; want the new holder %q", owner, freshOwner)
	}
	// The new holder keeps renewing successfully, then releases.
	var until1, until2 time.Time
	pool.QueryRow(ctx, `SELECT lock_until FROM `+lock.DefaultLeaseTable).Scan(&until1)
	poll(t, func() bool {
		pool.QueryRow(ctx, `SELECT lock_until FROM `+lock.DefaultLeaseTable).Scan(&until2)
		return until2.After(until1)
	})
	if fresh.Err() != nil {
		t.Fatalf("new holder lost its lease: %v", fresh.Err())
	}
	if err := fresh.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count(t, pool, `SELECT count(*) FROM `+lock.DefaultLeaseTable); n != 0 {
		t.Fatalf("%d lease rows after release; want 0", n)
	}
}

// A job whose lease is taken over while it runs is cancelled with cause
// ErrLockLost, and a nested Do in the same process is refused.
func TestLeaseLostCancelsJob(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	g := newLease(t, pool, lock.LeaseConfig{TTL: time.Hour, RenewInterval: 50 * time.Millisecond})
	ran, err := lock.Do(ctx, g, "job", func(ctx context.Context) error {
		if ran, err := lock.Do(ctx, g, "job", func(context.Context) error { return nil }); ran || err != nil {
			t.Errorf("nested Do = %v, %v; want ran=false, nil", ran, err)
		}
		mustExec(t, pool, `UPDATE `+lock.DefaultLeaseTable+` SET owner = 'usurper'`)
		<-ctx.Done()
		if cause := context.Cause(ctx); !errors.Is(cause, lock.ErrLockLost) {
			t.Errorf("cause = %v; want ErrLockLost", cause)
		}
		return nil
	})
	if !ran || !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Do = %v, %v; want ran and ErrLockLost", ran, err)
	}
	if owner := leaseOwner(t, pool, "job"); owner != "usurper" {
		t.Fatalf("the lost holder released the usurper's lease (owner now %q)", owner)
	}
}

// Migrate lists its migration in a record named after the lease table,
// upgrades a table an earlier billonce made with CREATE TABLE IF NOT
// EXISTS and no record, and refuses a table a newer billonce migrated
// (the runner's own tests, in internal/migrate, cover the rest).
func TestLeaseMigrateRecord(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	mustExec(t, pool, `CREATE TABLE other_leases (namespace text NOT NULL, name text NOT NULL, owner text NOT NULL,
		locked_at timestamptz NOT NULL, lock_until timestamptz NOT NULL, PRIMARY KEY (namespace, name))`)
	mustExec(t, pool, `INSERT INTO other_leases VALUES ('', 'job', 'someone', now(), now() + interval '1 hour')`)
	g := newLease(t, pool, lock.LeaseConfig{Table: "other_leases"})
	if n := count(t, pool, `SELECT count(*) FROM other_leases_migrations WHERE version = 1 AND name = 'create'`); n != 1 {
		t.Errorf("other_leases_migrations lists migration 1 %d times; want once", n)
	}
	if _, err := g.Lock(ctx, "job"); !errors.Is(err, lock.ErrNotAcquired) {
		t.Errorf("Lock of a lease held before the upgrade: %v; want ErrNotAcquired", err)
	}
	mustExec(t, pool, `INSERT INTO other_leases_migrations (version, name) VALUES (99, 'future')`)
	if err := g.Migrate(ctx); !errors.Is(err, lock.ErrNewerSchema) {
		t.Errorf("Migrate with a newer record: %v; want ErrNewerSchema", err)
	}
}
