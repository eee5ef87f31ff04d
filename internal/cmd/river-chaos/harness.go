package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
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
	"github.com/billonce/billonce/internal/chaos"
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
	MaxWorkers int // River workers (charge jobs at once) per process; each job bills billing.DefaultConcurrency customers at once
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
	chaos.Ledger
	Customers, Workers, MaxWorkers  int
	WorkerStarts, Kills, DBRestarts int
	WorkerFailures                  int // worker processes that exited on their own (and were restarted)
	Jobs                            map[rivertype.JobState]int
	JobRuns                         int // attempts over all charge jobs of the period
	RepairInserted                  int // customers whose jobs a fan-out re-inserted after all jobs were final
	ChaosTime, WallTime             time.Duration

	ThroughputCustomers   int
	RunTime, RiverTime    time.Duration
	RunCharged, RiverPaid int

	LogDir string
}

func (f Figures) String() string {
	var b strings.Builder
	row := func(name string, v any) { fmt.Fprintf(&b, "  %-32s %v\n", name, v) }
	row("customers", f.Customers)
	row("worker processes", fmt.Sprintf("%d (%d River workers each)", f.Workers, f.MaxWorkers))
	row("worker processes started", f.WorkerStarts)
	row("kills (SIGKILL)", f.Kills)
	row("PostgreSQL restarts", f.DBRestarts)
	row("worker exits on their own", f.WorkerFailures)
	chaos.FaultRows(f.Faults, row)
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
	row("customers re-inserted (repair)", f.RepairInserted)
	row("duplicates (must be 0)", f.Duplicates)
	row("missing (must be 0)", f.Missing)
	row("mismatches (must be 0)", f.Mismatches)
	row("chaos phase", f.ChaosTime.Round(time.Millisecond))
	if f.ThroughputCustomers > 0 {
		rate := func(n int, d time.Duration) string {
			return fmt.Sprintf("%d charged in %v, %.0f charges/s", n, d.Round(time.Millisecond), float64(n)/d.Seconds())
		}
		row("throughput, faults off", fmt.Sprintf("%d customers each", f.ThroughputCustomers))
		row(fmt.Sprintf("  one Biller.Run (concurrency %d)", f.inFlight()), rate(f.RunCharged, f.RunTime))
		row(fmt.Sprintf("  River (%d processes, %d x %d each)", f.Workers, f.MaxWorkers, billing.DefaultConcurrency), rate(f.RiverPaid, f.RiverTime))
	}
	row("wall time", f.WallTime.Round(time.Millisecond))
	for _, p := range f.Problems {
		fmt.Fprintf(&b, "  PROBLEM: %s\n", p)
	}
	return b.String()
}

// inFlight is how many customers the River workers bill at once, all
// processes together: each River worker works a charge job, whose Run
// bills billing.DefaultConcurrency of its customers at once. The
// throughput comparison's Run bills as many at once.
func (f Figures) inFlight() int { return f.Workers * f.MaxWorkers * billing.DefaultConcurrency }

func (c *Config) check() error {
	switch {
	case c.Customers < 1 || c.Workers < 1 || c.MaxWorkers < 1:
		return errors.New("need at least 1 customer, 1 worker process and 1 River worker per process")
	case c.JobTimeout < 10*time.Second+c.Lease:
		// A job's Charge retries for up to 10 s (Retry.MaxElapsed) and may
		// wait out another runner's lease.
		return fmt.Errorf("job timeout %v must cover the Biller's retries (10s) and a lease (%v)", c.JobTimeout, c.Lease)
	case c.RescueAfter <= c.JobTimeout:
		return fmt.Errorf("rescue-after %v (River's RescueStuckJobsAfter) must be above the job timeout %v", c.RescueAfter, c.JobTimeout)
	case c.Period == runPeriod || c.Period == riverPeriod:
		return fmt.Errorf("period %s is used by the throughput comparison; pick another", c.Period)
	}
	return chaos.CheckConfig(c.Period, c.AttemptTimeout, c.Lease, c.DeclineFraction)
}

