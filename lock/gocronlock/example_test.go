package gocronlock_test

import (
	"context"
	"fmt"
	"log"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
	"github.com/billonce/billonce/lock/gocronlock"
	"github.com/go-co-op/gocron/v2"
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

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gocronlock.New(guard)))
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() {
			fmt.Println("report built by the replica holding the lock")
			close(done)
		}),
		gocron.WithName("monthly-report")) // the lock name
	if err != nil {
		log.Fatal(err)
	}
	s.Start()
	<-done
	s.Shutdown()
	// Output: report built by the replica holding the lock
}
