package riverbilling

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/nilness"
)

// Defaults for [WorkerConfig] and [ChargeArgs.InsertOpts].
//
// The retry budget, worked out: River calls [Worker.NextRetry] after a run
// that ended with an unknown outcome. The waits double from
// DefaultRetryInterval and are capped at DefaultMaxRetryInterval, with up
// to 10% jitter added: 30 s, 1, 2, 4, 8, 16, 32 min, then 1 h, 1 h. Over
// DefaultMaxAttempts (10) runs that is 9 waits, 3 h 03 min 30 s before
// jitter and at most 3 h 22 min with it, plus at most 10 runs of
// DefaultJobTimeout (5 min each, 50 min): about 4 h 12 min from the first
// run to the last, far inside the Biller's key deadline (WindowMargin, 23 h
// by default, Stripe's window being 24 h). A customer of a job of several
// may have its key sent by every run of that job and then by every run of
// the job of its own it is handed on to: twice the budget, about 8 h 24
// min, still inside it.
//
// The budget keeps retries within the window when the queue flows. Nothing
// bounds how long a job waits in a queue behind others, how long River's
// rescuer takes to notice a dead worker, or when a person retries a
// discarded job; none of that can make a second charge either, because the
// Biller checks the key's deadline on the database clock before every HTTP
// attempt and, once it has passed, looks the payment up with Stripe's
// search instead of sending the key again.
const (
	DefaultMaxAttempts      = 10
	DefaultRetryInterval    = 30 * time.Second
	DefaultMaxRetryInterval = time.Hour
	// DefaultJobTimeout bounds one run of a charge job. It must cover the
	// Biller's whole Charge: its Retry.MaxElapsed (2 min by default), its
	// InProgressWait and a reconciliation search. Keep it below River's
	// RescueStuckJobsAfter (1 h by default). A job of several customers
	// cut short by it loses nothing: the customers billed stay billed, and
	// its retry bills the others.
	DefaultJobTimeout = 5 * time.Minute
)

// Bounds on how long a job is snoozed while another runner holds its claim.
const (
	minSnooze = time.Second
	maxSnooze = 5 * time.Minute
)

// WorkerConfig configures a [Worker]. Zero values take the defaults.
type WorkerConfig struct {
	// JobTimeout bounds one run of a job. Defaults to DefaultJobTimeout.
	JobTimeout time.Duration
	// RetryInterval is the wait after the first run whose outcome is
	// unknown; each later wait doubles, up to MaxRetryInterval. Default to
	// DefaultRetryInterval and DefaultMaxRetryInterval.
	RetryInterval, MaxRetryInterval time.Duration
	// KeepQueueOnStop leaves the job's queue running after a spend-cap,
	// revoked-key, permission or configuration answer. By default the
	// queue is paused: every other job of it would meet the same answer.
	KeepQueueOnStop bool
	// Logger receives cancelled jobs and paused queues. Nil discards.
	Logger *slog.Logger
}

// Worker is the River worker of [ChargeArgs]: it bills one customer for one
// period through a [billing.Biller] and tells River what became of it.
//
//   - Charged, or found already charged: the job completes (for an
//     invoice job, [ChargeArgs].Invoice: invoiced, paid or sent, or left
//     open by a declined payment for Stripe to collect). A re-bill
//     job that finds an earlier attempt still processing (a bank debit)
//     is snoozed for MaxRetryInterval at a time until that attempt
//     settles; then it completes, or bills if the attempt failed.
//   - Declined, or refused for the customer's own account or price: the job
//     is cancelled with the reason and never retried. Billing again is a
//     new job with ChargeArgs.Attempt 2 and above.
//   - Another runner holds the customer's claim (a second run of the same
//     job, say, started by River's rescuer): the job is snoozed until that
//     claim's lease ends; snoozes do not use up attempts.
//   - Outcome unknown: the job fails and River retries it after
//     [Worker.NextRetry]. Every retry sends the same key.
//   - A spend cap reached, a revoked key, Stripe refusing the API key or
//     the request itself: the job is cancelled, the error is logged, and
//     the job's queue is paused, since every other job would meet the same
//     answer. Fix the cause, resume the queue (river.Client.QueueResume),
//     and retry the cancelled jobs (River UI, or river.Client.JobRetry),
//     fan the period out again (a cancelled job of several customers does
//     not block its own arguments), or finish the period with
//     [billing.Biller.Run]: it shares the claims.
//
// A job of several customers ([ChargeArgs].Customers) bills them in one
// [billing.Biller.Run], with Run's default options (so up to
// billing.DefaultConcurrency of them at once, and their claims made and
// their outcomes recorded in batches), and is told apart as a whole: it
// completes when Run went through, is cancelled (and its queue paused)
// when Run stopped on a spend cap or a refused key, and is retried when
// Run was cut short. Each of its customers keeps the outcomes above: one
// that Run did not bill (declined, held by another runner, outcome
// unknown, refused) gets a job of its own, inserted before the job of
// several completes, available at once or scheduled as a snooze or a
// first retry would be, and from then on it is that job's.
//
// A job may run more than once, even twice at the same time: River delivers
// at least once. The Biller's claims make every run after the first find
// the charge, or wait for it, instead of making another; a run of a job
// of several customers finds the customers billed so far already billed,
// and hands on the ones another run holds.
type Worker struct {
	river.WorkerDefaults[ChargeArgs]
	runner
}

