package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/chaos"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

// The modes of a run: what the runners do.
const (
	// ModeCharges bills each customer once for the period (the default).
	ModeCharges = "charges"
	// ModeInvoices bills each customer once for the period by an invoice
	// of one to three lines; the declined customers' invoices stay open.
	ModeInvoices = "invoices"
	// ModeUsage reports Windows hourly usage windows per customer to a
	// sum meter with RunUsage; the declined customers' meter events are
	// rejected by Stripe later, in error reports delivered to the
	// webhook.
	ModeUsage = "usage"
	// ModeRefunds bills each customer once for the period, as
	// ModeCharges, then refunds each payment by chaos.Refunds: three
	// partial refunds, and one that with them comes to more than the
	// payment, which billonce refuses.
	ModeRefunds = "refunds"
	// ModeMoneyOut makes each customer i a connected account, transfers
	// Price(i) to it from the platform's balance and, once that transfer
	// succeeded, pays the same amount out of the account's balance to its
	// bank; the declined customers' payouts are returned by the bank after
	// they were paid, and billonce fails their claims and pays nothing
	// more.
	ModeMoneyOut = "moneyout"
)

// payoutsPaid is how far the final phase of ModeMoneyOut moves time on:
// past the arrival of a standard payout (two days after it was made, at
// the fake as at Stripe), so that every payout is paid.
const payoutsPaid = 50 * time.Hour

// waitsOutWindow reports whether the runners of mode stop once all they
// have left waits on outcomes Stripe keeps answering unknown, which the
// harness settles after moving time a day on: usage reports and invoice
// steps, which their lookups cannot settle within the key's window.
// Charges, refunds, transfers and payouts are settled by the final
// run's resends and lookups.
func waitsOutWindow(mode string) bool { return mode == ModeUsage || mode == ModeInvoices }

// DefaultMeterDelay is Config.MeterDelay's default: shorter than the
// fake's own minute, so that a run of any size meets meter error reports
// while its runners run, as a long one does, and waits less for the last
// of them once they are done.
const DefaultMeterDelay = 10 * time.Second

// webhookSecret signs the events the harness delivers.
const webhookSecret = "whsec_chaosHarnessSigningSecret0000"

// Config is one chaos run.
type Config struct {
	// Mode is ModeCharges (or empty), ModeInvoices, ModeUsage,
	// ModeRefunds or ModeMoneyOut.
	Mode string
	// Windows is the number of usage windows per customer (ModeUsage).
	Windows      int
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
	// DeclineFraction of customers have a card that always declines; in
	// ModeMoneyOut, their accounts' payouts are returned by the bank
	// after they were paid.
	DeclineFraction float64
	// MeterDelay is how long after acceptance the fake counts a meter
	// event or rejects it into an error report (ModeUsage); zero is
	// DefaultMeterDelay. A run that lasts longer sees the declined
	// customers' reports failed by the webhook while the runners run.
	MeterDelay time.Duration

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
	// Cluster, if set, is the PostgreSQL to run on (see chaos.Setup).
	Cluster *pgtest.Cluster
}

// Figures is what a chaos run reports.
type Figures struct {
	chaos.Ledger
	Mode                   string
	Customers, Runners     int
	Windows                int
	WebhooksRefused        int // webhook deliveries the handler refused
	PendingPastWindow      int // claims still pending after the chaos, settled a day later (ModeUsage, ModeInvoices)
	FailedDuringChaos      int // claims failed when the chaos ended: reports Stripe rejected, failed by their error reports (ModeUsage)
	RunnerStarts           int
	Kills                  int
	DBRestarts             int
	BackendTerminations    int
	FinalRunCreated        int
	FinalRunAlreadyDone    int
	Reconciled             int
	ChaosTime, WallTime    time.Duration
	LogDir                 string
	RunnerFailures         int // runner processes that exited with an error on their own
	UnsettledAfterFinalRun int
	// RefundsRefused counts the refunds past the payment the final pass
	// asked for again, each refused (ModeRefunds).
	RefundsRefused int
	// PayoutsReturned counts the paid payouts the harness had the bank
	// return (the declined customers' accounts), and ReturnedReported
	// those a last Run of every payout then reported failed after
	// processing, sending nothing more (ModeMoneyOut).
	PayoutsReturned, ReturnedReported int
}

