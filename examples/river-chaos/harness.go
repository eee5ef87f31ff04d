package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// The periods of the throughput comparison, billed after the chaos with
// faults off: one by a single Biller.Run, one by the River workers.
const (
	runPeriod   = "2030-01"
	riverPeriod = "2030-02"
)

// Config is one run of the harness.
type Config struct {
	Customers  int
	Workers    int // worker processes
	MaxWorkers int // River workers (jobs at once) per process
	Period     string
	Seed       int64
	Kills      int
	DBRestarts int
	DBDown     time.Duration
	// Rates are the fake's seeded fault probabilities per request.
	Rates           map[billingtest.FaultKind]float64
	DeclineFraction float64

	Lease, AttemptTimeout   time.Duration
	JobTimeout, RescueAfter time.Duration
	// ThroughputCustomers is how many customers each side of the
	// throughput comparison bills; 0 skips it.
	ThroughputCustomers int
	Timeout             time.Duration

	// LogDir keeps the workers' logs; empty means a temporary directory,
	// removed after a run whose invariants hold.
	LogDir string
	// Exe is the program re-executed as a worker (os.Args[0] by default).
	Exe string
	// Out receives progress lines; nil discards them.
	Out io.Writer
}

// Figures is what a run reports.
type Figures struct {
	Customers, Workers, MaxWorkers  int
	WorkerStarts, Kills, DBRestarts int
	WorkerFailures                  int // worker processes that exited on their own (and were restarted)
	Faults                          map[billingtest.FaultKind]int64
	Requests, Replays               int64
	Paid, Declined                  int
	Jobs                            map[rivertype.JobState]int
	JobRuns                         int // attempts over all charge jobs of the period
	RepairInserted                  int // jobs re-inserted by a fan-out after all jobs were final
	Duplicates, Missing, Mismatches int
	ChaosTime, WallTime             time.Duration

	ThroughputCustomers   int
	RunTime, RiverTime    time.Duration
	RunCharged, RiverPaid int

	Problems []string // one line per broken invariant (first 20)
	LogDir   string
}

// OK reports whether every invariant held.
func (f Figures) OK() bool { return f.Duplicates == 0 && f.Missing == 0 && f.Mismatches == 0 }

func (f Figures) String() string {
	var b strings.Builder
	row := func(name string, v any) { fmt.Fprintf(&b, "  %-32s %v\n", name, v) }
	row("customers", f.Customers)
	row("worker processes", fmt.Sprintf("%d (%d River workers each)", f.Workers, f.MaxWorkers))
	row("worker processes started", f.WorkerStarts)
	row("kills (SIGKILL)", f.Kills)
	row("PostgreSQL restarts", f.DBRestarts)
	row("worker exits on their own", f.WorkerFailures)
	var total int64
	for _, k := range faultOrder {
		total += f.Faults[k]
	}
	row("faults injected", total)
	for _, k := range faultOrder {
		if n := f.Faults[k]; n > 0 {
			row("  "+string(k), n)
		}
	}
	row("requests to Stripe", f.Requests)
	row("replays served", f.Replays)
	row("customers charged", f.Paid)
	row("customers declined", f.Declined)
	for _, s := range rivertype.JobStates() {
		if n := f.Jobs[s]; n > 0 {
			row("charge jobs "+string(s), n)
		}
	}
	row("charge job runs (attempts)", f.JobRuns)
	row("re-inserted by a repair fan-out", f.RepairInserted)
	row("duplicates (must be 0)", f.Duplicates)
	row("missing (must be 0)", f.Missing)
	row("mismatches (must be 0)", f.Mismatches)
	row("chaos phase", f.ChaosTime.Round(time.Millisecond))
	if f.ThroughputCustomers > 0 {
		rate := func(n int, d time.Duration) string {
			return fmt.Sprintf("%d charged in %v, %.0f charges/s", n, d.Round(time.Millisecond), float64(n)/d.Seconds())
		}
		row("throughput, faults off", fmt.Sprintf("%d customers each", f.ThroughputCustomers))
		row(fmt.Sprintf("  one Biller.Run (concurrency %d)", f.Workers*f.MaxWorkers), rate(f.RunCharged, f.RunTime))
		row(fmt.Sprintf("  River, %d processes x %d", f.Workers, f.MaxWorkers), rate(f.RiverPaid, f.RiverTime))
	}
	row("wall time", f.WallTime.Round(time.Millisecond))
	for _, p := range f.Problems {
		fmt.Fprintf(&b, "  PROBLEM: %s\n", p)
	}
	return b.String()
}

