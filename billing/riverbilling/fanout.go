package riverbilling

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/internal/nilness"
)

// Defaults for [FanOutConfig].
const (
	// DefaultFanOutBatch is how many customers one charge job bills: a
	// claim batch of [billing.Biller.Run].
	DefaultFanOutBatch = billing.DefaultBatchSize
	// DefaultFanOutTimeout bounds one run of a fan-out job. It is also how
	// long River's rescuer leaves the job of a killed machine alone before
	// retrying it. A run cut short loses nothing: its transactions are
	// committed, and the retry skips the jobs still waiting or running as
	// duplicates and goes on.
	DefaultFanOutTimeout = 5 * time.Minute
	// maxFanOutBatch bounds FanOutConfig.BatchSize: a job of at most this
	// many customers (see maxJobCustomers).
	maxFanOutBatch = maxJobCustomers
	// fanOutTx is how many customers' jobs one transaction inserts, in one
	// InsertMany.
	fanOutTx = 1000
)

// maxFanOutErrors bounds FanOutResult.Errors.
const maxFanOutErrors = 100

// DB is the database riverbilling reads and inserts jobs through: a
// *pgxpool.Pool, a *pgx.Conn, or a pgx.Tx (a fan-out's batches are then
// savepoints of the caller's transaction).
type DB interface {
	Begin(ctx context.Context) (pgx.Tx, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
}

// FanOutResult counts what a fan-out did, in customers.
type FanOutResult struct {
	Period string `json:"period"`
	// Customers is how many items the iterator yielded.
	Customers int `json:"customers"`
	// Inserted is how many customers are in the charge jobs inserted.
	Inserted int `json:"inserted"`
	// Duplicates is how many were skipped because their job already
	// exists (see [ChargeArgs]), or the customer came twice from the
	// iterator.
	Duplicates int `json:"duplicates"`
	// Invalid is how many items were skipped as unusable; Errors says why,
	// for the first hundred.
	Invalid int      `json:"invalid"`
	Errors  []string `json:"errors,omitempty"`
}

// FanOut inserts [ChargeArgs] jobs for the customers of items for period:
// one job for each batchSize customers billed by charge (0 means
// DefaultFanOutBatch; 1, one job per customer), one job for each customer
// billed by invoice. The jobs of about a thousand customers are one
// transaction of db, with ins.InsertManyTx. items is the iterator
// [billing.Biller.Run] takes; it is read as the fan-out goes, so no more
// than a transaction's customers are ever held in memory.
//
// Jobs are unique by their arguments (see [ChargeArgs]), so a second
// fan-out of the same period, with the customers in the same order,
// inserts nothing new while the first one's jobs wait or run; nor, for
// jobs of one customer, while they are kept in River's table, declined
// ones included: each customer skipped is counted in Duplicates. Jobs of
// several customers that are final, and jobs of one customer discarded
// after their last retry, are inserted again; so are jobs River has
// cleaned away (CompletedJobRetentionPeriod and
// CancelledJobRetentionPeriod, 24 h by default). That costs a look at
// their claims, not a charge: each customer billed is found billed (a job
// completes without calling Stripe), each declined one declined again (its
// job is cancelled again), and each claim left pending, by a job discarded
// or cancelled, is resumed with its key (or settled by search past the
// key's deadline).
//
// An item's Account is its job's ([ChargeArgs].Account): a job of several
// customers holds items of one account, so that each customer is billed
// on its own, and a customer on two accounts is two customers. An invoice
// item on an account is refused, as an invoice job on one is.
//
// Items with a Price are refused (counted in Invalid): a job carries
// identity only, and the Biller's Config.Price prices it when it runs.
// So are refund, transfer and payout items: a fan-out makes charge jobs;
// insert a [MoneyOutArgs] job for each of those.
// An item whose Invoice is &billing.Invoice{} (empty) makes an invoice job
// ([ChargeArgs].Invoice): the Biller's Config.Invoice makes that invoice
// when the job runs; an item with an invoice of its own is refused. An
// error from items stops the fan-out after the transactions already
// committed; running it again continues where it stopped.
func FanOut(ctx context.Context, ins *river.Client[pgx.Tx], db DB, period string, items iter.Seq2[billing.Item, error], batchSize int) (FanOutResult, error) {
	res := FanOutResult{Period: period}
	switch {
	case nilness.Is(ins) || nilness.Is(db):
		return res, fmt.Errorf("%w: FanOut needs a River client and a pool to insert with", billing.ErrInvalid)
	case items == nil:
		return res, fmt.Errorf("%w: FanOut needs an iterator of customers (billing.Customers for a fixed list)", billing.ErrInvalid)
	case batchSize < 0 || batchSize > maxFanOutBatch:
		return res, fmt.Errorf("%w: fan-out batch size %d (customers per charge job) must be between 1 and %d (0 means %d)", billing.ErrInvalid, batchSize, maxFanOutBatch, DefaultFanOutBatch)
	}
	if err := billing.ValidatePeriod(period); err != nil {
		return res, err
	}
	if batchSize == 0 {
		batchSize = DefaultFanOutBatch
	}
	var (
		jobs    []river.InsertManyParams                // of the transaction
		sizes   []int                                   // customers in each of jobs
		pending int                                     // customers in jobs
		many    []string                                // the customers of the next job of several
		account string                                  // their account
		seen    = make(map[billing.Item]bool, fanOutTx) // by customer and account
	)
	add := func(a ChargeArgs, n int) {
		jobs, sizes, pending = append(jobs, river.InsertManyParams{Args: a}), append(sizes, n), pending+n
	}
	// closeJob makes a job of the customers gathered.
	closeJob := func() {
		switch len(many) {
		case 0:
			return
		case 1:
			add(ChargeArgs{Customer: many[0], Period: period, Account: account}, 1)
		default:
			add(ChargeArgs{Customers: many, Period: period, Account: account}, len(many))
		}
		many = make([]string, 0, batchSize)
	}
	// flush inserts the jobs made so far; the customers gathered for the
	// next job wait for the next transaction, unless this is the last.
	flush := func(last bool) error {
		if last {
			closeJob()
		}
		if len(jobs) == 0 {
			return nil
		}
		skipped, err := insertBatch(ctx, ins, db, jobs)
		if err != nil {
			return fmt.Errorf("riverbilling: fan-out of period %s after %d customers: %w", period, res.Customers, err)
		}
		for i, n := range sizes {
			if skipped[i] {
				res.Duplicates += n
			} else {
				res.Inserted += n
			}
		}
		jobs, sizes, pending = jobs[:0], sizes[:0], 0
		clear(seen)
		for _, c := range many {
			seen[billing.Item{Customer: c, Account: account}] = true
		}
		return nil
	}
	for it, err := range items {
		if err != nil {
			if ferr := flush(true); ferr != nil {
				return res, errors.Join(ferr, err)
			}
			return res, fmt.Errorf("riverbilling: reading the customers of period %s after %d: %w", period, res.Customers, err)
		}
		res.Customers++
		switch {
		case it.Refund != nil || it.Transfer != nil || it.Payout != nil:
			res.invalid("item %d: a refund, transfer or payout item cannot be fanned out: a fan-out makes charge jobs; insert a MoneyOutArgs job for it", res.Customers)
			continue
		case billing.Item{Customer: it.Customer, Account: it.Account}.Validate(billing.Charges) != nil:
			// The customer ID and account alone: a Price is refused below.
			res.invalid("item %d: %v", res.Customers, billing.Item{Customer: it.Customer, Account: it.Account}.Validate(billing.Charges))
			continue
		case it.Price != nil:
			res.invalid("customer %s: an item with its own Price cannot be fanned out: jobs carry identity only; price it with the Biller's Config.Price", it.Customer)
			continue
		case it.Invoice != nil && !emptyInvoice(*it.Invoice):
			res.invalid("customer %s: an item's own invoice cannot be fanned out: jobs carry identity only; the Biller's Config.Invoice makes the invoice when the job runs (give Invoice: &billing.Invoice{} to bill by invoice)", it.Customer)
			continue
		case it.Invoice != nil && it.Account != "":
			res.invalid("customer %s: an invoice item on account %s cannot be fanned out: invoice jobs bill on the platform's own account", it.Customer, it.Account)
			continue
		case seen[billing.Item{Customer: it.Customer, Account: it.Account}]:
			res.Duplicates++
			continue
		}
		seen[billing.Item{Customer: it.Customer, Account: it.Account}] = true
		if it.Invoice != nil {
			add(ChargeArgs{Customer: it.Customer, Period: period, Invoice: true}, 1)
			continue
		}
		if it.Account != account {
			// A job of several bills on one account.
			closeJob()
			account = it.Account
		}
		if many = append(many, it.Customer); len(many) == batchSize {
			closeJob()
		}
		if pending >= fanOutTx {
			if err := flush(false); err != nil {
				return res, err
			}
		}
	}
	return res, flush(true)
}

// emptyInvoice reports whether inv is the empty invoice that marks a fan-out
// item to be billed by Config.Invoice's invoice.
func emptyInvoice(inv billing.Invoice) bool {
	return inv.Currency == "" && len(inv.Lines) == 0 && inv.DaysUntilDue == 0 && inv.Description == ""
}

func (r *FanOutResult) invalid(format string, args ...any) {
	r.Invalid++
	if len(r.Errors) < maxFanOutErrors {
		r.Errors = append(r.Errors, fmt.Sprintf(format, args...))
	}
}

// insertBatch inserts jobs in one transaction and reports which of them
// were skipped as duplicates.
func insertBatch(ctx context.Context, ins *river.Client[pgx.Tx], db DB, jobs []river.InsertManyParams) ([]bool, error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return nil, err
	}
	defer tx.Rollback(context.WithoutCancel(ctx)) //nolint:errcheck // after Commit it is a no-op
	out, err := ins.InsertManyTx(ctx, tx, jobs)
	if err != nil {
		return nil, err
	}
	if err := tx.Commit(ctx); err != nil {
		return nil, err
	}
	if len(out) != len(jobs) {
		return nil, fmt.Errorf("riverbilling: River answered %d inserts for %d jobs", len(out), len(jobs))
	}
	skipped := make([]bool, len(out))
	for i, r := range out {
		skipped[i] = r.UniqueSkippedAsDuplicate
	}
	return skipped, nil
}

