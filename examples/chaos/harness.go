package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

// Config is one chaos run.
type Config struct {
	Customers    int
	Runners      int
	Period       string
	Seed         int64
	Kills        int
	DBRestarts   int
	DBDown       time.Duration
	Terminations int
	// Rates are the fake's seeded fault probabilities per request.
	Rates map[billingtest.FaultKind]float64
	// DeclineFraction of customers have a card that always declines.
	DeclineFraction float64

	Concurrency    int
	BatchSize      int
	Lease          time.Duration
	AttemptTimeout time.Duration
	RetryInitial   time.Duration
	RetryMax       time.Duration
	RetryAttempts  int
	Timeout        time.Duration

	// LogDir keeps the runners' logs; empty means a temporary directory,
	// removed after a run whose invariants hold.
	LogDir string
	// Exe is the program re-executed as a runner (os.Args[0] by default).
	Exe string
	// Out receives progress lines; nil discards them.
	Out io.Writer
}

// Figures is what a chaos run reports.
type Figures struct {
	Customers, Runners     int
	RunnerStarts           int
	Kills                  int
	DBRestarts             int
	BackendTerminations    int
	Faults                 map[billingtest.FaultKind]int64
	Requests, Replays      int64
	Paid, Declined         int
	FinalRunCreated        int
	FinalRunAlreadyDone    int
	Reconciled             int
	Duplicates             int
	Missing                int
	Mismatches             int
	ChaosTime, WallTime    time.Duration
	Problems               []string // one line per broken invariant (first 20)
	LogDir                 string
	RunnerFailures         int // runner processes that exited with an error on their own
	UnsettledAfterFinalRun int
	// Evidence holds, when an invariant broke, the fake's request log and
	// the runners' log lines for the first customers concerned.
	Evidence []string
}

// OK reports whether every invariant held.
func (f Figures) OK() bool {
	return f.Duplicates == 0 && f.Missing == 0 && f.Mismatches == 0 && f.UnsettledAfterFinalRun == 0
}

