// Command scheduling runs one job on two "replicas" with robfig/cron and
// with gocron v2, guarded by package lock so that each tick runs the job on
// one replica only. It stops after a few ticks.
//
//	go run ./examples/scheduling                      # throwaway PostgreSQL
//	go run ./examples/scheduling -database-url postgres://...
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
	"github.com/billonce/billonce/lock/gocronlock"
	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/robfig/cron/v3"
)

func main() {
	dbURL := flag.String("database-url", "", "PostgreSQL connection string (default: start a throwaway cluster)")
	ticks := flag.Int("ticks", 2, "number of one-second ticks to run before exiting")
	flag.Parse()
	if err := run(*dbURL, *ticks); err != nil {
		log.Fatal(err)
	}
}

func run(dbURL string, ticks int) error {
	ctx := context.Background()
	if dbURL == "" {
		cluster, err := pgtest.Start(ctx)
		if err != nil {
			return err
		}
		defer cluster.Stop()
		if dbURL, err = cluster.NewDatabase(ctx); err != nil {
			return err
		}
	}
	logger := slog.New(slog.NewTextHandler(os.Stdout, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{} // keep the output short
			}
			return a
		},
	}))
	// The job takes a while, so the replicas' ticks overlap.
	var robfigRuns, gocronRuns atomic.Int64
	job := func(counter *atomic.Int64) func(ctx context.Context) error {
		return func(ctx context.Context) error {
			counter.Add(1)
			select {
			case <-time.After(300 * time.Millisecond):
				return nil
			case <-ctx.Done(): // lock lost or shutting down
				return context.Cause(ctx)
			}
		}
	}

	// Schedulers stop before the pools close: deferred calls run last-in
	// first-out, and each replica defers its pool's Close before its
	// schedulers' stops.
	for _, replica := range []string{"a", "b"} {
		// Each replica has its own pool, as separate pods would.
		pool, err := pgxpool.New(ctx, dbURL)
		if err != nil {
			return err
		}
		defer pool.Close()
		log := logger.With("replica", replica)
		guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "example", Logger: log})
		if err != nil {
			return err
		}

		// robfig/cron: wrap the job with Func.
		c := cron.New(cron.WithSeconds())
		if _, err := c.AddFunc("@every 1s", lock.Func(ctx, guard, "robfig-report", job(&robfigRuns))); err != nil {
			return err
		}
		c.Start()
		defer func() { <-c.Stop().Done() }()

		// gocron v2: the adapter is the scheduler's distributed locker; the
		// job's name is the lock name.
		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gocronlock.New(guard)))
		if err != nil {
			return err
		}
		if _, err := s.NewJob(gocron.DurationJob(time.Second),
			gocron.NewTask(func(ctx context.Context) error { return job(&gocronRuns)(ctx) }),
			gocron.WithName("gocron-report")); err != nil {
			return err
		}
		s.Start()
		defer s.Shutdown()
	}

	wait := time.Duration(ticks)*time.Second + 500*time.Millisecond
	time.Sleep(wait)
	fmt.Printf("%v on 2 replicas: robfig/cron job ran %d times, gocron job ran %d times, each tick on one replica\n",
		wait, robfigRuns.Load(), gocronRuns.Load())
	return nil
}