// OK reports whether every invariant held.
func (f Figures) OK() bool { return f.Ledger.OK() && f.UnsettledAfterFinalRun == 0 }

func (f Figures) String() string {
	var b strings.Builder
	row := func(name string, v any) { fmt.Fprintf(&b, "  %-28s %v\n", name, v) }
	row("mode", f.Mode)
	if f.Mode == ModeMoneyOut {
		row("connected accounts", f.Customers)
	} else {
		row("customers", f.Customers)
	}
	if f.Mode == ModeUsage {
		row("usage windows", f.Customers*f.Windows)
	}
	row("runners", f.Runners)
	row("runner processes started", f.RunnerStarts)
	row("kills (SIGKILL)", f.Kills)
	row("DB restarts", f.DBRestarts)
	row("backend terminations", f.BackendTerminations)
	chaos.FaultRows(f.Faults, row)
	row("requests sent", f.Requests)
	row("replays served", f.Replays)
	switch f.Mode {
	case ModeUsage:
		row("windows counted once", f.Reports)
		row("customers counted", f.Paid)
		row("customers rejected", f.Declined)
		row("failed during chaos", f.FailedDuringChaos)
	case ModeInvoices:
		row("customers invoiced, paid", f.Paid)
		row("invoices open, declined", f.Declined)
		row("invoice lines", f.Reports)
	case ModeRefunds:
		row("customers charged", f.Paid)
		row("customers declined", f.Declined)
		row("refunds made once", f.Reports)
		row("refused past the payment", f.RefundsRefused)
	case ModeMoneyOut:
		row("transfers made once", f.Reports)
		row("payouts made once", f.Paid+f.Declined)
		row("  paid", f.Paid)
		row("  returned after paid", f.Declined)
		row("returned, reported failed", f.ReturnedReported)
	default:
		row("customers charged", f.Paid)
		row("customers declined", f.Declined)
	}
	if waitsOutWindow(f.Mode) {
		row("pending, settled a day later", f.PendingPastWindow)
	}
	row("final clean run: created", f.FinalRunCreated)
	row("final clean run: already", f.FinalRunAlreadyDone)
	row("reconcile pass: settled", f.Reconciled)
	row("webhooks refused", f.WebhooksRefused)
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

func (c *Config) check() error {
	if c.Customers < 1 || c.Runners < 1 {
		return errors.New("need at least 1 customer and 1 runner")
	}
	switch c.Mode {
	case "":
		c.Mode = ModeCharges
	case ModeCharges, ModeInvoices, ModeRefunds, ModeMoneyOut:
	case ModeUsage:
		if c.Windows < 1 {
			return errors.New("usage mode needs at least 1 window per customer")
		}
		if c.MeterDelay < 0 {
			return errors.New("the meter delay cannot be negative")
		}
		c.MeterDelay = cmp.Or(c.MeterDelay, DefaultMeterDelay)
	default:
		return fmt.Errorf("unknown mode %q: use %s, %s, %s, %s or %s", c.Mode, ModeCharges, ModeInvoices, ModeUsage, ModeRefunds, ModeMoneyOut)
	}
	return chaos.CheckConfig(c.Period, c.AttemptTimeout, c.Lease, c.DeclineFraction)
}

// Run runs the chaos scenario and returns its figures. An error means the
// harness itself could not run; broken invariants are in the figures.
func Run(ctx context.Context, cfg Config) (Figures, error) {
	if err := cfg.check(); err != nil {
		return Figures{}, fmt.Errorf("chaos: %w", err)
	}
	fig := Figures{Mode: cfg.Mode, Customers: cfg.Customers, Runners: cfg.Runners, Windows: cfg.Windows}
	env, err := chaos.Start(ctx, chaos.Setup{
		Name: "chaos", Seed: cfg.Seed, Stream: 0x0c4a05, Customers: cfg.Customers,
		Rates: cfg.Rates, DeclineFraction: cfg.DeclineFraction, MeterDelay: cfg.MeterDelay, LogDir: cfg.LogDir,
		Exe: cfg.Exe, ProcEnv: runnerEnv, ProcName: "runner", Out: cfg.Out, Cluster: cfg.Cluster,
	})
	if err != nil {
		return fig, err
	}
	defer env.Close()
	fig.LogDir = env.LogDir
	store, err := claim.NewPostgres(env.Pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		return fig, err
	}
	if err := store.Migrate(ctx); err != nil {
		return fig, err
	}
	var base time.Time
	var accounts []string // ModeMoneyOut's, by customer
	var accountsFile string
	progress := func() int { return int(env.Fake.Stats().Paid) }
	switch cfg.Mode {
	case ModeUsage:
		base = env.CreateMeter(cfg.Windows)
		// Progress is in customers' worth of meter events accepted.
		progress = func() int { return int(env.Fake.Stats().Created) / cfg.Windows }
	case ModeInvoices:
		progress = func() int { return len(env.Fake.Invoices("")) }
	case ModeRefunds:
		// Progress is in customers' worth of objects created: a charge
		// and its refunds but the one past the payment, as many as
		// chaos.Refunds has.
		perCustomer := len(chaos.Refunds(0))
		progress = func() int { return int(env.Fake.Stats().Created) / perCustomer }
	case ModeMoneyOut:
		accounts = env.CreateAccounts()
		raw, err := json.Marshal(accounts)
		if err != nil {
			return fig, err
		}
		accountsFile = filepath.Join(env.LogDir, "accounts.json")
		if err := os.WriteFile(accountsFile, raw, 0o644); err != nil {
			return fig, err
		}
		// Progress is in accounts' worth of objects created: a transfer
		// and a payout, beyond the accounts themselves.
		progress = func() int { return (int(env.Fake.Stats().Created) - len(accounts)) / 2 }
	}

	deadline := time.Now().Add(cfg.Timeout)
	start := func(index, gen int) (*chaos.Proc, error) {
		p, err := env.StartProc(index, gen, runnerConfig{
			DatabaseURL: env.ProcURL(fmt.Sprintf("chaos-runner-%d", index), cfg.Concurrency+2),
			StripeURL:   env.Fake.URL, Period: cfg.Period, Customers: cfg.Customers,
			Index: index, Runners: cfg.Runners, Generation: gen, Concurrency: cfg.Concurrency,
			BatchSize: cfg.BatchSize, Lease: cfg.Lease, AttemptTimeout: cfg.AttemptTimeout,
			RetryInitial: cfg.RetryInitial, RetryMax: cfg.RetryMax, RetryAttempts: cfg.RetryAttempts,
			LogPath: filepath.Join(env.LogDir, fmt.Sprintf("runner-%d.log", index)), Deadline: deadline,
			Mode: cfg.Mode, Windows: cfg.Windows, Base: base, Accounts: accountsFile,
		})
		if err == nil {
			fig.RunnerStarts++
		}
		return p, err
	}
	// Stripe's events reach a webhook endpoint while the runners run.
	final, err := finalBiller(cfg, env)
	if err != nil {
		return fig, err
	}
	hook, err := final.Webhook(billing.WebhookConfig{Secret: webhookSecret})
	if err != nil {
		return fig, err
	}
	lastHooks := time.Now()
	env.Plan(cfg.Kills, "kill")
	env.Plan(cfg.DBRestarts, "db-restart")
	env.Plan(cfg.Terminations, "terminate")

	chaosStart := time.Now()
	procs := make([]*chaos.Proc, cfg.Runners)
	finished := make([]bool, cfg.Runners)
	for i := range procs {
		if procs[i], err = start(i, 1); err != nil {
			return fig, err
		}
	}
	env.Logf("started %d runners for %d customers (%d declined), period %s, logs in %s", cfg.Runners, cfg.Customers, len(env.Declined), cfg.Period, env.LogDir)

	terminate := false // a termination is due
	// The fake holds the runners' writes at each event's point until the
	// event has fired (env.Hold): kills land while writes wait for their
	// answers; a restart of PostgreSQL and a termination of backends land
	// just after they are let go, while the runners' statements run.
	reached := env.Hold(progress)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return fig, ctx.Err()
		case <-reached:
			paid := progress()
			var after []chaos.Event
			for _, ev := range env.Due(paid) {
				if ev.Kind != "kill" {
					after = append(after, ev)
					continue
				}
				var alive []*chaos.Proc
				for i, p := range procs {
					if !finished[i] && !p.Exited() {
						alive = append(alive, p)
					}
				}
				if len(alive) == 0 {
					env.Logf("kill at %d charged: no runner alive, skipped", paid)
					continue
				}
				p := alive[env.Rand.IntN(len(alive))]
				p.Kill()
				fig.Kills++
				env.Logf("SIGKILL runner %d (gen %d, pid %d) at %d charged", p.Index, p.Gen, p.Pid(), paid)
			}
			reached = env.Release()
			for _, ev := range after {
				switch ev.Kind {
				case "db-restart":
					if err := env.RestartPostgres(ctx, cfg.DBDown, paid); err != nil {
						return fig, err
					}
					fig.DBRestarts++
				case "terminate":
					terminate = true
				}
			}
		case <-tick.C:
		}
		if terminate {
			// Until some backend is there to terminate (the runners may
			// be reconnecting after a restart of PostgreSQL).
			var n int
			err := env.Pool.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
				WHERE datname = current_database() AND application_name LIKE 'chaos-runner-%'`).Scan(&n)
			if err != nil {
				env.Logf("terminating backends: %v", err)
			}
			if n > 0 {
				fig.BackendTerminations += n
				terminate = false
				env.Logf("terminated %d runner backends at %d charged", n, progress())
			}
		}

		all := true
		for i, p := range procs {
			if finished[i] {
				continue
			}
			select {
			case <-p.Done():
				switch {
				case p.Killed:
					if procs[i], err = start(i, p.Gen+1); err != nil {
						return fig, err
					}
					all = false
				case p.Err == nil:
					finished[i] = true
					env.Logf("runner %d (gen %d) finished", i, p.Gen)
				default:
					fig.RunnerFailures++
					env.Logf("runner %d (gen %d) failed: %v", i, p.Gen, p.Err)
					finished[i] = true
				}
			default:
				all = false
			}
		}
		if all && env.EventsLeft() == 0 {
			break
		}
		if all {
			// Everything was charged before the remaining events' points:
			// they cannot fire any more.
			env.Logf("%d chaos events never fired: runners finished first", env.EventsLeft())
			break
		}
		if time.Since(lastHooks) > 100*time.Millisecond {
			fig.WebhooksRefused += env.DeliverWebhooks(ctx, hook, webhookSecret)
			lastHooks = time.Now()
		}
		if time.Now().After(deadline) {
			return fig, fmt.Errorf("chaos: runners still busy after %v; logs in %s", cfg.Timeout, env.LogDir)
		}
	}
	fig.ChaosTime = time.Since(chaosStart)
	env.Logf("chaos phase over after %v", fig.ChaosTime.Round(time.Millisecond))

	// Faults off, then a clean run and a reconcile pass settle what the
	// chaos left pending.
	env.Fake.SetScript(nil)
	if cfg.Mode == ModeUsage {
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM billonce_claims WHERE state = 'failed'`).Scan(&fig.FailedDuringChaos); err != nil {
			return fig, err
		}
		// The events the runners sent in the last MeterDelay are
		// rejected on the fake's schedule, in error reports of the
		// events each validation window took, as Stripe sends them
		// within minutes. Moving time a day on first would reject them
		// all at once, in one report that names a sample of them only.
		for until := time.Now().Add(cfg.MeterDelay); ; {
			fig.WebhooksRefused += env.DeliverWebhooks(ctx, hook, webhookSecret)
			if !time.Now().Before(until) {
				break
			}
			select {
			case <-ctx.Done():
				return fig, ctx.Err()
			case <-time.After(min(time.Until(until), 100*time.Millisecond)):
			}
		}
	}
	if waitsOutWindow(cfg.Mode) {
		// Reports and invoice steps whose outcome stayed unknown (a 500
		// Stripe stored for their key) wait out their key's window: time
		// passes on both clocks, and the final run settles them from what
		// Stripe shows (the meter's summaries, the invoice), without
		// sending blind.
		if err := env.Pool.QueryRow(ctx, `SELECT count(*) FROM billonce_claims WHERE state = 'pending'`).Scan(&fig.PendingPastWindow); err != nil {
			return fig, err
		}
		if err := env.PassTime(ctx, 25*time.Hour); err != nil {
			return fig, err
		}
		env.Fake.AggregateNow()
	}
	if err := finalRun(ctx, cfg, env, final, hook, base, accounts, &fig); err != nil {
		return fig, err
	}
	switch cfg.Mode {
	case ModeUsage:
		fig.Ledger, err = env.CheckUsage(ctx, base, cfg.Windows)
	case ModeInvoices:
		fig.Ledger, err = env.CheckInvoices(ctx, cfg.Period)
	case ModeRefunds:
		fig.Ledger, err = env.CheckRefunds(ctx, cfg.Period)
	case ModeMoneyOut:
		fig.Ledger, err = env.CheckMoneyOut(ctx, cfg.Period)
	default:
		fig.Ledger, err = env.Check(ctx, cfg.Period, map[string]int{cfg.Period: cfg.Customers})
	}
	if err != nil {
		return fig, err
	}
	fig.WallTime = env.Elapsed()
	fig.LogDir = env.CleanUp(fig.OK())
	return fig, nil
}

