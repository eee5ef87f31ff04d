// Command bench measures what billonce's safety costs and prints one table:
// key derivation, claim round trips and batches, a full billing Run against
// a naive loop on the same zero-latency fake Stripe and again with answers
// delayed like Stripe's, a rate-limited Run against its floor (alone and
// while a Reconcile searches), and the peak memory of one runner billing a
// large streamed period.
//
//	go run ./internal/cmd/bench
//	go run ./internal/cmd/bench -skip-million -reps 5
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"

	"github.com/billonce/billonce/billing"
)

// memEnv makes the re-executed binary the runner of the memory measurement.
const memEnv = "BILLONCE_BENCH_MEMRUNNER"

type options struct {
	reps        int
	customers   int
	concurrency int
	batch       int
	rate        float64
	rateN       int
	million     int
	skipMillion bool
	maxMinutes  float64
	sections    string
	profile     string
	memprofile  string
	latencyN    int
	reconcileN  int

	usageReports   int
	usageCustomers int
	usageMemory    string

	invoiceN     int
	invoiceLines int
	refundN      int

	floorUnits int
	floorGroup int
}

func main() {
	if raw, ok := os.LookupEnv(memEnv); ok {
		os.Exit(memRunner(raw))
	}
	var o options
	flag.IntVar(&o.reps, "reps", 3, "repetitions per figure; the median is printed")
	flag.IntVar(&o.customers, "customers", 10000, "customers in the Run-versus-naive comparison")
	flag.IntVar(&o.concurrency, "concurrency", billing.DefaultConcurrency, "charges in flight, for billonce and the naive loop alike")
	flag.IntVar(&o.batch, "batch", billing.DefaultBatchSize, "claims per database round trip in a Run (RunOptions.BatchSize; the default is billing.DefaultBatchSize)")
	flag.Float64Var(&o.rate, "rate", 200, "requests per second the rate-limited fake accepts (R)")
	flag.IntVar(&o.rateN, "rate-customers", 600, "customers in the rate-limited Run")
	flag.IntVar(&o.million, "million", 1_000_000, "customers streamed by the memory measurement")
	flag.BoolVar(&o.skipMillion, "skip-million", false, "skip the peak-memory measurement")
	flag.Float64Var(&o.maxMinutes, "max-minutes", 10, "if billing -million customers would take longer, measure smaller runs and the slope of RSS instead")
	flag.StringVar(&o.sections, "sections", "key,claim,run,latency,rate,memory,usage,invoice,refund", "comma-separated sections to run; floor, the physical floor of the claim writes, runs only when named")
	flag.StringVar(&o.profile, "cpuprofile", "", "write the CPU profile of a billonce Run here (default: only when the ratio is below 0.5)")
	flag.StringVar(&o.memprofile, "memprofile", "", "write the allocation profile here after the profiled billonce Run (implies -cpuprofile's Run)")
	flag.IntVar(&o.latencyN, "latency-customers", 400, "customers in the Stripe-like latency comparison")
	flag.IntVar(&o.reconcileN, "reconcile-claims", 200, "claims past their window that a Reconcile searches for during the rate-limited Run")
	flag.IntVar(&o.usageReports, "usage-reports", 100_000, "usage reports in the RunUsage-versus-naive comparison")
	flag.IntVar(&o.usageCustomers, "usage-customers", 1000, "customers the usage reports are spread over, one one-minute window each in turn")
	flag.StringVar(&o.usageMemory, "usage-memory", "10000,100000", "counts of usage reports whose runner's peak memory is measured; empty: none")
	flag.IntVar(&o.invoiceN, "invoice-customers", 2000, "customers billed by invoice in the invoice Run-versus-naive comparison")
	flag.IntVar(&o.invoiceLines, "invoice-lines", 3, "lines of each invoice")
	flag.IntVar(&o.refundN, "refund-payments", 2000, "payments refunded in the refund section, half of each")
	flag.IntVar(&o.floorUnits, "floor-units", 10000, "units (rows) each shape of the floor section writes")
	flag.IntVar(&o.floorGroup, "floor-group", 20, "rows per UPDATE statement in the floor section")
	flag.Parse()
	if o.memprofile != "" {
		runtime.MemProfileRate = 4096
		if o.profile == "" {
			o.profile = filepath.Join(os.TempDir(), "billonce-run.cpu.pprof")
		}
	}

	t := &table{cmd: strings.TrimSpace("go run ./internal/cmd/bench " + strings.Join(os.Args[1:], " "))}
	if err := run(context.Background(), o, t); err != nil {
		t.print(os.Stdout)
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
	t.print(os.Stdout)
}

func run(ctx context.Context, o options, t *table) error {
	want := map[string]bool{}
	for _, s := range strings.Split(o.sections, ",") {
		want[strings.TrimSpace(s)] = true
	}
	if want["key"] {
		benchKey(t)
	}
	if !want["claim"] && !want["run"] && !want["latency"] && !want["rate"] && !(want["memory"] && !o.skipMillion) && !want["usage"] && !want["invoice"] && !want["refund"] && !want["floor"] {
		return nil
	}
	env, err := newEnv(ctx)
	if err != nil {
		return err
	}
	defer env.close()
	if want["claim"] {
		if err := benchClaim(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["run"] {
		if err := benchRun(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["latency"] {
		if err := benchLatency(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["rate"] {
		if err := benchRate(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["memory"] && !o.skipMillion {
		if err := benchMemory(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["usage"] {
		if err := benchUsage(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["refund"] {
		if err := benchRefund(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["invoice"] {
		if err := benchInvoice(ctx, env, o, t); err != nil {
			return err
		}
	}
	if want["floor"] {
		if err := benchFloor(ctx, env, o, t); err != nil {
			return err
		}
	}
	return nil
}