func (f Figures) String() string {
	var b strings.Builder
	row := func(name string, v any) { fmt.Fprintf(&b, "  %-28s %v\n", name, v) }
	row("customers", f.Customers)
	row("runners", f.Runners)
	row("runner processes started", f.RunnerStarts)
	row("kills (SIGKILL)", f.Kills)
	row("DB restarts", f.DBRestarts)
	row("backend terminations", f.BackendTerminations)
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
	row("requests sent", f.Requests)
	row("replays served", f.Replays)
	row("customers charged", f.Paid)
	row("customers declined", f.Declined)
	row("final clean run: created", f.FinalRunCreated)
	row("final clean run: already", f.FinalRunAlreadyDone)
	row("reconcile pass: settled", f.Reconciled)
	row("runner failures", f.RunnerFailures)
	row("duplicates (must be 0)", f.Duplicates)
	row("missing (must be 0)", f.Missing)
	row("mismatches (must be 0)", f.Mismatches)
	row("chaos phase", f.ChaosTime.Round(time.Millisecond))
	row("wall time", f.WallTime.Round(time.Millisecond))
	if f.UnsettledAfterFinalRun > 0 {
		row("unsettled after final run", f.UnsettledAfterFinalRun)
	}
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
	case c.Customers < 1 || c.Runners < 1:
		return errors.New("need at least 1 customer and 1 runner")
	case c.AttemptTimeout <= 0 || c.AttemptTimeout >= billingtest.DefaultSlowDelay:
		return fmt.Errorf("attempt timeout %v must be positive and shorter than the slow fault's delay %v, or slow requests never time out", c.AttemptTimeout, billingtest.DefaultSlowDelay)
	case c.Lease < 3*c.AttemptTimeout:
		return fmt.Errorf("lease %v must be at least 3 attempt timeouts (%v)", c.Lease, 3*c.AttemptTimeout)
	case c.DeclineFraction < 0 || c.DeclineFraction > 1:
		return fmt.Errorf("decline fraction %v must be between 0 and 1", c.DeclineFraction)
	}
	if err := billing.ValidatePeriod(c.Period); err != nil {
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

// proc is one runner process.
type proc struct {
	index, gen int
	cmd        *exec.Cmd
	done       chan struct{}
	err        error
	killed     bool
}

// exited reports whether the process has exited (and err is set).
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

// Run runs the chaos scenario and returns its figures. An error means the
// harness itself could not run; broken invariants are in the figures.
func Run(ctx context.Context, cfg Config) (Figures, error) {
	if err := cfg.check(); err != nil {
		return Figures{}, fmt.Errorf("chaos: %w", err)
	}
	wall := time.Now()
	fig := Figures{Customers: cfg.Customers, Runners: cfg.Runners}
	rng := rand.New(rand.NewPCG(uint64(cfg.Seed), 0x0c4a05))
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
	store, err := claim.NewPostgres(pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		return fig, err
	}
	if err := store.Migrate(ctx); err != nil {
		return fig, err
	}

	random, err := billingtest.RandomFaults(cfg.Seed, cfg.Rates)
	if err != nil {
		return fig, err
	}
	srv := billingtest.NewServer(billingtest.Config{Script: random})
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
		if logDir, err = os.MkdirTemp("", "billonce-chaos-"); err != nil {
			return fig, err
		}
	} else if err := os.MkdirAll(logDir, 0o755); err != nil {
		return fig, err
	}
	fig.LogDir = logDir

	deadline := time.Now().Add(cfg.Timeout)
	start := func(index, gen int) (*proc, error) {
		u, _ := url.Parse(dbURL)
		q := u.Query()
		q.Set("application_name", fmt.Sprintf("chaos-runner-%d", index))
		q.Set("pool_max_conns", fmt.Sprint(cfg.Concurrency+2))
		u.RawQuery = q.Encode()
		rc, err := json.Marshal(runnerConfig{
			DatabaseURL: u.String(), StripeURL: srv.URL, Period: cfg.Period, Customers: cfg.Customers,
			Index: index, Runners: cfg.Runners, Generation: gen, Concurrency: cfg.Concurrency,
			BatchSize: cfg.BatchSize, Lease: cfg.Lease, AttemptTimeout: cfg.AttemptTimeout,
			RetryInitial: cfg.RetryInitial, RetryMax: cfg.RetryMax, RetryAttempts: cfg.RetryAttempts,
			LogPath: filepath.Join(logDir, fmt.Sprintf("runner-%d.log", index)), Deadline: deadline,
		})
		if err != nil {
			return nil, fmt.Errorf("chaos: runner config: %w", err)
		}
		cmd := exec.Command(cfg.Exe)
		cmd.Env = append(os.Environ(), runnerEnv+"="+string(rc))
		cmd.Stdout, cmd.Stderr = cfg.Out, cfg.Out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("chaos: starting runner %d: %w", index, err)
		}
		p := &proc{index: index, gen: gen, cmd: cmd, done: make(chan struct{})}
		go func() { p.err = cmd.Wait(); close(p.done) }()
		fig.RunnerStarts++
		return p, nil
	}

	// Chaos events fire at seeded points of the run's progress, measured as
	// customers charged at the fake, so they land mid-run however fast the
	// machine is.
	var events []event
	add := func(n int, kind string) {
		for range n {
			events = append(events, event{at: int(float64(toCharge) * (0.05 + 0.8*rng.Float64())), kind: kind})
		}
	}
	add(cfg.Kills, "kill")
	add(cfg.DBRestarts, "db-restart")
	add(cfg.Terminations, "terminate")
	slices.SortStableFunc(events, func(a, b event) int { return a.at - b.at })

	chaosStart := time.Now()
	procs := make([]*proc, cfg.Runners)
	finished := make([]bool, cfg.Runners)
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
	logf("started %d runners for %d customers (%d declined), period %s, logs in %s", cfg.Runners, cfg.Customers, len(declined), cfg.Period, logDir)

	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		paid := int(srv.Stats().Paid)
		for len(events) > 0 && events[0].at <= paid {
			ev := events[0]
			events = events[1:]
			switch ev.kind {
			case "kill":
				var alive []*proc
				for i, p := range procs {
					if !finished[i] && !p.exited() {
						alive = append(alive, p)
					}
				}
				if len(alive) == 0 {
					logf("kill at %d charged: no runner alive, skipped", paid)
					continue
				}
				p := alive[rng.IntN(len(alive))]
				if p.exited() {
					continue
				}
				p.killed = true
				p.cmd.Process.Signal(syscall.SIGKILL)
				<-p.done
				fig.Kills++
				logf("SIGKILL runner %d (gen %d, pid %d) at %d charged", p.index, p.gen, p.cmd.Process.Pid, paid)
			case "db-restart":
				down := cfg.DBDown
				logf("restarting PostgreSQL (down %v) at %d charged", down, paid)
				if err := cluster.Restart(ctx, down); err != nil {
					return fig, fmt.Errorf("chaos: restarting PostgreSQL: %w", err)
				}
				fig.DBRestarts++
			case "terminate":
				var n int
				err := pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name LIKE 'chaos-runner-%'`).Scan(&n)
				if err != nil {
					logf("terminating backends: %v", err)
					continue
				}
				fig.BackendTerminations += n
				logf("terminated %d runner backends at %d charged", n, paid)
			}
		}

		all := true
		for i, p := range procs {
			if finished[i] {
				continue
			}
			select {
			case <-p.done:
				switch {
				case p.killed:
					if procs[i], err = start(i, p.gen+1); err != nil {
						return fig, err
					}
					all = false
				case p.err == nil:
					finished[i] = true
					logf("runner %d (gen %d) finished", i, p.gen)
				default:
					fig.RunnerFailures++
					logf("runner %d (gen %d) failed: %v", i, p.gen, p.err)
					finished[i] = true
				}
			default:
				all = false
			}
		}
		if all && len(events) == 0 {
			break
		}
		if all {
			// Everything was charged before the remaining events' points:
			// they cannot fire any more.
			logf("%d chaos events never fired: runners finished first", len(events))
			break
		}
		select {
		case <-ctx.Done():
			return fig, ctx.Err()
		case <-tick.C:
		}
		if time.Now().After(deadline) {
			return fig, fmt.Errorf("chaos: runners still busy after %v; logs in %s", cfg.Timeout, logDir)
		}
	}
	fig.ChaosTime = time.Since(chaosStart)
	logf("chaos phase over after %v", fig.ChaosTime.Round(time.Millisecond))

	// Faults off, then a clean run and a reconcile pass settle what the
	// chaos left pending.
	srv.SetScript(nil)
	if err := finalRun(ctx, cfg, srv.URL, pool, &fig, logDir, logf); err != nil {
		return fig, err
	}
	srv.Close() // waits for held requests: the ledger is final
	st := srv.Stats()
	fig.Faults, fig.Requests, fig.Replays = st.Faults, st.Requests, st.Replays

	claims, dupClaims, err := loadClaims(ctx, pool, cfg.Period)
	if err != nil {
		return fig, err
	}
	for _, p := range dupClaims {
		fig.Mismatches++
		fig.Problems = append(fig.Problems, p)
	}
	verify(cfg, srv.Payments(), claims, declined, &fig)
	fig.WallTime = time.Since(wall)
	if !fig.OK() {
		fig.Evidence = evidence(fig.Problems, srv.Log(), logDir)
	}
	if fig.OK() && cfg.LogDir == "" {
		os.RemoveAll(logDir)
		fig.LogDir = ""
	}
	return fig, nil
}

// finalRun bills every customer once more with faults off, until nothing is
// pending (claims of killed runners wait out their lease), then reconciles.
func finalRun(ctx context.Context, cfg Config, stripeURL string, pool *pgxpool.Pool, fig *Figures, logDir string, logf func(string, ...any)) error {
	f, err := os.Create(filepath.Join(logDir, "final.log"))
	if err != nil {
		return err
	}
	defer f.Close()
	store, err := claim.NewPostgres(pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		return err
	}
	b, err := billing.New(billing.Config{
		SecretKey: "sk_test_chaos", StripeURL: stripeURL, Claims: store, RateLimit: -1, Owner: "chaos-final",
		Retry:  retry.Policy{InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, AttemptTimeout: cfg.AttemptTimeout},
		Logger: slog.New(slog.NewJSONHandler(f, nil)),
	})
	if err != nil {
		return err
	}
	deadline := time.Now().Add(cfg.Lease + time.Minute)
	for run := 1; ; run++ {
		sum, err := b.Run(ctx, cfg.Period, items(cfg.Customers, 0), &billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize})
		fig.FinalRunCreated += sum.Created
		fig.FinalRunAlreadyDone = sum.AlreadyBilled
		if err == nil && sum.Pending == 0 {
			logf("final clean run %d: created %d, already done %d, failed %d", run, sum.Created, sum.AlreadyBilled, sum.Declined)
			break
		}
		if time.Now().After(deadline) {
			fig.UnsettledAfterFinalRun = sum.Pending
			logf("final clean run %d: %d still pending (%v); giving up", run, sum.Pending, err)
			break
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	sum, err := b.Reconcile(ctx, nil)
	if err != nil {
		return fmt.Errorf("chaos: reconcile pass: %w", err)
	}
	fig.Reconciled = sum.Created + sum.AlreadyBilled
	logf("reconcile pass: %d stale claims, %d settled", sum.Total, fig.Reconciled)
	return nil
}

// claimRow is what verify needs of a claim.
type claimRow struct{ state, stripeID string }

// loadClaims reads the claim table's rows for period, by customer; a
// customer with two claims is reported as a problem.
func loadClaims(ctx context.Context, pool *pgxpool.Pool, period string) (map[string]claimRow, []string, error) {
	claims := map[string]claimRow{}
	var problems []string
	rows, err := pool.Query(ctx, `SELECT customer, state, coalesce(stripe_id, '') FROM billonce_claims WHERE period = $1`, period)
	if err != nil {
		return nil, nil, fmt.Errorf("chaos: reading claims: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var cust string
		var c claimRow
		if err := rows.Scan(&cust, &c.state, &c.stripeID); err != nil {
			return nil, nil, err
		}
		if _, dup := claims[cust]; dup {
			problems = append(problems, fmt.Sprintf("customer %s has more than one claim for %s", cust, period))
		}
		claims[cust] = c
	}
	if err := rows.Err(); err != nil {
		return nil, nil, fmt.Errorf("chaos: reading claims: %w", err)
	}
	return claims, problems, nil
}

// verify checks the invariants against the fake's ledger and the claim
// table, and counts what broke in fig.
func verify(cfg Config, payments []billingtest.Payment, claims map[string]claimRow, declined map[string]bool, fig *Figures) {
	problem := func(format string, args ...any) {
		fig.Mismatches++
		if len(fig.Problems) < 20 {
			fig.Problems = append(fig.Problems, fmt.Sprintf(format, args...))
		}
	}
	claims = maps.Clone(claims)
	paid := map[string][]billingtest.Payment{}
	for _, p := range payments {
		if !p.Paid {
			continue
		}
		if p.Period != cfg.Period {
			problem("payment %s for %s has period %q", p.ID, p.Customer, p.Period)
			continue
		}
		paid[p.Customer] = append(paid[p.Customer], p)
	}
	for i := range cfg.Customers {
		id := customerID(i)
		ps, c := paid[id], claims[id]
		delete(paid, id)
		delete(claims, id)
		if len(ps) > 1 {
			fig.Duplicates += len(ps) - 1
			var ids []string
			for _, p := range ps {
				ids = append(ids, p.ID+" key="+p.IdempotencyKey)
			}
			if len(fig.Problems) < 20 {
				fig.Problems = append(fig.Problems, fmt.Sprintf("customer %s charged %d times: %s", id, len(ps), strings.Join(ids, ", ")))
			}
		}
		switch {
		case declined[id]:
			fig.Declined++
			if len(ps) > 0 {
				problem("declined customer %s has a paid charge %s", id, ps[0].ID)
			}
			if c.state != string(claim.StateFailed) {
				problem("declined customer %s: claim state %q, want failed", id, c.state)
			}
			continue
		case len(ps) == 0:
			fig.Missing++
			if len(fig.Problems) < 20 {
				fig.Problems = append(fig.Problems, fmt.Sprintf("customer %s never charged; claim state %q", id, c.state))
			}
			if c.state == string(claim.StateSucceeded) {
				problem("customer %s: succeeded claim names %s, but the ledger has no paid charge", id, c.stripeID)
			}
			continue
		}
		fig.Paid++
		want := price(i)
		for _, p := range ps {
			if p.Amount != want.Amount || p.Currency != want.Currency {
				problem("customer %s charged %d %s by %s, want %d %s", id, p.Amount, p.Currency, p.ID, want.Amount, want.Currency)
			}
		}
		switch {
		case c.state != string(claim.StateSucceeded):
			problem("customer %s charged by %s without a succeeded claim (state %q)", id, ps[0].ID, c.state)
		case !slices.ContainsFunc(ps, func(p billingtest.Payment) bool { return p.ID == c.stripeID }):
			problem("customer %s: succeeded claim names %s, not a paid charge of the customer", id, c.stripeID)
		}
	}
	for cust, ps := range paid {
		problem("charge %s for unknown customer %s", ps[0].ID, cust)
	}
	for cust, c := range claims {
		problem("claim for unknown customer %s (state %q)", cust, c.state)
	}
}

var customerRE = regexp.MustCompile(`cus_[0-9]+`)

// evidence collects what happened to the first few customers named in
// problems: the fake's request log and every log line that names them.
func evidence(problems []string, reqs []billingtest.Entry, logDir string) []string {
	var out []string
	seen := map[string]bool{}
	logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
	for _, p := range problems {
		cust := customerRE.FindString(p)
		if cust == "" || seen[cust] || len(seen) == 3 {
			continue
		}
		seen[cust] = true
		out = append(out, "== "+cust+": requests at the fake")
		for _, e := range reqs {
			if e.Customer == cust {
				out = append(out, fmt.Sprintf("%s %s %s key=%s status=%d replayed=%v fault=%q object=%s",
					e.Time.Format("15:04:05.000000"), e.Method, e.Path, e.IdempotencyKey, e.Status, e.Replayed, e.Fault, e.ObjectID))
			}
		}
		for _, name := range logs {
			data, err := os.ReadFile(name)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, `"`+cust+`"`) {
					out = append(out, filepath.Base(name)+": "+line)
				}
			}
		}
	}
	return out
}