// Run runs the scenario and returns its figures. An error means the harness
// itself could not run; broken invariants are in the figures.
func Run(ctx context.Context, cfg Config) (Figures, error) {
	if err := cfg.check(); err != nil {
		return Figures{}, fmt.Errorf("river-chaos: %w", err)
	}
	fig := Figures{Customers: cfg.Customers, Workers: cfg.Workers, MaxWorkers: cfg.MaxWorkers, ThroughputCustomers: cfg.ThroughputCustomers}
	env, err := chaos.Start(ctx, chaos.Setup{
		Name: "river-chaos", Seed: cfg.Seed, Stream: 0x71e4, Customers: cfg.Customers,
		Rates: cfg.Rates, DeclineFraction: cfg.DeclineFraction, LogDir: cfg.LogDir,
		Exe: cfg.Exe, ProcEnv: workerEnv, ProcName: "worker", Out: cfg.Out,
	})
	if err != nil {
		return fig, err
	}
	defer env.Close()
	fig.LogDir = env.LogDir
	pool := env.Pool
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

	start := func(index, gen int) (*chaos.Proc, error) {
		p, err := env.StartProc(index, gen, workerConfig{
			DatabaseURL: env.ProcURL(fmt.Sprintf("river-chaos-worker-%d", index), cfg.MaxWorkers+5),
			StripeURL:   env.Fake.URL, Period: cfg.Period, Customers: cfg.Customers, ThroughputCustomers: cfg.ThroughputCustomers,
			Index: index, Generation: gen, MaxWorkers: cfg.MaxWorkers, Lease: cfg.Lease,
			AttemptTimeout: cfg.AttemptTimeout, JobTimeout: cfg.JobTimeout, RescueAfter: cfg.RescueAfter,
			LogPath: filepath.Join(env.LogDir, fmt.Sprintf("worker-%d.log", index)),
		})
		if err == nil {
			fig.WorkerStarts++
		}
		return p, err
	}
	env.Plan(cfg.Kills, "kill")
	env.Plan(cfg.DBRestarts, "db-restart")

	deadline := time.Now().Add(cfg.Timeout)
	chaosStart := time.Now()
	procs := make([]*chaos.Proc, cfg.Workers)
	for i := range procs {
		if procs[i], err = start(i, 1); err != nil {
			return fig, err
		}
	}
	env.Logf("started %d worker processes for %d customers (%d declined), period %s, logs in %s",
		cfg.Workers, cfg.Customers, len(env.Declined), cfg.Period, env.LogDir)

	// The fake holds the workers' writes at each event's point until the
	// event has fired (env.Hold): kills land while writes wait for their
	// answers, a restart of PostgreSQL just after they are let go.
	paidAtFake := func() int { return int(env.Fake.Stats().Paid) }
	reached := env.Hold(paidAtFake)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	var idleSince time.Time
	for {
		select {
		case <-ctx.Done():
			return fig, ctx.Err()
		case <-reached:
			paid := paidAtFake()
			var restarts int
			for _, ev := range env.Due(paid) {
				switch ev.Kind {
				case "kill":
					p := procs[env.Rand.IntN(len(procs))]
					p.Kill()
					fig.Kills++
					env.Logf("SIGKILL worker %d (gen %d, pid %d) at %d charged", p.Index, p.Gen, p.Pid(), paid)
					if procs[p.Index], err = start(p.Index, p.Gen+1); err != nil {
						return fig, err
					}
				case "db-restart":
					restarts++
				}
			}
			reached = env.Release()
			for range restarts {
				if err := env.RestartPostgres(ctx, cfg.DBDown, paid); err != nil {
					return fig, err
				}
				fig.DBRestarts++
			}
		case <-tick.C:
		}
		for i, p := range procs {
			if p.Exited() {
				fig.WorkerFailures++
				env.Logf("worker %d (gen %d) exited on its own: %v; restarting it", i, p.Gen, p.Err)
				if procs[i], err = start(i, p.Gen+1); err != nil {
					return fig, err
				}
			}
		}
		settled, active, err := progress(ctx, pool, store, cfg.Period)
		switch {
		case err != nil:
			// PostgreSQL restarting: ask again.
		case settled == cfg.Customers && active == 0 && env.EventsLeft() == 0:
			fig.ChaosTime = time.Since(chaosStart)
			env.Logf("period %s settled after %v", cfg.Period, fig.ChaosTime.Round(time.Millisecond))
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
					env.Logf("repair fan-out: jobs of %d customers re-inserted, %d duplicates", res.Inserted, res.Duplicates)
				}
				idleSince = time.Time{}
			}
		default:
			idleSince = time.Time{}
		}
		if fig.ChaosTime > 0 {
			break
		}
		if time.Now().After(deadline) {
			st, _ := riverbilling.State(ctx, pool, store, cfg.Period)
			return fig, fmt.Errorf("river-chaos: period not settled after %v (%v, %d events left); logs in %s", cfg.Timeout, st, env.EventsLeft(), env.LogDir)
		}
	}
	st, err := riverbilling.State(ctx, pool, store, cfg.Period)
	if err != nil {
		return fig, err
	}
	fig.Jobs = st.Jobs
	if err := pool.QueryRow(ctx, `SELECT coalesce(sum(attempt), 0) FROM river_job WHERE kind = $1 AND args->>'period' = $2`,
		riverbilling.ChargeArgs{}.Kind(), cfg.Period).Scan(&fig.JobRuns); err != nil {
		return fig, err
	}

	periods := map[string]int{cfg.Period: cfg.Customers}
	if cfg.ThroughputCustomers > 0 {
		env.Fake.SetScript(nil)
		if err := throughput(ctx, cfg, &fig, env, store, inserter); err != nil {
			return fig, err
		}
		periods[runPeriod], periods[riverPeriod] = cfg.ThroughputCustomers, cfg.ThroughputCustomers
	}

	for _, p := range procs {
		p.Terminate()
	}
	for _, p := range procs {
		<-p.Done()
	}
	if fig.Ledger, err = env.Check(ctx, cfg.Period, periods); err != nil {
		return fig, err
	}
	fig.WallTime = env.Elapsed()
	fig.LogDir = env.CleanUp(fig.OK())
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
		riverbilling.FanOutArgs{}.Kind(), period).Scan(&fanOutDone); err != nil {
		return 0, 0, err
	}
	if !fanOutDone {
		active++
	}
	return st.Claims[claim.StateSucceeded] + st.Claims[claim.StateFailed], active, nil
}

