package main

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/chaos"
	"github.com/billonce/billonce/retry"
)

// workerEnv carries a worker's configuration, as JSON, from the harness to
// the process it starts (the same binary, re-executed).
const workerEnv = "BILLONCE_RIVER_CHAOS_WORKER"

// workerConfig is what one worker process needs.
type workerConfig struct {
	DatabaseURL, StripeURL, Period string
	Customers, ThroughputCustomers int
	Index, Generation              int
	MaxWorkers                     int
	Lease                          time.Duration
	AttemptTimeout                 time.Duration
	JobTimeout, RescueAfter        time.Duration
	LogPath                        string
}

// customers yields the n customers of a period, without prices: jobs carry
// the customer only; the Biller's Config.Price (chaos.PriceOf) prices them.
func customers(n int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for i := range n {
			if !yield(billing.Item{Customer: chaos.CustomerID(i)}, nil) {
				return
			}
		}
	}
}

// biller is a Biller of the run, as every process configures it.
func biller(pool *pgxpool.Pool, stripeURL, owner string, lease, attemptTimeout time.Duration, logger *slog.Logger) (*billing.Biller, error) {
	store, err := claim.NewPostgres(pool, claim.Config{Lease: lease})
	if err != nil {
		return nil, err
	}
	return billing.New(billing.Config{
		SecretKey: "sk_test_river_chaos",
		StripeURL: stripeURL,
		Claims:    store,
		Price:     chaos.PriceOf,
		RateLimit: -1,
		Retry: retry.Policy{InitialInterval: 10 * time.Millisecond, MaxInterval: 200 * time.Millisecond, MaxAttempts: 8,
			AttemptTimeout: attemptTimeout, MaxElapsed: 10 * time.Second},
		Owner:  owner,
		Logger: logger,
	})
}

// workerMain is a worker process: a River client with the charge and
// fan-out workers and the period's periodic fan-out, until SIGTERM.
func workerMain(cfg workerConfig) int {
	logf, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "river-chaos worker: %v\n", err)
		return 3
	}
	defer logf.Close()
	logger := slog.New(slog.NewJSONHandler(logf, &slog.HandlerOptions{Level: slog.LevelWarn})).
		With("worker", cfg.Index, "gen", cfg.Generation, "pid", os.Getpid())
	fail := func(what string, err error) int {
		logger.Error("river-chaos worker: "+what, "error", err)
		return 3
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		return fail("pool", err)
	}
	defer pool.Close()
	b, err := biller(pool, cfg.StripeURL, fmt.Sprintf("river-%d-%d", cfg.Index, cfg.Generation), cfg.Lease, cfg.AttemptTimeout, logger)
	if err != nil {
		return fail("biller", err)
	}
	charge, err := riverbilling.NewWorker(b, riverbilling.WorkerConfig{
		JobTimeout: cfg.JobTimeout, RetryInterval: 100 * time.Millisecond, MaxRetryInterval: 2 * time.Second, Logger: logger,
	})
	if err != nil {
		return fail("charge worker", err)
	}
	fanOut, err := riverbilling.NewFanOutWorker(riverbilling.FanOutConfig{
		DB: pool,
		Customers: func(_ context.Context, period string) iter.Seq2[billing.Item, error] {
			if period == riverPeriod {
				return customers(cfg.ThroughputCustomers)
			}
			return customers(cfg.Customers)
		},
		// A fan-out cut short by the timeout is retried and goes on where
		// it stopped; a short timeout gets a killed leader's fan-out
		// rescued quickly.
		Timeout: cfg.JobTimeout,
		Logger:  logger,
	})
	if err != nil {
		return fail("fan-out worker", err)
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, charge)
	river.AddWorker(workers, fanOut)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		ID:      fmt.Sprintf("river-chaos-%d-%d-%d", cfg.Index, cfg.Generation, os.Getpid()),
		Queues:  map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: cfg.MaxWorkers}},
		Workers: workers,
		PeriodicJobs: []*river.PeriodicJob{riverbilling.PeriodicFanOut(river.PeriodicInterval(time.Hour),
			func(time.Time) string { return cfg.Period }, &river.PeriodicJobOpts{RunOnStart: true})},
		FetchCooldown:        10 * time.Millisecond,
		FetchPollInterval:    200 * time.Millisecond,
		JobTimeout:           cfg.JobTimeout,
		RescueStuckJobsAfter: cfg.RescueAfter,
		Logger:               logger,
	})
	if err != nil {
		return fail("river client", err)
	}
	// PostgreSQL may be restarting: try for a while, as a supervisor
	// restarting the process would.
	for try := 1; ; try++ {
		err := client.Start(ctx)
		if err == nil {
			break
		}
		if try == 20 || ctx.Err() != nil {
			return fail("starting river", err)
		}
		time.Sleep(500 * time.Millisecond)
	}
	<-ctx.Done()
	stopCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := client.Stop(stopCtx); err != nil {
		return fail("stopping river", err)
	}
	return 0
}
