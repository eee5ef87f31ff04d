package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/jackc/pgx/v5/pgxpool"
)

// memConfig is what the memory runner process receives.
type memConfig struct {
	DatabaseURL, StripeURL string
	Customers, Concurrency int
	Batch                  int
	// Usage, when set, makes the runner report Customers usage reports
	// over UsageCustomers customers with RunUsage instead of billing.
	Usage          bool
	UsageCustomers int
}

// memResult is what it prints on stdout.
type memResult struct {
	Charged   int
	Seconds   float64
	VmHWMKiB  int64     //lint:ignore ST1003 named as /proc/self/status names it
	VmRSSKiB  int64     //lint:ignore ST1003 named as /proc/self/status names it
	PeakHeap  uint64    // the largest HeapInuse sampled during the run, in bytes
	Base      time.Time // the minute the usage reports' windows end before
	Completed bool
}

// memRunner bills a streamed period in a process of its own and reports its
// peak resident set size (VmHWM).
func memRunner(raw string) int {
	var cfg memConfig
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintln(os.Stderr, "memory runner:", err)
		return 3
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, "memory runner:", err)
		return 3
	}
	defer pool.Close()
	s, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, "memory runner:", err)
		return 3
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: cfg.StripeURL, Claims: s, RateLimit: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, "memory runner:", err)
		return 3
	}
	opts := &billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.Batch}
	peak := heapPeak()
	var sum billing.Summary
	base := usageBase()
	if cfg.Usage {
		sum, err = b.RunUsage(ctx, usageReports(cfg.Customers, cfg.UsageCustomers, base), opts)
	} else {
		sum, err = b.Run(ctx, period, customers(cfg.Customers), opts)
	}
	heap := peak()
	if err != nil {
		fmt.Fprintln(os.Stderr, "memory runner:", err)
		return 1
	}
	hwm, rss := procStatus("VmHWM"), procStatus("VmRSS")
	json.NewEncoder(os.Stdout).Encode(memResult{Charged: sum.Created, Seconds: sum.Elapsed.Seconds(), VmHWMKiB: hwm, VmRSSKiB: rss, PeakHeap: heap, Base: base, Completed: sum.Complete()})
	return 0
}

// procStatus reads a "kB" field of /proc/self/status.
func procStatus(field string) int64 {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return -1
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return -1
}

// measureMemory runs one memory runner for n customers (with usage, n usage
// reports) against a fresh fake served by this process and a fresh
// database.
func measureMemory(ctx context.Context, e *env, o options, n int, usage bool) (memResult, error) {
	var srv *billingtest.Server
	if usage {
		srv = usageFake()
	} else {
		srv = billingtest.NewServer(billingtest.Config{})
	}
	defer srv.Close()
	_, u, err := e.store(ctx, 2)
	if err != nil {
		return memResult{}, err
	}
	raw, err := json.Marshal(memConfig{DatabaseURL: u, StripeURL: srv.URL, Customers: n, Concurrency: o.concurrency, Batch: o.batch,
		Usage: usage, UsageCustomers: o.usageCustomers})
	if err != nil {
		return memResult{}, err
	}
	exe, err := os.Executable()
	if err != nil {
		return memResult{}, err
	}
	cmd := exec.CommandContext(ctx, exe)
	cmd.Env = append(os.Environ(), memEnv+"="+string(raw))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		return memResult{}, fmt.Errorf("memory runner for %d customers: %w", n, err)
	}
	var r memResult
	if err := json.Unmarshal(out, &r); err != nil {
		return memResult{}, fmt.Errorf("memory runner output %q: %w", out, err)
	}
	if usage {
		if r.Charged != n {
			return r, fmt.Errorf("memory runner sent %d usage reports, want %d", r.Charged, n)
		}
		return r, countedOnce(srv, n, o.usageCustomers, r.Base)
	}
	if r.Charged != n || srv.Stats().Paid != int64(n) {
		return r, fmt.Errorf("memory runner charged %d, fake paid %d, want %d", r.Charged, srv.Stats().Paid, n)
	}
	return r, nil
}