// FanOutConfig configures a [FanOutWorker].
type FanOutConfig struct {
	// DB begins the transactions batches are inserted in: the pool the
	// River client uses. Required.
	DB DB
	// Customers returns the customers of a period, the iterator
	// [billing.Biller.Run] takes; an item whose Invoice is
	// &billing.Invoice{} makes an invoice job (see [FanOut]). Required.
	Customers func(ctx context.Context, period string) iter.Seq2[billing.Item, error]
	// BatchSize is how many customers one charge job bills (in one
	// [billing.Biller.Run]; see [Worker]). Defaults to DefaultFanOutBatch;
	// 1 makes a job of each customer; at most 1,000.
	BatchSize int
	// Timeout bounds one run, and is how long a fan-out job of a killed
	// machine waits for River's rescuer. Defaults to DefaultFanOutTimeout.
	Timeout time.Duration
	// Logger receives each fan-out's figures. Nil discards.
	Logger *slog.Logger
}

// FanOutWorker is the River worker of [FanOutArgs]: it runs [FanOut] for
// the job's period and records the [FanOutResult] as the job's output
// (shown by River UI). Run it periodically with [PeriodicFanOut]: River's
// leader inserts the job on one machine only.
type FanOutWorker struct {
	river.WorkerDefaults[FanOutArgs]
	cfg FanOutConfig
	log *slog.Logger
}