var faultOrder = []billingtest.FaultKind{
	billingtest.FaultCut, billingtest.FaultDrop, billingtest.FaultSlow, billingtest.FaultErrorBefore,
	billingtest.FaultErrorAfter, billingtest.FaultInFlight, billingtest.FaultLockTimeout,
	billingtest.FaultRateLimit, billingtest.FaultDecline,
}

func (c *Config) check() error {
	switch {
	case c.Customers < 1 || c.Workers < 1 || c.MaxWorkers < 1:
		return errors.New("need at least 1 customer, 1 worker process and 1 River worker per process")
	case c.AttemptTimeout <= 0 || c.AttemptTimeout >= billingtest.DefaultSlowDelay:
		return fmt.Errorf("attempt timeout %v must be positive and shorter than the slow fault's delay %v", c.AttemptTimeout, billingtest.DefaultSlowDelay)
	case c.Lease < 3*c.AttemptTimeout:
		return fmt.Errorf("lease %v must be at least 3 attempt timeouts (%v)", c.Lease, 3*c.AttemptTimeout)
	case c.JobTimeout < 10*time.Second+c.Lease:
		// A job's Charge retries for up to 10 s (Retry.MaxElapsed) and may
		// wait out another runner's lease.
		return fmt.Errorf("job timeout %v must cover the Biller's retries (10s) and a lease (%v)", c.JobTimeout, c.Lease)
	case c.RescueAfter <= c.JobTimeout:
		return fmt.Errorf("rescue-after %v (River's RescueStuckJobsAfter) must be above the job timeout %v", c.RescueAfter, c.JobTimeout)
	case c.DeclineFraction < 0 || c.DeclineFraction > 1:
		return fmt.Errorf("decline fraction %v must be between 0 and 1", c.DeclineFraction)
	case c.Period == runPeriod || c.Period == riverPeriod:
		return fmt.Errorf("period %s is used by the throughput comparison; pick another", c.Period)
	}
	if err := billing.CheckPeriod(c.Period); err != nil {
		return err
	}
	if c.Exe == "" {
		c.Exe = os.Args[0]
	}
	if c.Out == nil {
		c.Out = io.Discard
	}
	return nil
}