// throughputAttemptTimeout bounds each attempt of the throughput Run.
const throughputAttemptTimeout = 30 * time.Second

// throughput bills ThroughputCustomers once with one Biller.Run in this
// process and once with the River workers, as many customers at once
// (see Figures.inFlight), on the same fake with faults off, and times
// both.
func throughput(ctx context.Context, cfg Config, fig *Figures, env *chaos.Env, store *claim.Postgres, inserter *river.Client[pgx.Tx]) error {
	n := cfg.ThroughputCustomers
	// Faults are off: no slow answer to time out, so an attempt may take
	// as long as a loaded machine makes it (a second's attempts, each a
	// miss, made the Run stop as if Stripe were unreachable).
	b, err := biller(env.Pool, env.Fake.URL, "river-chaos-run", cfg.Lease, throughputAttemptTimeout, nil)
	if err != nil {
		return err
	}
	t0 := time.Now()
	sum, err := b.Run(ctx, runPeriod, customers(n), &billing.RunOptions{Concurrency: fig.inFlight(), BatchSize: 200})
	fig.RunTime, fig.RunCharged = time.Since(t0), sum.Created
	if err != nil {
		return fmt.Errorf("river-chaos: throughput run: %w", err)
	}
	env.Logf("one Biller.Run: %d charged in %v", sum.Created, fig.RunTime.Round(time.Millisecond))

	// The workers fan out any period whose fan-out job they are given.
	// The wait watches the fake, in this process, until every customer's
	// payment exists (faults are off: one object each, declines included),
	// and only then the claims: counting the claims all along costs the
	// database what the workers need.
	created := env.Fake.Stats().Created
	t0 = time.Now()
	if _, err := inserter.Insert(ctx, riverbilling.FanOutArgs{Period: riverPeriod}, nil); err != nil {
		return err
	}
	for {
		if env.Fake.Stats().Created-created >= int64(n) {
			st, err := store.Count(ctx, riverPeriod)
			if err != nil {
				return err
			}
			if st[claim.StateSucceeded]+st[claim.StateFailed] == n {
				fig.RiverTime, fig.RiverPaid = time.Since(t0), st[claim.StateSucceeded]
				break
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	env.Logf("River workers: %d charged in %v", fig.RiverPaid, fig.RiverTime.Round(time.Millisecond))
	return nil
}
