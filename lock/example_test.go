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