// proc is one worker process.
type proc struct {
	index, gen int
	cmd        *exec.Cmd
	done       chan struct{}
	err        error
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

type event struct {
	at   int // fire once this many customers are charged
	kind string
}

// Run runs the scenario and returns its figures. An error means the harness
// itself could not run; broken invariants are in the figures.
func Run(ctx context.Context, cfg Config) (Figures, error) {
	if err := cfg.check(); err != nil {
		return Figures{}, fmt.Errorf("river-chaos: %w", err)
	}
	wall := time.Now()
	fig := Figures{Customers: cfg.Customers, Workers: cfg.Workers, MaxWorkers: cfg.MaxWorkers, ThroughputCustomers: cfg.ThroughputCustomers}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x71e4))
	logf := func(format string, args ...any) {
		fmt.Fprintf(cfg.Out, "%s "+format+"\n", append([]any{time.Since(wall).Round(time.Millisecond)}, args...)...)
	}

	cluster, err := pgtest.Start(ctx)
	if err != nil {
		return fig, err
	}
	defer cluster.Stop()
	dbURL, err := cluster.NewDatabase(ctx)
	if err != nil {
		return fig, err
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return fig, err
	}
	defer pool.Close()
	store, err := migrate(ctx, pool, cfg.Lease)
	if err != nil {
		return fig, err
	}
	// An insert-only River client, for the repair fan-out and the
	// throughput comparison.
	inserter, err := river.NewClient(riverpgxv5.New(pool), &river.Config{Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		return fig, err
	}

	srv := billingtest.NewServer(billingtest.Config{Seed: cfg.Seed, Rates: cfg.Rates})
	defer srv.Close()
	declined := map[string]bool{}
	for i := range cfg.Customers {
		if rng.Float64() < cfg.DeclineFraction {
			declined[customerID(i)] = true
			srv.Decline(customerID(i), "insufficient_funds")
		}
	}
	toCharge := cfg.Customers - len(declined)

	logDir := cfg.LogDir
	if logDir == "" {
		if logDir, err = os.MkdirTemp("", "billonce-river-chaos-"); err != nil {
			return fig, err
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fig, err
	}
	fig.LogDir = logDir

	start := func(index, gen int) (*proc, error) {
		u, _ := url.Parse(dbURL)
		q := u.Query()
		q.Set("application_name", fmt.Sprintf("river-chaos-worker-%d", index))
		q.Set("pool_max_conns", fmt.Sprint(cfg.MaxWorkers+5))
		u.RawQuery = q.Encode()
		wc, err := json.Marshal(workerConfig{
			DatabaseURL: u.String(), StripeURL: srv.URL, Period: cfg.Period, Customers: cfg.Customers, ThroughputCustomers: cfg.ThroughputCustomers,
			Index: index, Generation: gen, MaxWorkers: cfg.MaxWorkers, Lease: cfg.Lease,
			AttemptTimeout: cfg.AttemptTimeout, JobTimeout: cfg.JobTimeout, RescueAfter: cfg.RescueAfter,
			LogPath: filepath.Join(logDir, fmt.Sprintf("worker-%d.log", index)),
		})
		if err != nil {
			return nil, err
		}
		cmd := exec.Command(cfg.Exe)
		cmd.Env = append(os.Environ(), workerEnv+"="+string(wc))
		cmd.Stdout, cmd.Stderr = cfg.Out, cfg.Out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("river-chaos: starting worker %d: %w", index, err)
		}
		p := &proc{index: index, gen: gen, cmd: cmd, done: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.done) }()
		fig.WorkerStarts++
		return p, nil
	}

	var events []event
	add := func(n int, kind string) {
		for range n {
			events = append(events, event{at: int(float64(toCharge) * (0.05 + 0.8*rng.Float64())), kind: kind})
		}
	}
	add(cfg.Kills, "kill")
	add(cfg.DBRestarts, "db-restart")
	slices.SortStableFunc(events, func(a, b event) int { return a.at - b.at })

	deadline := time.Now().Add(cfg.Timeout)
	chaosStart := time.Now()
	procs := make([]*proc, cfg.Workers)
	defer func() {
		for _, p := range procs {
			if p != nil && !p.exited() {
				p.cmd.Process.Kill()
				<-p.done
			}
		}
	}()
	for i := range procs {
		if procs[i], err = start(i, 1); err != nil {
			return fig, err
		}
	}
	logf("started %d worker processes for %d customers (%d declined), period %s, logs in %s",
		cfg.Workers, cfg.Customers, len(declined), cfg.Period, logDir)

	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var idleSince time.Time
	for {
		paid := int(srv.Stats().Paid)
		for len(events) > 0 && events[0].at <= paid {
			ev := events[0]
			events = events[1:]
			switch ev.kind {
			case "kill":
				p := procs[rng.IntN(len(procs))]
				p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
				fig.Kills++
				logf("SIGKILL worker %d (gen %d, pid %d) at %d charged", p.index, p.gen, p.cmd.Process.Pid, paid)
				if procs[p.index], err = start(p.index, p.gen+1); err != nil {
					return fig, err
				}
			case "db-restart":
				logf("restarting PostgreSQL (down %v) at %d charged", cfg.DBDown, paid)
				if err := cluster.Restart(ctx, cfg.DBDown); err != nil {
					return fig, fmt.Errorf("river-chaos: restarting PostgreSQL: %w", err)
				}
				fig.DBRestarts++
			}
		}
		for i, p := range procs {
			if p.exited() {
				fig.WorkerFailures++
				logf("worker %d (gen %d) exited on its own: %v; restarting it", i, p.gen, p.err)
				if procs[i], err = start(i, p.gen+1); err != nil {
					return fig, err
				}
			}
		}
		settled, active, err := progress(ctx, pool, store, cfg.Period)
		switch {
		case err != nil:
			// PostgreSQL restarting: ask again.
		case settled == cfg.Customers && active == 0 && len(events) == 0:
			fig.ChaosTime = time.Since(chaosStart)
			logf("period %s settled after %v", cfg.Period, fig.ChaosTime.Round(time.Millisecond))
		case active == 0 && settled < cfg.Customers:
			// Every job is final but claims are open: jobs discarded or
			// cancelled with their claims pending. A fan-out re-inserts
			// them; the claims keep it harmless.
			if idleSince.IsZero() {
				idleSince = time.Now()
			} else if time.Since(idleSince) > 2*time.Second {
				res, err := riverbilling.FanOut(ctx, inserter, pool, cfg.Period, customers(cfg.Customers), 0)
				if err == nil {
					fig.RepairInserted += res.Inserted
					logf("repair fan-out: %d jobs re-inserted, %d duplicates", res.Inserted, res.Duplicates)
				}
				idleSince = time.Time{}
			}
		default:
			idleSince = time.Time{}
		}
		if fig.ChaosTime > 0 {
			break
		}
		select {
		case <-ctx.Done():
			return fig, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			st, _ := riverbilling.State(ctx, pool, store, cfg.Period)
			return fig, fmt.Errorf("river-chaos: period not settled after %v (%v, %d events left); logs in %s", cfg.Timeout, st, len(events), logDir)
		}
	}
	st, err := riverbilling.State(ctx, pool, store, cfg.Period)
	if err != nil {
		return fig, err
	}
	fig.Jobs = st.Jobs
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(attempt), 0) FROM river_job WHERE kind = $1 AND args->>'period' = $2`,
		riverbilling.KindCharge, cfg.Period).Scan(&fig.JobRuns); err != nil {
		return fig, err
	}

	if cfg.ThroughputCustomers > 0 {
		if err := srv.SetRates(cfg.Seed, nil); err != nil {
			return fig, err
		}
		if err := throughput(ctx, cfg, &fig, srv.URL, pool, store, inserter, logf); err != nil {
			return fig, err
		}
	}

	for _, p := range procs {
		p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		<-p.done
	}
	srv.Close() // waits for held requests: the ledger is final
	sst := srv.Stats()
	fig.Faults, fig.Requests, fig.Replays = sst.Faults, sst.Requests, sst.Replays
	claims, err := loadClaims(ctx, pool)
	if err != nil {
		return fig, err
	}
	verify(cfg, srv.Payments(), claims, declined, &fig)
	fig.WallTime = time.Since(wall)
	if fig.OK() && cfg.LogDir == "" {
		os.RemoveAll(logDir)
		fig.LogDir = ""
	}
	return fig, nil
}

// migrate applies River's migrations and the claim table's.
func migrate(ctx context.Context, pool *pgxpool.Pool, lease time.Duration) (*claim.Postgres, error) {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return nil, err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return nil, err
	}
	store, err := claim.NewPostgres(pool, claim.Config{Lease: lease})
	if err != nil {
		return nil, err
	}
	return store, store.Migrate(ctx)
}

// progress reports how many claims of period are settled (succeeded or
// failed) and how many of its charge jobs are not final yet.
func progress(ctx context.Context, pool *pgxpool.Pool, store *claim.Postgres, period string) (settled, active int, err error) {
	st, err := riverbilling.State(ctx, pool, store, period)
	if err != nil {
		return 0, 0, err
	}
	for s, n := range st.Jobs {
		if s != rivertype.JobStateCompleted && s != rivertype.JobStateCancelled && s != rivertype.JobStateDiscarded {
			active += n
		}
	}
	var fanOutDone bool
	if err := pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM river_job WHERE kind = $1 AND args->>'period' = $2 AND state = 'completed')`,
		riverbilling.KindFanOut, period).Scan(&fanOutDone); err != nil {
		return 0, 0, err
	}
	if !fanOutDone {
		active++
	}
	return st.Claims[claim.StateSucceeded] + st.Claims[claim.StateFailed], active, nil
}

