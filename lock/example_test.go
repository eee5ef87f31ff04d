package lock_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

func Example() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	ran, err := lock.Do(ctx, guard, "monthly-billing:2026-09", func(ctx context.Context) error {
		other, _ := lock.Do(ctx, guard, "monthly-billing:2026-09", func(context.Context) error { return nil })
		fmt.Println("billing customers; other replica ran:", other)
		return nil
	})
	fmt.Println("ran:", ran, "err:", err)
	// Output:
	// billing customers; other replica ran: false
	// ran: true err: <nil>
}

// Behind PgBouncer in transaction mode, use a lease row instead.
func ExampleLease() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		log.Fatal(err)
	}
	defer stop()

	guard, err := lock.NewLease(pool, lock.LeaseConfig{Namespace: "billing", TTL: 30 * time.Second})
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	ran, err := lock.Do(ctx, guard, "monthly-billing:2026-09", func(ctx context.Context) error {
		fmt.Println("billing customers")
		return nil
	})
	fmt.Println("ran:", ran, "err:", err)
	// Output:
	// billing customers
	// ran: true err: <nil>
}

// A write that must come from the lease's current holder checks the
// holder's token against the lease row in its own statement.
func ExampleToken() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		log.Fatal(err)
	}
	defer stop()
	if _, err := pool.Exec(ctx, `CREATE TABLE exports (period text, file text)`); err != nil {
		log.Fatal(err)
	}
	guard, err := lock.NewLease(pool, lock.LeaseConfig{Namespace: "billing"})
	if err != nil {
		log.Fatal(err)
	}
	if err := guard.Migrate(ctx); err != nil {
		log.Fatal(err)
	}
	export := func(ctx context.Context, file string) error {
		token, _ := lock.Token(ctx)
		tag, err := pool.Exec(ctx, `INSERT INTO exports (period, file)
			SELECT $2, $3 FROM `+guard.Table()+` WHERE token = $1 FOR SHARE`, token, "2026-09", file)
		if err == nil && tag.RowsAffected() == 0 {
			err = fmt.Errorf("export %s refused: another replica holds the lock now", file)
		}
		return err
	}
	ran, err := lock.Do(ctx, guard, "exports:2026-09", func(ctx context.Context) error {
		fmt.Println(export(ctx, "a.csv"))
		// This holder stalls past its TTL, and another replica takes the
		// lease over.
		pool.Exec(ctx, `UPDATE `+guard.Table()+` SET lock_until = now()`)
		other, _ := guard.Lock(ctx, "exports:2026-09")
		defer other.Unlock(ctx)
		return export(ctx, "b.csv")
	})
	fmt.Println("ran:", ran, "err:", err)
	// Output:
	// <nil>
	// ran: true err: export b.csv refused: another replica holds the lock now
}