// finalRun bills every customer once more with faults off, until nothing is
// pending (claims of killed runners wait out their lease), then reconciles.
// Then the fake's last events (the meter error reports among them) reach
// the webhook. ModeMoneyOut transfers and pays out instead, moves time on
// until the payouts are paid, and has the bank return some after.
func finalRun(ctx context.Context, cfg Config, env *chaos.Env, b *billing.Biller, hook http.Handler, base time.Time, accounts []string, fig *Figures) error {
	deadline := time.Now().Add(cfg.Lease + time.Minute)
	var err error
	if cfg.Mode == ModeMoneyOut {
		err = finalMoneyOut(ctx, cfg, env, b, hook, accounts, deadline, fig)
	} else {
		err = finalBills(ctx, cfg, env, b, base, deadline, fig)
	}
	if err != nil {
		return err
	}
	if cfg.Mode == ModeRefunds {
		if err := finalRefunds(ctx, cfg, env, b, deadline, fig); err != nil {
			return err
		}
	}
	sum, err := b.Reconcile(ctx, nil)
	if err != nil {
		return fmt.Errorf("chaos: reconcile pass: %w", err)
	}
	fig.Reconciled = sum.Created + sum.AlreadyBilled
	env.Logf("reconcile pass: %d stale claims, %d settled", sum.Total, fig.Reconciled)
	env.Fake.AggregateNow() // the meter error reports, as Stripe sends them within minutes
	fig.WebhooksRefused += env.DeliverWebhooks(ctx, hook, webhookSecret)
	if cfg.Mode == ModeMoneyOut {
		return returnPayouts(ctx, cfg, env, b, hook, accounts, fig)
	}
	return nil
}