func benchMemory(ctx context.Context, e *env, o options, t *table) error {
	// Estimate first from a small run.
	probeN := min(o.million, 20_000)
	probe, err := measureMemory(ctx, e, o, probeN, false)
	if err != nil {
		return err
	}
	rate := float64(probeN) / probe.Seconds
	est := time.Duration(float64(o.million) / rate * float64(time.Second))
	t.add(fmt.Sprintf("peak RSS, runner billing %d", probeN), fmt.Sprintf("%.1f MiB", float64(probe.VmHWMKiB)/1024),
		fmt.Sprintf("VmHWM; %.0f charges/s", rate))
	if est.Minutes() <= o.maxMinutes {
		r, err := measureMemory(ctx, e, o, o.million, false)
		if err != nil {
			return err
		}
		t.add(fmt.Sprintf("peak RSS, runner billing %d", o.million), fmt.Sprintf("%.1f MiB", float64(r.VmHWMKiB)/1024),
			fmt.Sprintf("VmHWM of the runner process; the fake serves from the parent; %.0fs", r.Seconds))
		return nil
	}
	// Too slow here: measure a few sizes and the slope.
	sizes := []int{probeN, 4 * probeN, 10 * probeN}
	var pts [][2]float64
	pts = append(pts, [2]float64{float64(probeN), float64(probe.VmHWMKiB)})
	for _, n := range sizes[1:] {
		if float64(n)/rate > o.maxMinutes*60 {
			break
		}
		r, err := measureMemory(ctx, e, o, n, false)
		if err != nil {
			return err
		}
		pts = append(pts, [2]float64{float64(n), float64(r.VmHWMKiB)})
		t.add(fmt.Sprintf("peak RSS, runner billing %d", n), fmt.Sprintf("%.1f MiB", float64(r.VmHWMKiB)/1024), fmt.Sprintf("VmHWM; %.0fs", r.Seconds))
	}
	slope := slopeOf(pts) // KiB per customer
	t.add("RSS slope", fmt.Sprintf("%.3f KiB/1000 customers", slope*1000),
		fmt.Sprintf("%d customers would take ~%v here (limit %gm): not run; extrapolated %.1f MiB", o.million, est.Round(time.Second), o.maxMinutes,
			(pts[len(pts)-1][1]+slope*(float64(o.million)-pts[len(pts)-1][0]))/1024))
	return nil
}

// slopeOf fits y = a + b·x by least squares and returns b.
func slopeOf(pts [][2]float64) float64 {
	if len(pts) < 2 {
		return 0
	}
	var sx, sy, sxx, sxy float64
	for _, p := range pts {
		sx, sy, sxx, sxy = sx+p[0], sy+p[1], sxx+p[0]*p[0], sxy+p[0]*p[1]
	}
	n := float64(len(pts))
	return (n*sxy - sx*sy) / (n*sxx - sx*sx)
}

// table is the printed result.
type table struct {
	cmd   string
	rows  [][3]string
	notes []string
}

func (t *table) add(name, value, note string) {
	t.rows = append(t.rows, [3]string{name, value, note})
	fmt.Fprintf(os.Stderr, "  %s: %s (%s)\n", name, value, note)
}

func (t *table) print(w io.Writer) {
	fmt.Fprintf(w, "billonce benchmarks: %s\n", t.cmd)
	wn, wv := len("measure"), len("value")
	for _, r := range t.rows {
		wn, wv = max(wn, len([]rune(r[0]))), max(wv, len([]rune(r[1])))
	}
	line := func(a, b, c string) {
		fmt.Fprintf(w, "| %s%s | %s%s | %s |\n", a, strings.Repeat(" ", wn-len([]rune(a))), b, strings.Repeat(" ", wv-len([]rune(b))), c)
	}
	line("measure", "value", "notes")
	fmt.Fprintf(w, "|%s|%s|---|\n", strings.Repeat("-", wn+2), strings.Repeat("-", wv+2))
	for _, r := range t.rows {
		line(r[0], r[1], r[2])
	}
	for _, n := range t.notes {
		fmt.Fprintln(w, "  "+n)
	}
}