// throughput bills ThroughputCustomers once with one Biller.Run in this
// process and once with the River workers, on the same fake with faults
// off, and times both.
func throughput(ctx context.Context, cfg Config, fig *Figures, stripeURL string, pool *pgxpool.Pool, store *claim.Postgres,
	inserter *river.Client[pgx.Tx], logf func(string, ...any)) error {
	n := cfg.ThroughputCustomers
	b, err := biller(pool, stripeURL, "river-chaos-run", cfg.Lease, cfg.AttemptTimeout, nil)
	if err != nil {
		return err
	}
	t0 := time.Now()
	sum, err := b.Run(ctx, runPeriod, customers(n), &billing.RunOptions{Concurrency: cfg.Workers * cfg.MaxWorkers, BatchSize: 200})
	fig.RunTime, fig.RunCharged = time.Since(t0), sum.Created
	if err != nil {
		return fmt.Errorf("river-chaos: throughput run: %w", err)
	}
	logf("one Biller.Run: %d charged in %v", sum.Created, fig.RunTime.Round(time.Millisecond))

	// The workers fan out any period whose fan-out job they are given.
	t0 = time.Now()
	if _, err := inserter.Insert(ctx, riverbilling.FanOutArgs{Period: riverPeriod}, nil); err != nil {
		return err
	}
	for {
		st, err := store.Count(ctx, riverPeriod)
		if err != nil {
			return err
		}
		if st[claim.StateSucceeded]+st[claim.StateFailed] == n {
			fig.RiverTime, fig.RiverPaid = time.Since(t0), st[claim.StateSucceeded]
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	logf("River workers: %d charged in %v", fig.RiverPaid, fig.RiverTime.Round(time.Millisecond))
	return nil
}

type claimRow struct{ state, stripeID string }

// loadClaims reads every claim, by period and customer; re-bills are not
// part of this run, so there is one per customer and period.
func loadClaims(ctx context.Context, pool *pgxpool.Pool) (map[[2]string]claimRow, error) {
	rows, err := pool.Query(ctx, `SELECT period, customer, state, coalesce(stripe_id, '') FROM billonce_claims`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[[2]string]claimRow{}
	for rows.Next() {
		var k [2]string
		var c claimRow
		if err := rows.Scan(&k[0], &k[1], &c.state, &c.stripeID); err != nil {
			return nil, err
		}
		out[k] = c
	}
	return out, rows.Err()
}

// verify checks the fake's ledger against the customers of every period
// billed: each charged exactly once at its price, with a succeeded claim
// naming that charge, none missing but the declined.
func verify(cfg Config, payments []billingtest.Payment, claims map[[2]string]claimRow, declined map[string]bool, fig *Figures) {
	problem := func(counter *int, format string, args ...any) {
		*counter++
		if len(fig.Problems) < 20 {
			fig.Problems = append(fig.Problems, fmt.Sprintf(format, args...))
		}
	}
	paid := map[[2]string][]billingtest.Payment{}
	for _, p := range payments {
		if p.Paid {
			k := [2]string{p.Period, p.Customer}
			paid[k] = append(paid[k], p)
		}
	}
	periods := map[string]int{cfg.Period: cfg.Customers}
	if cfg.ThroughputCustomers > 0 {
		periods[runPeriod], periods[riverPeriod] = cfg.ThroughputCustomers, cfg.ThroughputCustomers
	}
	for period, n := range periods {
		for i := range n {
			k := [2]string{period, customerID(i)}
			ps, c := paid[k], claims[k]
			delete(paid, k)
			if len(ps) > 1 {
				problem(&fig.Duplicates, "customer %s charged %d times for %s", k[1], len(ps), period)
			}
			switch {
			case declined[k[1]]:
				if period == cfg.Period {
					fig.Declined++
				}
				if len(ps) > 0 || c.state != string(claim.StateFailed) {
					problem(&fig.Mismatches, "declined customer %s, %s: %d paid charges, claim %q", k[1], period, len(ps), c.state)
				}
				continue
			case len(ps) == 0:
				problem(&fig.Missing, "customer %s never charged for %s; claim %q", k[1], period, c.state)
				continue
			}
			if period == cfg.Period {
				fig.Paid++
			}
			if want := price(i); ps[0].Amount != want.Amount || ps[0].Currency != want.Currency {
				problem(&fig.Mismatches, "customer %s charged %d %s, want %d %s", k[1], ps[0].Amount, ps[0].Currency, want.Amount, want.Currency)
			}
			if c.state != string(claim.StateSucceeded) || !slices.ContainsFunc(ps, func(p billingtest.Payment) bool { return p.ID == c.stripeID }) {
				problem(&fig.Mismatches, "customer %s, %s: claim %q names %q, not its charge", k[1], period, c.state, c.stripeID)
			}
		}
	}
	for k, ps := range paid {
		problem(&fig.Mismatches, "charge %s for unknown customer %s, period %s", ps[0].ID, k[1], k[0])
	}
}
