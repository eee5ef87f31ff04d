package lock_test

import (
	"context"
	"testing"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

func BenchmarkKey(b *testing.B) {
	for b.Loop() {
		lock.Key("billing", "monthly-billing:2026-09")
	}
}

// The cost of guarding a job: acquire, release, and (for Advisory) the
// connection that is closed afterwards and replaced by the pool.
func BenchmarkDo(b *testing.B) {
	pool := pgtest.Pool(b)
	adv, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		b.Fatal(err)
	}
	lease, err := lock.NewLease(pool, lock.LeaseConfig{})
	if err != nil {
		b.Fatal(err)
	}
	if err := lease.Migrate(context.Background()); err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	job := func(context.Context) error { return nil }
	for _, bc := range []struct {
		name  string
		guard lock.Locker
	}{{"advisory", adv}, {"lease", lease}} {
		b.Run(bc.name, func(b *testing.B) {
			for b.Loop() {
				if ran, err := lock.Do(ctx, bc.guard, "job", job); !ran || err != nil {
					b.Fatalf("Do = %v, %v", ran, err)
				}
			}
		})
		b.Run(bc.name+"/held-elsewhere", func(b *testing.B) {
			h, err := bc.guard.Lock(ctx, "busy")
			if err != nil {
				b.Fatal(err)
			}
			defer h.Unlock(ctx)
			for b.Loop() {
				if ran, err := lock.Do(ctx, bc.guard, "busy", job); ran || err != nil {
					b.Fatalf("Do = %v, %v", ran, err)
				}
			}
		})
	}
}