// finalBills bills every customer once more with faults off, Run after
// Run until nothing is pending or deadline passes.
func finalBills(ctx context.Context, cfg Config, env *chaos.Env, b *billing.Biller, base, deadline time.Time, fig *Figures) error {
	for run := 1; ; run++ {
		var sum billing.Summary
		var err error
		if cfg.Mode == ModeUsage {
			sum, err = b.RunUsage(ctx, usageItems(cfg.Customers, 0, cfg.Windows, base), &billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize})
		} else {
			it := items(cfg.Customers, 0)
			if cfg.Mode == ModeInvoices {
				it = invoiceItems(cfg.Customers, 0)
			}
			sum, err = b.Run(ctx, cfg.Period, it, &billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize})
		}
		fig.FinalRunCreated += sum.Created
		fig.FinalRunAlreadyDone = sum.AlreadyBilled
		if err == nil && sum.Pending == 0 {
			env.Logf("final clean run %d: created %d, already done %d, failed %d", run, sum.Created, sum.AlreadyBilled, sum.Declined)
			return nil
		}
		if time.Now().After(deadline) {
			fig.UnsettledAfterFinalRun = sum.Pending
			env.Logf("final clean run %d: %d still pending (%v); giving up", run, sum.Pending, err)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// finalMoneyOut transfers to every account again with faults off, Run
// after Run until none is pending or deadline passes, then pays out of
// every account whose transfer succeeded the same way. Then time passes
// until the payouts are paid, and their events reach the webhook.
func finalMoneyOut(ctx context.Context, cfg Config, env *chaos.Env, b *billing.Biller, hook http.Handler, accounts []string, deadline time.Time, fig *Figures) error {
	logger, closeLog, err := finalLogger(env)
	if err != nil {
		return err
	}
	defer closeLog()
	again := func() bool {
		if time.Now().After(deadline) {
			return false
		}
		select {
		case <-ctx.Done():
			return false
		case <-time.After(200 * time.Millisecond):
			return true
		}
	}
	var unpaid map[string]bool
	for _, payout := range []bool{false, true} {
		what := map[bool]string{false: "transfers", true: "payouts"}[payout]
		sum, err := moveOutAll(ctx, b, cfg.Period, accounts, 0, payout, unpaid, billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize}, logger, again)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		fig.FinalRunCreated += sum.Created
		fig.FinalRunAlreadyDone += sum.AlreadyBilled + sum.Processing
		failed, all := notPaid(sum)
		if err != nil || sum.Pending > 0 || !all {
			fig.UnsettledAfterFinalRun += sum.Pending
			env.Logf("final %s: %d still pending, %d failed (%v); giving up", what, sum.Pending, len(failed), err)
			return nil // the check says what is missing
		}
		env.Logf("final %s: created %d, already done %d, processing %d, failed %d", what, sum.Created, sum.AlreadyBilled, sum.Processing, len(failed))
		unpaid = failed
	}
	if err := env.PassTime(ctx, payoutsPaid); err != nil {
		return err
	}
	fig.WebhooksRefused += env.DeliverWebhooks(ctx, hook, webhookSecret)
	return nil
}

