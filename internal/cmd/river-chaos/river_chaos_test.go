package main

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/chaos"
	"github.com/billonce/billonce/internal/testenv"
)

// TestMain turns the test binary into a worker when the harness re-executes
// it.
func TestMain(m *testing.M) {
	chaos.Child(workerEnv, workerMain)
	os.Exit(m.Run())
}

// TestRiverChaosSmall runs the harness at CI size: three worker processes
// bill 300 customers through River while Stripe fails on purpose, one
// worker is SIGKILLed and PostgreSQL restarts once. The fake's ledger must
// show every customer charged exactly once.
func TestRiverChaosSmall(t *testing.T) {
	testenv.Long(t) // starts PostgreSQL and three worker processes
	cfg := Config{
		Customers: 300, Workers: 3, MaxWorkers: 4, Period: "2026-09", Seed: 3,
		Kills: 1, DBRestarts: 1, DBDown: 300 * time.Millisecond,
		Rates: map[billingtest.FaultKind]float64{
			billingtest.FaultCut:         0.04,
			billingtest.FaultErrorBefore: 0.02,
			billingtest.FaultErrorAfter:  0.02,
			billingtest.FaultInFlight:    0.01,
			billingtest.FaultLockTimeout: 0.01,
		},
		DeclineFraction: 0.03,
		Lease:           3 * time.Second, AttemptTimeout: time.Second,
		JobTimeout: 15 * time.Second, RescueAfter: 20 * time.Second,
		ThroughputCustomers: 100,
		Timeout:             150 * time.Second,
		LogDir:              t.TempDir(),
		Out:                 chaos.LogWriter(t),
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	fig, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures:\n%s", fig)
	if !fig.OK() {
		t.Errorf("duplicates %d, missing %d, mismatches %d; want all 0", fig.Duplicates, fig.Missing, fig.Mismatches)
	}
	if fig.Paid+fig.Declined != cfg.Customers || fig.Declined == 0 {
		t.Errorf("%d charged + %d declined, want %d customers with some declined", fig.Paid, fig.Declined, cfg.Customers)
	}
	// The chaos must really have happened, or the test proves nothing.
	if fig.Kills == 0 || fig.DBRestarts == 0 || fig.Faults[billingtest.FaultCut] == 0 || fig.Replays == 0 {
		t.Errorf("kills %d, DB restarts %d, cuts %d, replays %d; want each > 0", fig.Kills, fig.DBRestarts, fig.Faults[billingtest.FaultCut], fig.Replays)
	}
}
