package gocronlock_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
	"github.com/billonce/billonce/lock/gocronlock"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The adapter refuses a second holder with ErrNotAcquired (gocron skips the
// run), and the Unlock gocron calls after the job releases, even with a
// cancelled context.
func TestLocker(t *testing.T) {
	pool := pgtest.Pool(t)
	ctx := context.Background()
	adv, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lock.NewLease(pool, lock.LeaseConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	for _, g := range []lock.Locker{adv, lease} {
		l := gocronlock.New(g)
		first, err := l.Lock(ctx, "report")
		if err != nil {
			t.Fatalf("%T: first Lock: %v", g, err)
		}
		if _, err := l.Lock(ctx, "report"); !errors.Is(err, lock.ErrNotAcquired) {
			t.Fatalf("%T: second Lock error = %v; want ErrNotAcquired", g, err)
		}
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := first.Unlock(cctx); err != nil {
			t.Fatalf("%T: Unlock: %v", g, err)
		}
		again, err := l.Lock(ctx, "report")
		if err != nil {
			t.Fatalf("%T: Lock after Unlock: %v", g, err)
		}
		if err := again.Unlock(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := gocronlock.New(nil).Lock(ctx, "report"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("nil guard: error = %v; want ErrInvalid", err)
	}
}