// NewFanOutWorker checks cfg and returns a FanOutWorker.
func NewFanOutWorker(cfg FanOutConfig) (*FanOutWorker, error) {
	switch {
	case nilness.Is(cfg.DB):
		return nil, fmt.Errorf("%w: FanOutConfig.DB is nil: pass the pool of the River client", billing.ErrInvalid)
	case cfg.Customers == nil:
		return nil, fmt.Errorf("%w: FanOutConfig.Customers is nil: pass the function that lists a period's customers", billing.ErrInvalid)
	case cfg.BatchSize < 0 || cfg.BatchSize > maxFanOutBatch:
		return nil, fmt.Errorf("%w: FanOutConfig.BatchSize %d (customers per charge job) must be between 0 (the default, %d) and %d", billing.ErrInvalid, cfg.BatchSize, DefaultFanOutBatch, maxFanOutBatch)
	case cfg.Timeout < 0:
		return nil, fmt.Errorf("%w: FanOutConfig.Timeout must not be negative", billing.ErrInvalid)
	case cfg.Logger != nil && nilness.Is(cfg.Logger.Handler()):
		return nil, fmt.Errorf("%w: FanOutConfig.Logger has no handler", billing.ErrInvalid)
	}
	if cfg.Timeout == 0 {
		cfg.Timeout = DefaultFanOutTimeout
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &FanOutWorker{cfg: cfg, log: log}, nil
}

// Timeout is FanOutConfig.Timeout.
func (w *FanOutWorker) Timeout(*river.Job[FanOutArgs]) time.Duration { return w.cfg.Timeout }

// Work fans out the job's period.
func (w *FanOutWorker) Work(ctx context.Context, job *river.Job[FanOutArgs]) error {
	client, err := river.ClientFromContextSafely[pgx.Tx](ctx)
	if err != nil {
		return river.JobCancel(fmt.Errorf("riverbilling: the fan-out runs on a River client with the pgx driver: %w", err))
	}
	period := job.Args.Period
	if err := billing.ValidatePeriod(period); err != nil {
		return river.JobCancel(err)
	}
	res, err := FanOut(ctx, client, w.cfg.DB, period, w.cfg.Customers(ctx, period), w.cfg.BatchSize)
	w.log.Info("billonce: fan-out", "period", period, "customers", res.Customers, "inserted", res.Inserted,
		"duplicates", res.Duplicates, "invalid", res.Invalid, "err", err)
	if rerr := river.RecordOutput(ctx, res); rerr != nil && err == nil {
		err = rerr
	}
	return err
}

// PeriodicFanOut returns a periodic job that fans out period(t) at each
// time t of schedule, for river.Config.PeriodicJobs. River's elected leader
// inserts it, so it runs on one machine however many run the client; it is
// unique per period, so a period's fan-out is inserted once while its job
// is kept.
//
//	river.PeriodicJobs: []*river.PeriodicJob{
//		riverbilling.PeriodicFanOut(river.PeriodicInterval(time.Hour),
//			func(t time.Time) string { return t.UTC().Format("2006-01") }, nil),
//	}
func PeriodicFanOut(schedule river.PeriodicSchedule, period func(time.Time) string, opts *river.PeriodicJobOpts) *river.PeriodicJob {
	return river.NewPeriodicJob(schedule, func() (river.JobArgs, *river.InsertOpts) {
		return FanOutArgs{Period: period(time.Now())}, nil
	}, opts)
}
