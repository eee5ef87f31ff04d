// Command chaos proves exactly-once billing under fire. It serves the fake
// Stripe of billing/billingtest, starts a throwaway PostgreSQL, and runs
// several runner processes that bill the same period for the same customers
// at once, while Stripe fails on purpose, runners are SIGKILLed and
// restarted, PostgreSQL is restarted and the runners' backends are
// terminated. Then it turns the faults off, runs a clean run and a
// reconcile pass, and checks the fake's ledger: every customer charged
// exactly once at the right amount, none missing but the declined, and
// every charge matched by a succeeded claim. It exits 1 if any of that fails.
// With -mode invoices the runners bill by invoice, with -mode usage they
// report usage windows to a meter, with -mode refunds they bill and then
// refund every payment by a few refund ids, with -mode moneyout they
// transfer to connected accounts and pay each out, and the check counts
// invoices and their lines, meter events, refunds, or transfers and
// payouts, at the fake.
//
//	go run ./internal/cmd/chaos
//	go run ./internal/cmd/chaos -customers 10000 -kills 5 -db-restarts 1 -cut 0.15
//	go run ./internal/cmd/chaos -mode usage -windows 3
//	go run ./internal/cmd/chaos -mode refunds
//	go run ./internal/cmd/chaos -mode moneyout -customers 500
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
	chaos.Child(runnerEnv, runnerMain)
	cfg := Config{Rates: map[billingtest.FaultKind]float64{}}
	flag.StringVar(&cfg.Mode, "mode", ModeCharges, "what the runners do: "+ModeCharges+" (bill the period), "+ModeInvoices+" (bill it by invoice), "+ModeUsage+" (report usage windows to a meter), "+ModeRefunds+" (bill the period, then refund every payment by a few refund ids) or "+ModeMoneyOut+" (transfer to a connected account per customer, then pay each out)")
	flag.IntVar(&cfg.Windows, "windows", 3, "usage windows per customer, in -mode "+ModeUsage)
	flag.IntVar(&cfg.Customers, "customers", 2000, "customers to bill")
	flag.IntVar(&cfg.Runners, "runners", 3, "runner processes billing the same period at once")
	flag.StringVar(&cfg.Period, "period", "2026-09", "billing period")
	flag.Int64Var(&cfg.Seed, "seed", 1, "seed of the faults, declines and chaos events")
	flag.IntVar(&cfg.Kills, "kills", 3, "runners to SIGKILL (and restart) at random points of the run")
	flag.IntVar(&cfg.DBRestarts, "db-restarts", 1, "PostgreSQL restarts at random points of the run")
	flag.DurationVar(&cfg.DBDown, "db-down", 500*time.Millisecond, "how long PostgreSQL stays down on a restart")
	flag.IntVar(&cfg.Terminations, "terminations", 2, "times to pg_terminate_backend every runner connection")
	chaos.FaultFlags(flag.CommandLine, cfg.Rates, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.05, billingtest.FaultDrop: 0, billingtest.FaultSlow: 0.01, billingtest.FaultErrorBefore: 0.02,
		billingtest.FaultErrorAfter: 0.02, billingtest.FaultInFlight: 0.02, billingtest.FaultLockTimeout: 0.02,
	})
	flag.Float64Var(&cfg.DeclineFraction, "declines", 0.02, "fraction of customers whose card always declines (in -mode "+ModeMoneyOut+": whose account's payout the bank returns after it was paid)")
	flag.DurationVar(&cfg.MeterDelay, "meter-delay", 0, "how long after acceptance the fake counts a meter event or rejects it into an error report, in -mode "+ModeUsage+" (0: DefaultMeterDelay)")
	flag.IntVar(&cfg.Concurrency, "concurrency", 8, "charges in flight per runner")
	flag.IntVar(&cfg.BatchSize, "batch", 200, "claims per database round trip")
	flag.DurationVar(&cfg.Lease, "lease", 3*time.Second, "claim lease: how long a killed runner's claims wait before others resume them")
	flag.DurationVar(&cfg.AttemptTimeout, "attempt-timeout", time.Second, "per-attempt timeout of the runners (must be below the slow fault's 2s)")
	flag.DurationVar(&cfg.RetryInitial, "retry-initial", 10*time.Millisecond, "first retry interval")
	flag.DurationVar(&cfg.RetryMax, "retry-max", 200*time.Millisecond, "largest retry interval")
	flag.IntVar(&cfg.RetryAttempts, "retry-attempts", 8, "attempts per charge within one run")
	flag.DurationVar(&cfg.Timeout, "timeout", 30*time.Minute, "give up if the runners are not done by then: a bound on liveness, well above a run's length (invoices at full size take about 10 minutes on 2 cores)")
	flag.StringVar(&cfg.LogDir, "logdir", "", "keep the runners' logs here (default: a temporary directory, removed if all is well)")
	flag.Parse()

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	cfg.Out = os.Stderr
	fig, err := Run(ctx, cfg)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	fmt.Printf("billonce chaos: %s\n", strings.TrimSpace("go run ./internal/cmd/chaos "+strings.Join(os.Args[1:], " ")))
	fmt.Print(fig)
	if !fig.OK() {
		for _, line := range fig.Evidence {
			fmt.Println(line)
		}
		fmt.Printf("FAIL: invariants broken; logs kept in %s (seed %d)\n", fig.LogDir, cfg.Seed)
		os.Exit(1)
	}
	switch cfg.Mode {
	case ModeUsage:
		fmt.Println("OK: every usage window counted exactly once, none of the rejected")
		return
	case ModeInvoices:
		fmt.Println("OK: every customer invoiced exactly once, each line once")
		return
	case ModeRefunds:
		fmt.Println("OK: every customer charged exactly once, each refund made exactly once, none past the payment")
		return
	case ModeMoneyOut:
		fmt.Println("OK: every account paid one transfer and one payout exactly once, each returned payout failed and not paid again")
		return
	}
	fmt.Println("OK: every customer charged exactly once")
}
