package main

import (
	"context"
	"maps"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

// TestMain turns the test binary into a runner when the harness re-executes
// it.
func TestMain(m *testing.M) {
	if raw, ok := os.LookupEnv(runnerEnv); ok {
		os.Exit(runnerMain(raw))
	}
	os.Exit(m.Run())
}

// TestChaosSmall runs the harness at CI size: three runner processes bill
// 300 customers while about 10% of requests fail, two runners are killed,
// PostgreSQL restarts once and the runners' backends are terminated once.
// The fake's ledger must show every customer charged exactly once.
func TestChaosSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts PostgreSQL and three runner processes")
	}
	cfg := Config{
		Customers: 300, Runners: 3, Period: "2026-09", Seed: 7,
		Kills: 2, DBRestarts: 1, DBDown: 300 * time.Millisecond, Terminations: 1,
		Rates: map[billingtest.FaultKind]float64{
			billingtest.FaultCut:         0.04,
			billingtest.FaultSlow:        0.005,
			billingtest.FaultErrorBefore: 0.015,
			billingtest.FaultErrorAfter:  0.015,
			billingtest.FaultInFlight:    0.01,
			billingtest.FaultLockTimeout: 0.015,
		},
		DeclineFraction: 0.03,
		Concurrency:     4, BatchSize: 50, Lease: 3 * time.Second,
		AttemptTimeout: time.Second, RetryInitial: 10 * time.Millisecond, RetryMax: 200 * time.Millisecond, RetryAttempts: 8,
		Timeout: 90 * time.Second,
		LogDir:  t.TempDir(),
		Out:     tWriter{t},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	fig, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("figures:\n%s", fig)
	for _, line := range fig.Evidence {
		t.Log(line)
	}
	if fig.Duplicates != 0 || fig.Missing != 0 || fig.Mismatches != 0 || fig.UnsettledAfterFinalRun != 0 {
		t.Errorf("duplicates %d, missing %d, mismatches %d, unsettled %d; want all 0",
			fig.Duplicates, fig.Missing, fig.Mismatches, fig.UnsettledAfterFinalRun)
	}
	if fig.Paid+fig.Declined != cfg.Customers || fig.Declined == 0 {
		t.Errorf("%d charged + %d declined, want %d customers with some declined", fig.Paid, fig.Declined, cfg.Customers)
	}
	// The chaos must really have happened, or the test proves nothing.
	if fig.Kills == 0 || fig.DBRestarts == 0 || fig.BackendTerminations == 0 {
		t.Errorf("kills %d, DB restarts %d, backend terminations %d; want each > 0", fig.Kills, fig.DBRestarts, fig.BackendTerminations)
	}
	for _, k := range []billingtest.FaultKind{billingtest.FaultCut, billingtest.FaultErrorAfter} {
		if fig.Faults[k] == 0 {
			t.Errorf("no %s fault injected", k)
		}
	}
	if fig.Replays == 0 {
		t.Error("no replays served: no lost answer was ever resent")
	}
}

// TestConfigRefusesTimeoutBeyondSlowFault checks that a per-attempt timeout
// the slow fault cannot exceed is refused before anything starts.
func TestConfigRefusesTimeoutBeyondSlowFault(t *testing.T) {
	_, err := Run(context.Background(), Config{Customers: 1, Runners: 1, Period: "2026-09",
		AttemptTimeout: billingtest.DefaultSlowDelay, Lease: time.Minute})
	if err == nil {
		t.Fatal("Run accepted an attempt timeout equal to the slow fault's delay")
	}
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}

// TestVerifyCatches feeds the ledger check a broken ledger: it must count
// each kind of breakage, or a green chaos run would prove nothing.
func TestVerifyCatches(t *testing.T) {
	cfg := Config{Customers: 5, Period: "2026-09"}
	pay := func(id string, i int, amount int64) billingtest.Payment {
		return billingtest.Payment{ID: id, Customer: customerID(i), Amount: amount, Currency: "usd", Paid: true, Period: cfg.Period}
	}
	ok := func(i int) int64 { return price(i).Amount }
	good := []billingtest.Payment{pay("ch_0", 0, ok(0)), pay("ch_1", 1, ok(1)), pay("ch_2", 2, ok(2)), pay("ch_3", 3, ok(3))}
	goodClaims := map[string]claimRow{
		customerID(0): {"succeeded", "ch_0"}, customerID(1): {"succeeded", "ch_1"},
		customerID(2): {"succeeded", "ch_2"}, customerID(3): {"succeeded", "ch_3"},
		customerID(4): {"failed", ""},
	}
	declined := map[string]bool{customerID(4): true}

	tests := []struct {
		name                            string
		payments                        []billingtest.Payment
		claims                          map[string]claimRow
		duplicates, missing, mismatches int
	}{
		{"clean", good, goodClaims, 0, 0, 0},
		{"second charge", append(slices.Clone(good), pay("ch_9", 2, ok(2))), goodClaims, 1, 0, 0},
		{"missing charge", good[1:], goodClaims, 0, 1, 1},
		{"wrong amount", append([]billingtest.Payment{pay("ch_0", 0, ok(0)+1)}, good[1:]...), goodClaims, 0, 0, 1},
		{"declined customer charged", append(slices.Clone(good), pay("ch_4", 4, ok(4))), goodClaims, 0, 0, 1},
		{"charge without succeeded claim", good, with(goodClaims, customerID(1), claimRow{"pending", ""}), 0, 0, 1},
		{"claim names another charge", good, with(goodClaims, customerID(1), claimRow{"succeeded", "ch_x"}), 0, 0, 1},
		{"claim for unknown customer", good, with(goodClaims, "cus_x", claimRow{"succeeded", "ch_x"}), 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var fig Figures
			verify(cfg, tt.payments, tt.claims, declined, &fig)
			if fig.Duplicates != tt.duplicates || fig.Missing != tt.missing || fig.Mismatches != tt.mismatches {
				t.Errorf("duplicates %d, missing %d, mismatches %d; want %d, %d, %d (%v)",
					fig.Duplicates, fig.Missing, fig.Mismatches, tt.duplicates, tt.missing, tt.mismatches, fig.Problems)
			}
		})
	}
}

func with(m map[string]claimRow, k string, v claimRow) map[string]claimRow {
	m = maps.Clone(m)
	m[k] = v
	return m
}
