package lock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/lock"
	"github.com/jackc/pgx/v5"
)

// A lease table that an earlier billonce created (CREATE TABLE IF NOT
// EXISTS, no record) through the default search_path ("$user", public)
// lives in public. Once a schema named after the role exists, Migrate must
// keep using public's table, whose leases are held, rather than create an
// empty one in front of it that a second replica locks at once.
func TestLeaseMigrateKeepsTheTableTheSearchPathFinds(t *testing.T) {
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	mustExec(t, pool, `CREATE TABLE public.billonce_lock_leases (namespace text NOT NULL, name text NOT NULL, owner text NOT NULL,
		locked_at timestamptz NOT NULL, lock_until timestamptz NOT NULL, PRIMARY KEY (namespace, name))`)
	mustExec(t, pool, `INSERT INTO public.billonce_lock_leases VALUES ('', 'job', 'old-replica', now(), now() + interval '1 hour')`)
	var user string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		t.Fatal(err)
	}
	mustExec(t, pool, "CREATE SCHEMA "+pgx.Identifier{user}.Sanitize())

	g := newLease(t, pool, lock.LeaseConfig{})
	if l, err := g.Lock(ctx, "job"); !errors.Is(err, lock.ErrNotAcquired) {
		if err == nil {
			l.Unlock(ctx)
		}
		t.Errorf("Lock of a lease another replica holds, after Migrate: %v; want ErrNotAcquired", err)
	}
}
