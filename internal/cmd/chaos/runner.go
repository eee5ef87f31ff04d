package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"os"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/chaos"
	"github.com/billonce/billonce/retry"
)

// runnerEnv carries a runner's configuration, as JSON, from the harness to
// the process it starts (the same binary, re-executed).
const runnerEnv = "BILLONCE_CHAOS_RUNNER"

// runnerConfig is what one runner process needs.
type runnerConfig struct {
	DatabaseURL string
	StripeURL   string
	Period      string
	Customers   int
	// Index and Runners place the runner's starting point: runner i starts
	// at customer i*Customers/Runners and wraps around, so runners meet on
	// the same customers while each still starts somewhere else.
	Index, Runners int
	Generation     int
	Concurrency    int
	BatchSize      int
	Lease          time.Duration
	// The retry policy's durations and attempts (a Policy itself holds a
	// func and does not travel as JSON).
	AttemptTimeout, RetryInitial, RetryMax time.Duration
	RetryAttempts                          int
	LogPath                                string
	Deadline                               time.Time
	// Mode is what the runner does: ModeCharges bills the period,
	// ModeInvoices bills it by invoice, ModeUsage reports Windows usage
	// windows per customer, starting at Base, with RunUsage, ModeRefunds
	// bills the period and then refunds every customer's payment,
	// ModeMoneyOut transfers to every account of the file Accounts and
	// then pays each out.
	Mode     string
	Windows  int
	Base     time.Time
	Accounts string
}

// items yields customers start, start+1, … n-1, 0, … start-1, each with its
// price.
func items(n, start int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for k := range n {
			i := (start + k) % n
			p := chaos.Price(i)
			if !yield(billing.Item{Customer: chaos.CustomerID(i), Price: &p}, nil) {
				return
			}
		}
	}
}

// invoiceItems yields customers as items does, each billed by its invoice.
func invoiceItems(n, start int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for k := range n {
			i := (start + k) % n
			inv := chaos.Invoice(i)
			if !yield(billing.Item{Customer: chaos.CustomerID(i), Invoice: &inv}, nil) {
				return
			}
		}
	}
}

// usageItems yields the usage reports of customers start, start+1, … n-1,
// 0, … start-1, each customer's windows in order.
func usageItems(n, start, windows int, base time.Time) iter.Seq2[billing.Usage, error] {
	return func(yield func(billing.Usage, error) bool) {
		for k := range n {
			for w := range windows {
				if !yield(chaos.Usage((start+k)%n, w, base), nil) {
					return
				}
			}
		}
	}
}

