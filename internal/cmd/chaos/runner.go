package main

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/chaos"
	"github.com/billonce/billonce/retry"
)

// runnerEnv carries a runner's configuration, as JSON, from the harness to
// the process it starts (the same binary, re-executed).
const runnerEnv = "BILLONCE_CHAOS_RUNNER"

// runnerConfig is what one runner process needs.
type runnerConfig struct {
	DatabaseURL string
	StripeURL   string
	Period      string
	Customers   int
	// Index and Runners place the runner's starting point: runner i starts
	// at customer i*Customers/Runners and wraps around, so runners meet on
	// the same customers while each still starts somewhere else.
	Index, Runners int
	Generation     int
	Concurrency    int
	BatchSize      int
	Lease          time.Duration
	// The retry policy's durations and attempts (a Policy itself holds a
	// func and does not travel as JSON).
	AttemptTimeout, RetryInitial, RetryMax time.Duration
	RetryAttempts                          int
	LogPath                                string
	Deadline                               time.Time
}

// items yields customers start, start+1, … n-1, 0, … start-1, each with its
// price.
func items(n, start int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for k := range n {
			i := (start + k) % n
			p := chaos.Price(i)
			if !yield(billing.Item{Customer: chaos.CustomerID(i), Price: &p}, nil) {
				return
			}
		}
	}
}

// runnerMain is a runner process: it bills the period until one Run leaves
// nothing pending, then exits 0. It exits 2 if the deadline passes first.
func runnerMain(cfg runnerConfig) int {
	logf, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos runner: %v\n", err)
		return 3
	}
	defer logf.Close()
	logger := slog.New(slog.NewJSONHandler(logf, nil)).With("runner", cfg.Index, "gen", cfg.Generation, "pid", os.Getpid())
	ctx, cancel := context.WithDeadline(context.Background(), cfg.Deadline)
	defer cancel()

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		logger.Error("chaos runner: pool", "error", err)
		return 3
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		logger.Error("chaos runner: claim store", "error", err)
		return 3
	}
	b, err := billing.New(billing.Config{
		SecretKey: "sk_test_chaos",
		StripeURL: cfg.StripeURL,
		Claims:    store,
		RateLimit: -1,
		Retry: retry.Policy{
			InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, MaxAttempts: cfg.RetryAttempts,
			AttemptTimeout: cfg.AttemptTimeout, MaxElapsed: 30 * time.Second,
		},
		Owner:  fmt.Sprintf("chaos-%d-%d-%d", cfg.Index, cfg.Generation, os.Getpid()),
		Logger: logger,
	})
	if err != nil {
		logger.Error("chaos runner: biller", "error", err)
		return 3
	}
	start := cfg.Index * cfg.Customers / max(1, cfg.Runners)
	for run := 1; ; run++ {
		sum, err := b.Run(ctx, cfg.Period, items(cfg.Customers, start), &billing.RunOptions{
			Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize, Total: cfg.Customers,
		})
		logger.Info("chaos runner: run finished", "run", run, "created", sum.Created, "already_done", sum.AlreadyBilled,
			"failed", sum.Declined, "pending", sum.Pending, "invalid", sum.Invalid, "elapsed", sum.Elapsed, "error", err)
		if err == nil && sum.Pending == 0 && sum.Invalid == 0 && sum.Done == cfg.Customers {
			return 0
		}
		select {
		case <-ctx.Done():
			logger.Error("chaos runner: deadline passed with customers still pending", "pending", sum.Pending)
			return 2
		case <-time.After(100 * time.Millisecond):
		}
	}
}