// returnPayouts has the bank return the paid payouts of the declined
// customers' accounts, delivers the payout.failed events to the webhook,
// and runs every payout once more: the returned ones must be reported
// failed after processing, and nothing more sent.
func returnPayouts(ctx context.Context, cfg Config, env *chaos.Env, b *billing.Biller, hook http.Handler, accounts []string, fig *Figures) error {
	n, err := env.ReturnPayouts(cfg.Period)
	if err != nil {
		return err
	}
	fig.PayoutsReturned = n
	fig.WebhooksRefused += env.DeliverWebhooks(ctx, hook, webhookSecret)
	sum, err := b.Run(ctx, cfg.Period, moneyOutItems(accounts, 0, true, nil), &billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize})
	if err != nil {
		return fmt.Errorf("chaos: the payouts' last run: %w", err)
	}
	fig.ReturnedReported = sum.DeclinedAfterProcessing
	env.Logf("%d payouts returned by the bank; every payout once more: created %d, already done %d, failed after processing %d, pending %d",
		n, sum.Created, sum.AlreadyBilled, sum.DeclinedAfterProcessing, sum.Pending)
	return nil
}

// finalLogger is a logger to final.log, which the final Biller logs to
// as well, and what closes it.
func finalLogger(env *chaos.Env) (*slog.Logger, func() error, error) {
	f, err := os.OpenFile(filepath.Join(env.LogDir, "final.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, err
	}
	return slog.New(slog.NewJSONHandler(f, nil)), f.Close, nil
}

// finalRefunds asks for every customer's refunds again with faults off,
// pass after pass until none is left unsettled (refunds of killed runners
// wait out their lease) or deadline passes. What is left unsettled is
// logged to final.log.
func finalRefunds(ctx context.Context, cfg Config, env *chaos.Env, b *billing.Biller, deadline time.Time, fig *Figures) error {
	logger, closeLog, err := finalLogger(env)
	if err != nil {
		return err
	}
	defer closeLog()
	for pass := 1; ; pass++ {
		p := refundAll(ctx, b, cfg.Period, cfg.Customers, 0, cfg.Concurrency, logger)
		fig.RefundsRefused = p.Refused
		if p.Left == 0 {
			env.Logf("final refund pass %d: %d refunds made, %d refused past the payment, %d customers with no payment", pass, p.Made, p.Refused, p.Unpaid)
			return nil
		}
		if time.Now().After(deadline) {
			fig.UnsettledAfterFinalRun += p.Left
			env.Logf("final refund pass %d: %d customers' refunds still unsettled; giving up", pass, p.Left)
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// finalBiller is the Biller of the harness itself: its webhook endpoint,
// and the clean run that settles what the chaos left. It logs to
// final.log.
func finalBiller(cfg Config, env *chaos.Env) (*billing.Biller, error) {
	f, err := os.Create(filepath.Join(env.LogDir, "final.log"))
	if err != nil {
		return nil, err
	}
	store, err := claim.NewPostgres(env.Pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		return nil, err
	}
	return billing.New(billing.Config{
		SecretKey: "sk_test_chaos", StripeURL: env.Fake.URL, Claims: store, RateLimit: -1, Owner: "chaos-final", Invoice: chaos.InvoiceOf,
		Retry:  retry.Policy{InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, AttemptTimeout: cfg.AttemptTimeout},
		Logger: slog.New(slog.NewJSONHandler(f, nil)),
	})
}