// runnerMain is a runner process: it bills the period until one Run leaves
// nothing pending, then exits 0. It exits 2 if the deadline passes first.
func runnerMain(cfg runnerConfig) int {
	logf, err := os.OpenFile(cfg.LogPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "chaos runner: %v\n", err)
		return 3
	}
	defer logf.Close()
	logger := slog.New(slog.NewJSONHandler(logf, nil)).With("runner", cfg.Index, "gen", cfg.Generation, "pid", os.Getpid())
	ctx, cancel := context.WithDeadline(context.Background(), cfg.Deadline)
	defer cancel()

	pool, err := pgxpool.New(ctx, cfg.DatabaseURL)
	if err != nil {
		logger.Error("chaos runner: pool", "error", err)
		return 3
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{Lease: cfg.Lease})
	if err != nil {
		logger.Error("chaos runner: claim store", "error", err)
		return 3
	}
	b, err := billing.New(billing.Config{
		SecretKey: "sk_test_chaos",
		StripeURL: cfg.StripeURL,
		Claims:    store,
		RateLimit: -1,
		Retry: retry.Policy{
			InitialInterval: cfg.RetryInitial, MaxInterval: cfg.RetryMax, MaxAttempts: cfg.RetryAttempts,
			AttemptTimeout: cfg.AttemptTimeout, MaxElapsed: 30 * time.Second,
		},
		Invoice: chaos.InvoiceOf, // resumes what another runner left part way
		Owner:   fmt.Sprintf("chaos-%d-%d-%d", cfg.Index, cfg.Generation, os.Getpid()),
		Logger:  logger,
	})
	if err != nil {
		logger.Error("chaos runner: biller", "error", err)
		return 3
	}
	start := cfg.Index * cfg.Customers / max(1, cfg.Runners)
	if cfg.Mode == ModeMoneyOut {
		return moneyOutMain(ctx, cfg, b, logger, start)
	}
	var stuck time.Time // since when runs have only waited
	for run := 1; ; run++ {
		var sum billing.Summary
		total := cfg.Customers
		if cfg.Mode == ModeUsage {
			total *= cfg.Windows
			sum, err = b.RunUsage(ctx, usageItems(cfg.Customers, start, cfg.Windows, cfg.Base), &billing.RunOptions{
				Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize, Total: total,
			})
		} else {
			it := items(cfg.Customers, start)
			if cfg.Mode == ModeInvoices {
				it = invoiceItems(cfg.Customers, start)
			}
			sum, err = b.Run(ctx, cfg.Period, it, &billing.RunOptions{
				Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize, Total: total,
			})
		}
		logger.Info("chaos runner: run finished", "run", run, "created", sum.Created, "already_done", sum.AlreadyBilled,
			"failed", sum.Declined, "pending", sum.Pending, "invalid", sum.Invalid, "elapsed", sum.Elapsed, "error", err)
		if err == nil && sum.Pending == 0 && sum.Invalid == 0 && sum.Done == total {
			if cfg.Mode == ModeRefunds {
				return refundsMain(ctx, cfg, b, logger, start)
			}
			return 0
		}
		// Usage reports and invoice steps whose outcome Stripe keeps
		// answering unknown (a 500 stored after executing) stay pending
		// until their key's window is over, under the lease of whichever
		// runner tries them: the harness settles them from what Stripe
		// shows once it has moved time on. The reports Stripe rejected,
		// failed meanwhile by their error reports (which come a minute
		// after the events, so within any longer run), are settled.
		// Waiting longer than a lease lets claims of killed runners be
		// resumed here first.
		if waitsOutWindow(cfg.Mode) && err == nil && sum.Created == 0 && sum.Pending > 0 && onlyWaiting(sum.Failures) {
			if stuck.IsZero() {
				stuck = time.Now()
			}
			if time.Since(stuck) > cfg.Lease+time.Second {
				logger.Info("chaos runner: what is left pending waits for its window to pass", "pending", sum.Pending)
				return 0
			}
		} else {
			stuck = time.Time{}
		}
		select {
		case <-ctx.Done():
			logger.Error("chaos runner: deadline passed with customers still pending", "pending", sum.Pending)
			return 2
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// onlyWaiting reports whether every error of errs is settled for good or
// waits: a decline (a usage report Stripe rejected, whose claim its meter
// error report failed) is settled, and no later run changes it; an
// unknown outcome or a claim another runner holds waits. errs is a run's
// Summary.Failures, which holds the first 1,000 only.
func onlyWaiting(errs []error) bool {
	for _, err := range errs {
		if !errors.Is(err, billing.ErrDeclined) && !errors.Is(err, billing.ErrOutcomeUnknown) && !errors.Is(err, billing.ErrInProgress) {
			return false
		}
	}
	return true
}

// refundsMain refunds every customer's payment by chaos.Refunds, pass
// after pass, until a pass leaves none unsettled, then exits 0. It exits
// 2 if the deadline passes first.
func refundsMain(ctx context.Context, cfg runnerConfig, b *billing.Biller, logger *slog.Logger, start int) int {
	for pass := 1; ; pass++ {
		p := refundAll(ctx, b, cfg.Period, cfg.Customers, start, cfg.Concurrency, logger)
		logger.Info("chaos runner: refund pass finished", "pass", pass, "made", p.Made, "refused", p.Refused, "unpaid", p.Unpaid, "left", p.Left)
		if p.Left == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			logger.Error("chaos runner: deadline passed with refunds still unsettled", "left", p.Left)
			return 2
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// refundPass is what one pass of refundAll found.
type refundPass struct {
	Made    int // refunds made, or found made
	Refused int // refunds refused, past what is left of the payment
	Unpaid  int // customers with no payment to refund: declined
	Left    int // customers with a refund not settled: to try again
}

// refundAll asks for the refunds of customers start, start+1, … n-1, 0,
// … start-1 with concurrency workers, each customer's in order: a refund
// past the payment is asked for only once those before it are made, and
// is refused. A customer whose refund met an error (a crash elsewhere
// holding its claim, an unknown outcome, the database down) is left for
// the next pass.
func refundAll(ctx context.Context, b *billing.Biller, period string, n, start, concurrency int, logger *slog.Logger) refundPass {
	var mu sync.Mutex
	var pass refundPass
	todo := make(chan int)
	var wg sync.WaitGroup
	for range max(1, concurrency) {
		wg.Go(func() {
			for i := range todo {
				p := refundCustomer(ctx, b, period, i, logger)
				mu.Lock()
				pass.Made, pass.Refused, pass.Unpaid, pass.Left = pass.Made+p.Made, pass.Refused+p.Refused, pass.Unpaid+p.Unpaid, pass.Left+p.Left
				mu.Unlock()
			}
		})
	}
	for k := range n {
		select {
		case todo <- (start + k) % n:
		case <-ctx.Done():
			pass.Left += n - k
			close(todo)
			wg.Wait()
			return pass
		}
	}
	close(todo)
	wg.Wait()
	return pass
}

// refundCustomer asks for customer i's refunds, in order, until one is
// left unsettled. A refund refused, failed or contradicted by its claim
// is settled for good, as a person would find it: the check says what
// should have been.
func refundCustomer(ctx context.Context, b *billing.Biller, period string, i int, logger *slog.Logger) refundPass {
	var p refundPass
	c := chaos.CustomerID(i)
	for _, r := range chaos.Refunds(i) {
		_, err := b.Refund(ctx, c, period, r.ID, r.Amount)
		var m *claim.MismatchError
		switch {
		case err == nil:
			p.Made++
			if r.Past {
				logger.Error("chaos runner: a refund past the payment was made", "customer", c, "refund", r.ID, "amount", r.Amount)
			}
		case errors.Is(err, billing.ErrInvalid) && errors.As(err, &m) && m.Field == "refund":
			p.Refused++
			if !r.Past {
				logger.Error("chaos runner: a refund within the payment was refused", "customer", c, "refund", r.ID, "error", err)
			}
		case errors.Is(err, billing.ErrInvalid) && !errors.As(err, &m):
			// No payment to refund: every customer's charge is settled
			// (the runner's Run left none pending), so it declined.
			p.Unpaid++
			return p
		case errors.Is(err, billing.ErrDeclined), errors.As(err, &m):
			logger.Error("chaos runner: refund failed, or refused by its claim", "customer", c, "refund", r.ID, "error", err)
		default:
			logger.Warn("chaos runner: refund not settled", "customer", c, "refund", r.ID, "error", err)
			p.Left++
			return p
		}
	}
	return p
}

// moneyOutMain transfers to every account its customer's price, Run
// after Run until one leaves none pending, then pays out the same amount
// from each account whose transfer that Run saw succeed, Run after Run
// until none is pending, and exits 0. So no payout is sent before its
// account's transfer succeeded: Stripe would refuse it for the balance,
// and its claim would fail for good. It exits 1 if a transfer or payout
// did not succeed (the check says which), 2 if the deadline passes first.
func moneyOutMain(ctx context.Context, cfg runnerConfig, b *billing.Biller, logger *slog.Logger, start int) int {
	accounts, err := readAccounts(cfg.Accounts)
	if err != nil {
		logger.Error("chaos runner: accounts", "error", err)
		return 3
	}
	opts := billing.RunOptions{Concurrency: cfg.Concurrency, BatchSize: cfg.BatchSize}
	wait := func() bool {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(100 * time.Millisecond):
			return true
		}
	}
	code := 0
	var unpaid map[string]bool
	for _, payout := range []bool{false, true} {
		sum, err := moveOutAll(ctx, b, cfg.Period, accounts, start, payout, unpaid, opts, logger, wait)
		if err != nil || sum.Pending > 0 {
			logger.Error("chaos runner: deadline passed with money out still pending", "payouts", payout, "pending", sum.Pending, "error", err)
			return 2
		}
		failed, all := notPaid(sum)
		for _, err := range sum.Failures {
			logger.Error("chaos runner: not paid", "payouts", payout, "error", err)
		}
		if len(failed) > 0 || !all {
			code = 1
		}
		if !all {
			return code // which accounts' transfers failed is not known: none is paid out
		}
		unpaid = failed
	}
	return code
}

// readAccounts reads the accounts of a run, as the harness wrote them
// (JSON, in the customers' order).
func readAccounts(path string) ([]string, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var accounts []string
	return accounts, json.Unmarshal(raw, &accounts)
}

// moneyOutItems yields accounts start, start+1, … n-1, 0, … start-1 but
// those of skip, each with a transfer of its customer's price, or a
// payout of it.
func moneyOutItems(accounts []string, start int, payout bool, skip map[string]bool) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for k := range accounts {
			i := (start + k) % len(accounts)
			if skip[accounts[i]] {
				continue
			}
			p := chaos.Price(i)
			it := billing.Item{Account: accounts[i], Transfer: &p}
			if payout {
				it = billing.Item{Account: accounts[i], Payout: &p}
			}
			if !yield(it, nil) {
				return
			}
		}
	}
}

// moveOutAll runs the transfers, or the payouts, of accounts but skip,
// Run after Run, until one leaves none pending or again reports false,
// and returns the last Run's summary and error. A processing payout (on
// its way to the bank) is settled: nothing more is sent for it.
func moveOutAll(ctx context.Context, b *billing.Biller, period string, accounts []string, start int, payout bool, skip map[string]bool,
	opts billing.RunOptions, logger *slog.Logger, again func() bool) (billing.Summary, error) {
	opts.Total = len(accounts) - len(skip)
	for run := 1; ; run++ {
		sum, err := b.Run(ctx, period, moneyOutItems(accounts, start, payout, skip), &opts)
		logger.Info("chaos runner: money-out run finished", "payouts", payout, "run", run, "created", sum.Created, "already_done", sum.AlreadyBilled,
			"processing", sum.Processing, "failed", sum.Declined+sum.DeclinedAfterProcessing, "pending", sum.Pending, "invalid", sum.Invalid, "error", err)
		if err == nil && sum.Pending == 0 || !again() {
			return sum, err
		}
	}
}

// notPaid names the accounts of a Run of transfers or payouts that left
// none pending whose transfer or payout did not succeed: failed, or
// refused. all is false when Summary.Failures was cut short, and not
// every one is named.
func notPaid(sum billing.Summary) (failed map[string]bool, all bool) {
	failed = map[string]bool{}
	for _, err := range sum.Failures {
		var ce *billing.ChargeError
		if errors.As(err, &ce) {
			failed[ce.Customer] = true
		}
	}
	return failed, len(failed) == sum.Declined+sum.DeclinedAfterProcessing+sum.Invalid
}
