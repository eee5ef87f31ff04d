// Command river-chaos proves exactly-once billing through River across
// processes. It serves the fake Stripe of billing/billingtest with faults,
// starts a throwaway PostgreSQL with River's and billonce's tables, and runs
// worker processes (this binary, re-executed) that each run a River client
// with riverbilling's charge and fan-out workers. River's leader fans the
// period out; the workers bill it, while workers are SIGKILLed and
// restarted and PostgreSQL is restarted. Then it checks the fake's ledger:
// every customer charged exactly once at the right amount, none missing but
// the declined. Last, with faults off, it times one Biller.Run against the
// River workers on the same fake. It exits 1 if an invariant broke.
//
//	go run ./internal/cmd/river-chaos
//	go run ./internal/cmd/river-chaos -customers 2000 -kills 1 -throughput 1000
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/chaos"
)

func main() {
	chaos.Child(workerEnv, workerMain)
	cfg := Config{Rates: map[billingtest.FaultKind]float64{}}
	flag.IntVar(&cfg.Customers, "customers", 10000, "customers to bill")
	flag.IntVar(&cfg.Workers, "workers", 3, "worker processes, each a River client")
	flag.IntVar(&cfg.MaxWorkers, "river-workers", 1, "River workers (charge jobs at once, each billing 8 customers at once) per process")
	flag.StringVar(&cfg.Period, "period", "2026-09", "billing period")
	flag.Int64Var(&cfg.Seed, "seed", 1, "seed of the faults, declines and chaos events")
	flag.IntVar(&cfg.Kills, "kills", 2, "worker processes to SIGKILL (and restart) at seeded points of the run")
	flag.IntVar(&cfg.DBRestarts, "db-restarts", 1, "PostgreSQL restarts at seeded points of the run")
	flag.DurationVar(&cfg.DBDown, "db-down", 500*time.Millisecond, "how long PostgreSQL stays down on a restart")
	chaos.FaultFlags(flag.CommandLine, cfg.Rates, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.03, billingtest.FaultSlow: 0.005, billingtest.FaultErrorBefore: 0.01,
		billingtest.FaultErrorAfter: 0.01, billingtest.FaultInFlight: 0.01, billingtest.FaultLockTimeout: 0.01,
	})
	flag.Float64Var(&cfg.DeclineFraction, "declines", 0.02, "fraction of customers whose card always declines")
	flag.DurationVar(&cfg.Lease, "lease", 3*time.Second, "claim lease: how long a killed worker's claims wait before others resume them")
	flag.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", time.Second, "per-attempt timeout (must be below the slow fault's 2s)")
	flag.DurationVar(&cfg.JobTimeout, "job-timeout", 15*time.Second, "River job timeout of a charge")
	flag.DurationVar(&cfg.RescueAfter, "rescue-after", 20*time.Second, "River's RescueStuckJobsAfter: when a killed worker's running jobs are retried")
	flag.IntVar(&cfg.ThroughputCustomers, "throughput", 3000, "customers billed by one Biller.Run and by the River workers, faults off (0 skips)")
	flag.DurationVar(&cfg.Timeout, "timeout", 10*time.Minute, "give up if the period is not settled by then")
	flag.StringVar(&cfg.LogDir, "logdir", "", "keep the workers' logs here (default: a temporary directory, removed if all is well)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg.Out = os.Stderr
	fig, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("billonce river-chaos: %s\n", strings.TrimSpace("go run ./internal/cmd/river-chaos "+strings.Join(os.Args[1:], " ")))
	fmt.Print(fig)
	if !fig.OK() {
		fmt.Printf("FAIL: invariants broken; logs kept in %s (seed %d)\n", fig.LogDir, cfg.Seed)
		os.Exit(1)
	}
	fmt.Println("OK: every customer charged exactly once")
}