// runner is what [Worker], [UsageWorker] and [MoneyOutWorker] share: the
// Biller, the configuration, and the mapping of the Biller's answers to
// River.
type runner struct {
	biller *billing.Biller
	cfg    WorkerConfig
	log    *slog.Logger
}

// NewWorker returns a Worker that bills through b.
func NewWorker(b *billing.Biller, cfg WorkerConfig) (*Worker, error) {
	r, err := newRunner("NewWorker", b, cfg)
	if err != nil {
		return nil, err
	}
	return &Worker{runner: r}, nil
}

func newRunner(name string, b *billing.Biller, cfg WorkerConfig) (runner, error) {
	if b == nil {
		return runner{}, fmt.Errorf("%w: riverbilling.%s needs a *billing.Biller (billing.New)", billing.ErrInvalid, name)
	}
	if cfg.JobTimeout < 0 || cfg.RetryInterval < 0 || cfg.MaxRetryInterval < 0 {
		return runner{}, fmt.Errorf("%w: WorkerConfig durations must not be negative (zero takes the default)", billing.ErrInvalid)
	}
	if cfg.Logger != nil && nilness.Is(cfg.Logger.Handler()) {
		return runner{}, fmt.Errorf("%w: WorkerConfig.Logger has no handler", billing.ErrInvalid)
	}
	if cfg.JobTimeout == 0 {
		cfg.JobTimeout = DefaultJobTimeout
	}
	if cfg.RetryInterval == 0 {
		cfg.RetryInterval = DefaultRetryInterval
	}
	if cfg.MaxRetryInterval == 0 {
		cfg.MaxRetryInterval = DefaultMaxRetryInterval
	}
	if cfg.RetryInterval > cfg.MaxRetryInterval {
		return runner{}, fmt.Errorf("%w: WorkerConfig.RetryInterval %v is above MaxRetryInterval %v", billing.ErrInvalid, cfg.RetryInterval, cfg.MaxRetryInterval)
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return runner{biller: b, cfg: cfg, log: log}, nil
}

// Timeout is WorkerConfig.JobTimeout.
func (w *Worker) Timeout(*river.Job[ChargeArgs]) time.Duration { return w.cfg.JobTimeout }

// NextRetry schedules the retry after a run whose outcome was unknown:
// RetryInterval doubled for each run before, capped at MaxRetryInterval,
// plus up to 10% jitter so that jobs failed by one outage do not all come
// back at once. See the defaults for the arithmetic.
func (w *Worker) NextRetry(job *river.Job[ChargeArgs]) time.Time {
	return time.Now().Add(w.retryWait(job.Attempt))
}

func (w *runner) retryWait(attempt int) time.Duration {
	d := w.cfg.RetryInterval
	for i := 1; i < attempt && d < w.cfg.MaxRetryInterval; i++ {
		d *= 2
	}
	d = min(d, w.cfg.MaxRetryInterval)
	return d + rand.N(d/10+1)
}

// Work bills the job's customer, or customers, for its period.
func (w *Worker) Work(ctx context.Context, job *river.Job[ChargeArgs]) error {
	a := job.Args
	var err error
	switch {
	case len(a.Customers) > 0:
		return w.workMany(ctx, job)
	case a.Invoice && a.Account != "":
		err = fmt.Errorf("%w: an invoice job for customer %s, period %s names account %s: invoice jobs bill on the platform's own account", billing.ErrInvalid, a.Customer, a.Period, a.Account)
	case a.Invoice && a.Attempt > 1:
		err = fmt.Errorf("%w: an invoice job for customer %s, period %s has attempt %d: invoices are billed once, as attempt 0 or 1", billing.ErrInvalid, a.Customer, a.Period, a.Attempt)
	case a.Invoice:
		// A payment declined leaves the invoice open for Stripe to
		// collect: the receipt is processing, and the job completes.
		_, err = w.biller.Invoice(ctx, a.Customer, a.Period, nil)
	case a.Attempt <= 1:
		_, err = w.biller.Charge(ctx, a.Customer, a.Period, &billing.ChargeOptions{Account: a.Account})
	default:
		var r billing.Receipt
		r, err = w.biller.Rebill(ctx, a.Customer, a.Period, a.Attempt, &billing.ChargeOptions{Account: a.Account})
		if snoozed := w.waitEarlier(r, err, a.Attempt); snoozed != nil {
			return snoozed
		}
	}
	return w.finish(ctx, job.JobRow, err, "charge",
		"customer", a.Customer, "period", a.Period, "attempt", a.Attempt, "invoice", a.Invoice)
}

// maxJobCustomers bounds ChargeArgs.Customers: a Run's Summary.Failures
// names at most 1,000 customers, and every customer a job's Run does not
// bill must be named to get a job of its own.
const maxJobCustomers = 1000

// workMany bills the customers of a job of several in one Run. River is
// told what became of the Run as a whole, as [decide] says for its error:
// a Run stopped by a spend cap cancels the job and pauses its queue, one
// cut short (the job's timeout, the database) is retried, and the retry's
// Run finds every customer billed so far already billed. A Run that went
// through completes the job, once every customer it did not bill has a
// job of its own, inserted as decide says for that customer's error:
// available at once for a decline or a refusal (it meets the failed claim
// and is cancelled with the reason, without a request to Stripe),
// scheduled for when another runner's lease ends, or for the first retry
// of an unknown outcome. From then on each of them is a job of one
// customer, with its own retries.
func (w *Worker) workMany(ctx context.Context, job *river.Job[ChargeArgs]) error {
	a := job.Args
	client, cerr := river.ClientFromContextSafely[pgx.Tx](ctx)
	var err error
	switch {
	case a.Customer != "" || a.Invoice || a.Attempt > 1:
		err = fmt.Errorf("%w: a charge job of several customers (period %s) bills each for the first time, as Biller.Run does: it takes no Customer, Invoice or Attempt above 1", billing.ErrInvalid, a.Period)
	case len(a.Customers) > maxJobCustomers:
		err = fmt.Errorf("%w: a charge job of %d customers (period %s): at most %d", billing.ErrInvalid, len(a.Customers), a.Period, maxJobCustomers)
	case cerr != nil:
		err = fmt.Errorf("%w: a charge job of several customers runs on a River client with the pgx driver, which inserts the jobs of the customers it does not bill: %w", billing.ErrInvalid, cerr)
	}
	for i, c := range a.Customers {
		if err != nil {
			break
		}
		if verr := (billing.Item{Customer: c, Account: a.Account}).Validate(billing.Charges); verr != nil {
			err = fmt.Errorf("customer %d of a charge job of %d (period %s): %w", i+1, len(a.Customers), a.Period, verr)
		}
	}
	if err == nil {
		var sum billing.Summary
		items := func(yield func(billing.Item, error) bool) {
			for _, c := range a.Customers {
				if !yield(billing.Item{Customer: c, Account: a.Account}, nil) {
					return
				}
			}
		}
		sum, err = w.biller.Run(ctx, a.Period, items, nil)
		if err == nil {
			err = w.handOn(ctx, client, a.Period, len(a.Customers), sum)
		}
	}
	return w.finish(ctx, job.JobRow, err, "charge", "period", a.Period, "customers", len(a.Customers))
}

// handOn inserts a job of one customer for every customer that the Run
// summed up in sum did not bill, of a job of n customers for period.
func (w *runner) handOn(ctx context.Context, client *river.Client[pgx.Tx], period string, n int, sum billing.Summary) error {
	if sum.Done != n {
		return fmt.Errorf("riverbilling: the run of %d customers for %s settled %d; the job is run again", n, period, sum.Done)
	}
	now := time.Now()
	jobs := make([]river.InsertManyParams, 0, len(sum.Failures))
	for _, f := range sum.Failures {
		var ce *billing.ChargeError
		if !errors.As(f, &ce) || ce.Customer == "" {
			return fmt.Errorf("riverbilling: the run for %s answered for no customer: %v; the job is run again", period, f)
		}
		var at time.Time // at once
		switch act := decide(f, now); act.kind {
		case snooze:
			at = now.Add(act.snooze)
		case retry:
			at = now.Add(w.retryWait(1))
		}
		jobs = append(jobs, river.InsertManyParams{Args: ChargeArgs{Customer: ce.Customer, Period: period, Account: ce.Account},
			InsertOpts: &river.InsertOpts{ScheduledAt: at}})
	}
	if len(jobs) == 0 {
		return nil
	}
	if _, err := client.InsertMany(ctx, jobs); err != nil {
		return fmt.Errorf("riverbilling: inserting the jobs of the %d customers not billed for %s: %w", len(jobs), period, err)
	}
	return nil
}

// waitEarlier answers for a job of attempt (a re-bill, or a transfer's or
// payout's next attempt) whose receipt r is an earlier attempt's, still
// processing: nothing is paid yet. Completing the job would leave a
// completed job with these arguments, which River's uniqueness holds
// against the same job queued again once that attempt fails (and the
// attempt after it needs this one failed); so the job waits for the
// outcome, then pays or completes. It returns nil for any other answer.
func (w *runner) waitEarlier(r billing.Receipt, err error, attempt int) error {
	if err == nil && r.Processing && r.Attempt < attempt {
		return river.JobSnooze(w.cfg.MaxRetryInterval)
	}
	return nil
}

// finish tells River what became of one run of a job whose Biller call
// returned err, as [decide] says, and logs and pauses the queue for a
// cancelled job. what names the job in logs; attrs describe it.
func (w *runner) finish(ctx context.Context, job *rivertype.JobRow, err error, what string, attrs ...any) error {
	act := decide(err, time.Now())
	switch act.kind {
	case complete:
		return nil
	case snooze:
		return river.JobSnooze(act.snooze)
	case retry:
		return err
	}
	attrs = append(attrs, "job_id", job.ID, "err", err)
	if !act.stop {
		w.log.Warn("billonce: "+what+" job cancelled", attrs...)
		return river.JobCancel(err)
	}
	w.log.Error("billonce: "+what+" job cancelled: no other job of its queue can succeed until this is fixed", attrs...)
	if !w.cfg.KeepQueueOnStop {
		if c, cerr := river.ClientFromContextSafely[pgx.Tx](ctx); cerr == nil {
			if perr := c.QueuePause(context.WithoutCancel(ctx), job.Queue, nil); perr != nil {
				w.log.Error("billonce: pausing the queue failed", "queue", job.Queue, "err", perr)
			} else {
				w.log.Error("billonce: queue paused; fix the cause, resume the queue and retry the cancelled jobs", "queue", job.Queue)
			}
		}
	}
	return river.JobCancel(err)
}

// kind is what River should do with a job.
type kind int

const (
	complete kind = iota + 1
	cancel
	snooze
	retry
)

func (k kind) String() string {
	return [...]string{"kind(0)", "complete", "cancel", "snooze", "retry"}[k]
}

// action is the River outcome of one run of a job.
type action struct {
	kind   kind
	snooze time.Duration // with snooze
	stop   bool          // with cancel: no other job of the queue can succeed
}

// decide maps the result of a Charge, Rebill, ReportUsage, Refund,
// Transfer or Payout to River. It is the one place where billing's
// outcomes meet River's: the errors of every kind are the same
// *billing.ChargeError kinds as a charge's.
func decide(err error, now time.Time) action {
	var (
		ce       *billing.ChargeError
		mismatch *claim.MismatchError
	)
	errors.As(err, &ce)
	switch {
	case err == nil:
		// Created, Replayed, AlreadyBilled or Reconciled: billed.
		return action{kind: complete}
	case errors.Is(err, billing.ErrDeclined):
		// A decline, a payment that failed when it settled, a usage
		// report Stripe rejected, or a refund, transfer or payout Stripe
		// refused for itself (balance_insufficient, charge_disputed).
		return action{kind: cancel}
	case billing.StopsRun(err):
		return action{kind: cancel, stop: true}
	case errors.Is(err, billing.ErrInProgress):
		var until time.Time
		if ce != nil {
			until = ce.Until
		}
		return action{kind: snooze, snooze: min(max(until.Sub(now), minSnooze), maxSnooze)}
	case errors.Is(err, billing.ErrSentElsewhere):
		// Nothing was sent; any Biller of the scope settles the claim by
		// search once Until has passed.
		var until time.Time
		if ce != nil {
			until = ce.Until
		}
		return action{kind: snooze, snooze: max(until.Sub(now), time.Minute)}
	case errors.Is(err, billing.ErrInvalid), errors.Is(err, billing.ErrKeyReused), errors.As(err, &mismatch):
		// Input or configuration a retry cannot change.
		return action{kind: cancel}
	default:
		// ErrOutcomeUnknown, ErrNotRecorded, ErrNeedsReconciliation, a
		// database or context error: the claim stays pending with its key,
		// and the retry resumes it safely.
		return action{kind: retry}
	}
}
