package billing

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"iter"
	"sync"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/lock"
)

// Defaults for [RunOptions].
const (
	DefaultConcurrency = 8
	DefaultBatchSize   = 100
)

// Upper bounds for [RunOptions]. Run refuses larger values with
// [ErrInvalid]: they are typos or overflows, not plans, and Run would
// allocate for them before billing anyone.
const (
	// maxConcurrency bounds RunOptions.Concurrency. Stripe accepts 100
	// requests per second in live mode by default (the Biller's RateLimit
	// is below that); with an answer taking a second or two, a few hundred
	// workers already wait on the rate limiter, each holding a claimed
	// customer whose lease runs meanwhile.
	maxConcurrency = 1000
	// maxBatchSize bounds RunOptions.BatchSize. A batch's claims are
	// committed before the first of them is sent and wait in memory; a
	// runner killed mid-batch leaves the unsent ones to their leases.
	// Database round trips are amortised long before this size.
	maxBatchSize = 10_000
)

// Item is one customer to bill in a [Biller.Run].
type Item struct {
	Customer string
	// Price, when not nil, is used instead of Config.Price.
	Price *Price
	// Invoice, when not nil, bills the customer by this invoice (see
	// [Biller.Invoice]) instead of a charge. When Config.Invoice is set
	// and Config.Price is not, every item without a Price is billed by
	// Config.Invoice's invoice.
	Invoice *Invoice
	// Account, when set, bills the customer on this connected account
	// (see ChargeOptions.Account); one Run bills items of any number of
	// accounts, and of the platform's own.
	Account string
	// Transfer or Payout, when not nil, makes the item a transfer to
	// connected account Account, or a payout from its balance, of that
	// amount for the period (see [Biller.Transfer], [Biller.Payout];
	// attempt 1), instead of a bill; Customer is then empty. A Run of
	// them is a payout sweep that pays each account once, however often
	// it runs.
	Transfer, Payout *Price
	// Refund, when not nil, makes the item a refund of the payment that
	// billed Customer for the period (see [Biller.Refund]) instead of a
	// bill: a Run of them is a mass refund that refunds each payment once
	// per refund id, however often it runs. Price, Invoice, Transfer and
	// Payout are then nil; Account may be left empty (the refund goes to
	// its payment's account) and, when set, must be that account.
	Refund *Refund
}

// Refund is a refund of a [Biller.Run] item: ID is the caller's name for
// it (an RMA, an outage's credit number), which with the payment makes the
// refund's identity, and Amount is what it refunds, in the smallest unit
// of the payment's currency.
type Refund struct {
	ID     string
	Amount int64
}

// Customers returns an iterator over customer IDs priced by Config.Price.
func Customers(ids ...string) iter.Seq2[Item, error] {
	return func(yield func(Item, error) bool) {
		for _, id := range ids {
			if !yield(Item{Customer: id}, nil) {
				return
			}
		}
	}
}

// RunOptions tunes a [Biller.Run]. A nil *RunOptions takes every default.
type RunOptions struct {
	// Concurrency is how many customers are charged at once. Defaults to
	// DefaultConcurrency; at most 1,000.
	Concurrency int
	// BatchSize is how many customers are claimed per database round trip.
	// Defaults to DefaultBatchSize; at most 10,000.
	BatchSize int
	// Total, if known, is reported in Progress.Total.
	Total int
	// Progress, when set, is called after each customer is settled, from one
	// goroutine at a time.
	Progress func(Progress)
	// Lock, when set, makes the run take the lock named LockName first; if
	// another runner holds it, Run returns ErrRunHeldElsewhere. Claims keep
	// the run correct without it; the lock keeps replicas from doing the
	// same work. A nil *lock.Advisory or *lock.Lease (an ignored
	// constructor error) is refused, not taken for "no lock".
	//
	// Under a *lock.Lease, whose table must then be in the claim store's
	// database, every claim the run makes checks the lease's fencing token
	// in the claim's own statement (package lock's documentation, under
	// "Fencing tokens"). A run that stalled past the lease's TTL while
	// another runner took the lease over claims nothing more once it goes
	// on, so it sends nothing it had not claimed before, and stops with an
	// error wrapping lock.ErrLockLost: customers it had claimed but not
	// sent are handed back, and the outcomes of requests it had already
	// sent are still recorded.
	Lock lock.Locker
	// LockName defaults to "billonce-run:<scope>:<period>"; the lock's own
	// rules apply (at most 200 bytes of UTF-8 without NUL bytes).
	LockName string
}

// Progress counts the customers of a run so far.
type Progress struct {
	// Total is RunOptions.Total (0 when unknown).
	Total int
	// Done is the number of customers settled, the sum of the counts below.
	Done int
	// Created: charged by this run (Outcome Created or Replayed).
	Created int
	// AlreadyBilled: charged before this run (Outcome AlreadyBilled or
	// Reconciled).
	AlreadyBilled int
	// Declined: refused definitively ([ErrDeclined]); see Summary.Failures.
	Declined int
	// Processing: the payment exists and has not settled (a bank debit);
	// never sent again, its outcome arrives by webhook or Reconcile.
	Processing int
	// DeclinedAfterProcessing: the payment was processing and failed when
	// it settled ([ErrDeclined] with ChargeError.AfterProcessing), apart
	// from card declines (Declined). Never billed again without a Rebill.
	DeclinedAfterProcessing int
	// Pending: outcome unknown, claimed by another runner, or waiting for
	// reconciliation; the next run settles them with the same keys.
	Pending int
	// Invalid: bad input for this customer ([ErrInvalid]), or input that
	// contradicts its existing claim (a changed amount); nothing was
	// claimed or sent.
	Invalid int
}

// Summary is the result of a [Biller.Run].
type Summary struct {
	Progress
	Period  string
	Elapsed time.Duration
	// Failures holds the error of every customer that was not billed
	// (Declined, DeclinedAfterProcessing, Pending or Invalid), up to 1,000
	// of them.
	Failures []error
}

const maxFailures = 1000

// Complete reports whether every customer of the run is billed or was
// already billed. A processing payment counts as billed: nothing more is
// sent for it, whatever its outcome.
func (s Summary) Complete() bool { return s.Done == s.Created+s.AlreadyBilled+s.Processing }

// Run bills every customer from items for period, each exactly once. The
// iterator is read as the run goes (it never has to fit in memory); customers
// are claimed in batches, then charged with bounded concurrency and the
// Biller's rate limit.
//
// Two Runs of the same period at once, on one replica or many, charge nobody
// twice: the claims decide. Run again after a crash or a stop and it finishes
// the job: customers already billed are skipped, pending ones are resumed
// with their keys.
//
// Each customer should appear once in items. A repeat within one claim batch
// is reported as invalid; a repeat further on finds the first one's claim.
// Either way the customer is charged once.
//
// A decline or a bad item does not stop the run; it is counted and listed in
// Summary.Failures. Run stops early, returning an error that wraps the
// cause, on an answer that will not get better (a spend-cap
// proxy's refusal such as spendcap.ErrSpendCapReached, ErrStripeAuth,
// ErrStripeRequest), when Stripe does not answer at all
// (ErrStripeUnreachable, see Config.UnreachableAttempts), when ctx is
// done, or when items yields an error.
// Customers this run claimed but never got executed at Stripe are
// abandoned, to be claimed afresh by the next run; claims it resumed stay
// pending, to be resumed with the same keys. Once ctx is done, the charges
// Stripe made are still recorded, for up to two seconds more, as with
// [Biller.Charge]; a record given up leaves its claim pending with its key,
// counted as Pending with an [ErrNotRecorded], and Run returns.
//
// A panic in Config.Price or in items stops the run as ctx being done
// would, and then goes on, unchanged, in the caller's goroutine (as
// net/http and job runners expect, to recover it): by then the claims the
// run had made but not sent are handed back, the charges under way are
// recorded, and none of the run's goroutines is left.
//
// Each Run that returns is reported to Config.Observe as one [EventRun].
func (b *Biller) Run(ctx context.Context, period string, items iter.Seq2[Item, error], opts *RunOptions) (Summary, error) {
	bad := checkPeriod(period)
	if bad == nil && items == nil {
		bad = invalid("Run needs an iterator of customers (billing.Customers for a fixed list)")
	}
	return b.runReported(ctx, period, "billonce-run:"+b.cfg.Scope+":"+period, b.itemJobs(period, items), bad, opts)
}

// runReported is the body of Run and RunUsage: unless bad (what is wrong
// with their arguments) is set, it checks opts and runs preps under the
// lock of opts.LockName (lockName by default), then reports the run to
// Config.Observe. label names the run in its summary, errors and event.
func (b *Biller) runReported(ctx context.Context, label, lockName string, preps iter.Seq2[prepareFunc, error], bad error, opts *RunOptions) (Summary, error) {
	start := time.Now()
	var sum Summary
	err := bad
	if err == nil {
		sum, err = b.runLocked(ctx, label, lockName, preps, opts)
	}
	if sum.Period == "" {
		sum.Period = label
	}
	reported := sum
	b.observe(Event{Kind: EventRun, Period: label, Duration: time.Since(start), Err: err, Summary: &reported})
	return sum, err
}

// runLocked checks opts and runs preps under the run's lock.
func (b *Biller) runLocked(ctx context.Context, label, lockName string, preps iter.Seq2[prepareFunc, error], opts *RunOptions) (Summary, error) {
	var o RunOptions
	if opts != nil {
		o = *opts
	}
	if err := o.check(); err != nil {
		return Summary{}, err
	}
	return locked(ctx, o.Lock, cmp.Or(o.LockName, lockName), func(ctx context.Context) (Summary, error) {
		return b.run(ctx, label, preps, &o, fenceOf(ctx, o.Lock))
	})
}

// fenceOf is the fence of the claims of a run under guard, whose job's
// context is ctx: a Lease's token, checked against its row. Other locks
// have no row in the claim store's database to check a token against.
func fenceOf(ctx context.Context, guard lock.Locker) claimengine.Fence {
	lease, isLease := guard.(*lock.Lease)
	token, ok := lock.Token(ctx)
	if !isLease || !ok {
		return claimengine.Fence{}
	}
	return claimengine.Fence{Table: lease.Table(), Token: token}
}

// Validate reports whether Run and RunUsage accept o: they check it
// themselves, after nothing but their arguments. Call it to refuse a
// command line's settings before anything is opened. Its errors wrap
// [ErrInvalid].
func (o RunOptions) Validate() error { return o.check() }

// check checks o and sets its defaults.
func (o *RunOptions) check() error {
	switch {
	case o.Concurrency < 0 || o.BatchSize < 0 || o.Total < 0:
		return invalid("RunOptions: Concurrency, BatchSize and Total must not be negative")
	case o.Concurrency > maxConcurrency:
		return invalid("RunOptions.Concurrency %d is above the limit of %d", o.Concurrency, maxConcurrency)
	case o.BatchSize > maxBatchSize:
		return invalid("RunOptions.BatchSize %d is above the limit of %d", o.BatchSize, maxBatchSize)
	case o.Lock != nil && nilness.Is(o.Lock):
		return invalid("RunOptions.Lock is a nil %T: check the error of the constructor (lock.NewAdvisory), or leave Lock nil to run without a lock", o.Lock)
	}
	o.Concurrency = cmp.Or(o.Concurrency, DefaultConcurrency)
	o.BatchSize = cmp.Or(o.BatchSize, DefaultBatchSize)
	return nil
}

// locked runs fn under guard's lock name, or without a lock when guard is
// nil. It returns [ErrRunHeldElsewhere] when another runner holds the lock.
func locked(ctx context.Context, guard lock.Locker, name string, fn func(context.Context) (Summary, error)) (Summary, error) {
	if guard == nil {
		return fn(ctx)
	}
	var (
		sum    Summary
		runErr error
	)
	ran, err := lock.Do(ctx, guard, name, func(ctx context.Context) error {
		sum, runErr = fn(ctx)
		return runErr
	})
	if err != nil && runErr == nil && !ran && errors.Is(err, lock.ErrInvalid) {
		// The lock refused its name or configuration: nothing ran.
		return Summary{}, invalid("run lock %q: %w", clip(name), err)
	}
	if err != nil && runErr == nil {
		// The lock itself failed or was lost.
		return sum, fmt.Errorf("billing: run lock %q: %w", name, err)
	}
	if !ran {
		return Summary{}, ErrRunHeldElsewhere
	}
	return sum, runErr
}

// task is one claimed customer waiting to be sent.
type task struct {
	j   job
	res claimResult
}

type runner struct {
	b       *Biller
	o       *RunOptions
	start   time.Time
	mu      sync.Mutex
	sum     Summary
	stopErr error
	cancel  context.CancelFunc
	caller  context.Context   // the context Run was given, before the stop's cancel
	fence   claimengine.Fence // of every claim the run makes
	tasks   chan task         // the workers' queue
	// sending holds, by key, the claims handed to the workers and not
	// yet settled (under mu); following counts the tasks held in them
	// until they are back in the queue.
	sending   map[string]*sending
	following sync.WaitGroup
}

// sending is a claim of the run on its way to a worker, or being sent,
// and the tasks that follow it (see kind.follows): they wait here, holding
// no worker, until it is settled, and then go back to the queue.
type sending struct {
	owner string // the job's: another job of the same key releases nothing
	next  []task
}

// prepareFunc prepares one entry of a run: it checks it and derives its job.
// Its errors are *ChargeError.
type prepareFunc func(ctx context.Context) (job, error)

// itemJobs is the preparation of each item of a Run for period.
func (b *Biller) itemJobs(period string, items iter.Seq2[Item, error]) iter.Seq2[prepareFunc, error] {
	return func(yield func(prepareFunc, error) bool) {
		for it, err := range items {
			p := func(ctx context.Context) (job, error) { return b.prepareItem(ctx, period, it) }
			if !yield(p, err) {
				return
			}
		}
	}
}

// prepareItem checks it and derives its job for period: a bill, a
// refund, a transfer or a payout. Its errors are *ChargeError.
func (b *Biller) prepareItem(ctx context.Context, period string, it Item) (job, error) {
	if err := it.mixed(); err != nil {
		j := job{account: it.Account, customer: cmp.Or(it.Customer, it.Account), period: period, attempt: 1}
		return j, chargeErr(j, nil, "", err)
	}
	switch {
	case it.Transfer != nil:
		return b.prepareMoneyOut(moneyOut{}, it.Account, period, *it.Transfer, 1)
	case it.Payout != nil:
		return b.prepareMoneyOut(moneyOut{payout: true}, it.Account, period, *it.Payout, 1)
	case it.Refund != nil:
		j, err := b.prepareRefund(ctx, it.Customer, period, it.Refund.ID, it.Refund.Amount)
		if err == nil && it.Account != "" && it.Account != j.account {
			err = chargeErr(j, nil, "", invalid("the item names account %s, and the payment it refunds was made on %s: a refund goes to its payment's account; leave Account empty or name that one",
				it.Account, cmp.Or(j.account, "the platform's own")))
		}
		return j, err
	case it.Invoice != nil || it.Price == nil && b.cfg.Invoice != nil && b.cfg.Price == nil:
		return b.prepareInvoice(ctx, it.Account, it.Customer, period, it.Invoice)
	}
	return b.prepare(ctx, it.Account, it.Customer, period, it.Price, 1)
}

// run bills what items prepares, claiming under fence; period names the
// run in its summary, errors and log lines.
func (b *Biller) run(ctx context.Context, period string, items iter.Seq2[prepareFunc, error], o *RunOptions, fence claimengine.Fence) (Summary, error) {
	r := &runner{b: b, o: o, start: time.Now(), fence: fence}
	r.sum.Period, r.sum.Total = period, o.Total
	parent := ctx
	ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	r.caller = parent

	// Claims wait for a worker in a short queue: the fewer claims held
	// ahead of sending, the fewer a killed runner leaves for its lease to
	// release.
	tasks := make(chan task, o.Concurrency)
	r.tasks, r.sending = tasks, make(map[string]*sending)
	rec := r.newRecorder()
	var wg sync.WaitGroup
	for range o.Concurrency {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for t := range tasks {
				if ctx.Err() != nil {
					r.unsent(ctx, t)
					continue
				}
				t.j.rec, t.j.caller = rec, parent
				rc, err := b.settle(ctx, t.j, t.res)
				if err != errRecording { // else the recorder settles it
					r.settled(t.j, rc, err)
				}
			}
		}()
	}

	// A panic while feeding (Config.Price, the items iterator) goes on to
	// the caller, once the run has stopped: the feeder has handed back what
	// it claimed, and the workers and the recorder have ended. Either way
	// the queue closes once every task held for a claim it follows (see
	// runner.hold) is back in it.
	fed := false
	defer func() {
		if !fed {
			r.following.Wait()
			close(tasks)
			wg.Wait()
			if rec != nil {
				rec.close()
			}
		}
	}()
	srcErr := r.feed(ctx, period, items)
	fed = true
	r.following.Wait()
	close(tasks)
	wg.Wait()
	if rec != nil {
		rec.close()
	}

	r.sum.Elapsed = time.Since(r.start)
	switch {
	case r.stopErr != nil:
		return r.sum, fmt.Errorf("billing: run for %s stopped after %d customers: %w", period, r.sum.Done, r.stopErr)
	case srcErr != nil:
		return r.sum, srcErr
	case parent.Err() != nil:
		// Everything was claimed before ctx was done, but not all was sent.
		return r.sum, fmt.Errorf("billing: run for %s stopped: %w", period, context.Cause(parent))
	}
	return r.sum, nil
}

// claimed is one batch's claim, made in the background.
type batchClaim struct {
	batch   []job
	results []claimResult
	err     error
	at      time.Time // just before the claim statement left
	done    chan struct{}
}

// A feeder reads a run's items, claims them in batches and queues what
// must be sent. The next batch is claimed while the previous one is handed
// out, so that workers do not wait for the round trip; one claim is under
// way at a time.
type feeder struct {
	r        *runner
	period   string
	batch    []job
	inBatch  map[string]bool // a batch claims each customer and period once
	inflight *batchClaim
}

// feed reads items into the queue with a feeder.
func (r *runner) feed(ctx context.Context, period string, items iter.Seq2[prepareFunc, error]) error {
	f := &feeder{r: r, period: period,
		batch: make([]job, 0, r.o.BatchSize), inBatch: make(map[string]bool, r.o.BatchSize)}
	fed := false
	defer func() {
		if !fed {
			// A panic: stop the run, and hand back the claim under way
			// (its customers are abandoned or released, not left to
			// their leases).
			r.cancel()
			_ = f.finish(ctx, nil)
		}
	}()
	err := f.read(ctx, items)
	fed = true
	return err
}

// read claims and queues the customers of items.
func (f *feeder) read(ctx context.Context, items iter.Seq2[prepareFunc, error]) error {
	r, period := f.r, f.period
	for prepare, err := range items {
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			if ferr := f.finish(ctx, nil); ferr != nil {
				return ferr
			}
			return fmt.Errorf("billing: reading customers for %s: %w", period, err)
		}
		j, err := prepare(ctx)
		if err != nil {
			r.settled(j, Receipt{}, err)
			continue
		}
		once := j.customer + "\x00" + j.period
		if f.inBatch[once] {
			r.settled(j, Receipt{}, chargeErr(j, nil, "", invalid("listed more than once for %s; it is billed once", j.period)))
			continue
		}
		f.inBatch[once] = true
		f.batch = append(f.batch, j)
		if len(f.batch) == cap(f.batch) {
			if err := f.flush(ctx); err != nil {
				return f.finish(ctx, err)
			}
		}
	}
	if err := f.finish(ctx, nil); err != nil {
		return err
	}
	r.mu.Lock()
	stopped := r.stopErr != nil
	r.mu.Unlock()
	if ctx.Err() != nil && !stopped {
		return fmt.Errorf("billing: run for %s stopped: %w", period, context.Cause(ctx))
	}
	return nil
}

// handOut waits for the claim under way and queues its customers.
func (f *feeder) handOut(ctx context.Context) error {
	c := f.inflight
	if c == nil {
		return nil
	}
	f.inflight = nil
	<-c.done
	if len(c.results) != len(c.batch) {
		err := c.err
		if err == nil {
			err = fmt.Errorf("%d results for %d requests", len(c.results), len(c.batch))
		}
		if errors.Is(err, claimengine.ErrFenced) {
			// Another runner took the run's lease: claim nothing more,
			// and hand back what was claimed and not sent.
			f.r.stop(fmt.Errorf("%w: %w", lock.ErrLockLost, err))
		}
		return fmt.Errorf("billing: claiming a batch of %d customers for %s: %w", len(c.batch), f.period, err)
	}
	// c.err joins the mismatches, which the results carry one by one.
	r := f.r
	for i, res := range c.results {
		j := c.batch[i]
		switch res.Outcome {
		case claimengine.Mismatch:
			if rc, ok := r.b.paidBy(j, res.Claim); ok {
				r.settled(j, rc, nil)
				continue
			}
			r.settled(j, Receipt{}, chargeErr(j, nil, "nothing sent", res.Conflict))
		case claimengine.Won, claimengine.Resumed:
			j.claimedAt = c.at
			r.queue(ctx, task{j, res})
		default:
			j.caller = r.caller
			rc, err := r.b.settle(ctx, j, res)
			r.settled(j, rc, err)
		}
	}
	return nil
}

// flush claims the batch once the claim under way is done, then hands
// that one out while this one is claimed.
func (f *feeder) flush(ctx context.Context) error {
	if len(f.batch) == 0 {
		return f.handOut(ctx)
	}
	if ctx.Err() != nil {
		// Stopped: claim nothing more.
		f.batch = f.batch[:0]
		clear(f.inBatch)
		return f.handOut(ctx)
	}
	prev := f.inflight
	if prev != nil {
		<-prev.done
	}
	c := &batchClaim{batch: f.batch, done: make(chan struct{})}
	reqs := make([]claimengine.Request, len(f.batch))
	for i, j := range f.batch {
		reqs[i] = f.r.b.request(j)
		reqs[i].Fence = f.r.fence
	}
	claims := f.r.b.claims
	go func() {
		defer close(c.done)
		c.at = time.Now()
		// A claim under way when the run stops finishes, so that its
		// customers are handed back (abandoned or released) rather than
		// left to their leases.
		c.results, c.err = claims.ClaimBatch(context.WithoutCancel(ctx), reqs)
	}()
	f.batch = make([]job, 0, f.r.o.BatchSize)
	clear(f.inBatch)
	f.inflight = prev
	err := f.handOut(ctx)
	f.inflight = c
	return err
}

// finish hands out everything claimed, even after an error.
func (f *feeder) finish(ctx context.Context, err error) error {
	return errors.Join(err, f.flush(ctx), f.handOut(ctx))
}

// queue hands t to the workers or, when t follows a claim of the run
// that is not settled yet, holds it until that claim is (see hold).
func (r *runner) queue(ctx context.Context, t task) {
	if r.hold(t) {
		return
	}
	select {
	case r.tasks <- t:
	case <-ctx.Done():
		r.unsent(ctx, t)
	}
}

// hold marks t's claim as on its way, for the tasks that follow it, and
// holds t itself when the claim it follows (see kind.follows) is on its
// way too, as long as that one is not settled: it reports whether it
// did. So two claims of which one follows the other are never sent at
// once, and a Run that is given them in order sends both. Once the claim
// t follows is settled, t goes back to the queue, whatever the outcome:
// its kind's ready checks that claim again before anything is sent, and
// a stopped run hands t back unsent. Only a claim queued before t is
// followed, so that the claims held tasks wait for form chains, each
// ending in one queued, being sent or being recorded, which waits for no
// other: every held task gets back to the queue.
func (r *runner) hold(t task) bool {
	after, err := t.j.kind.follows(r.b) // an error: ready refuses t
	r.mu.Lock()
	defer r.mu.Unlock()
	if key := t.j.key.String(); r.sending[key] == nil {
		r.sending[key] = &sending{owner: t.j.owner}
	}
	if err != nil || after.IsZero() {
		return false
	}
	s := r.sending[after.String()]
	if s == nil {
		return false
	}
	s.next = append(s.next, t)
	r.following.Add(1)
	return true
}

// requeue puts t, held until the claim it follows was settled, back in
// the queue; the queue is open until every held task is back.
func (r *runner) requeue(t task) {
	defer r.following.Done()
	r.tasks <- t
}

// unsent leaves a claimed customer that the stopped run never sent to the
// next run: the claim stays pending with its key and its lease ends now.
func (r *runner) unsent(ctx context.Context, t task) {
	j := t.j
	j.won = t.res.Outcome == claimengine.Won
	cause := fmt.Errorf("run stopped before sending; nothing was sent: %w", context.Cause(ctx))
	r.b.giveUp(context.WithoutCancel(ctx), j, cause)
	err := chargeErr(j, ErrOutcomeUnknown, "", cause)
	r.b.outcome(j, time.Now(), Receipt{}, err)
	r.settled(j, Receipt{}, err)
}

// stop stops the run with err, unless it was stopped already.
func (r *runner) stop(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopErr == nil {
		r.stopErr = err
		r.cancel()
		r.b.log.Error("billonce: stopping the run", "done", r.sum.Done,
			"elapsed", time.Since(r.start).Round(time.Millisecond).String(), "error", err)
	}
}

// settled counts one customer's outcome and stops the run on a stopping
// answer.
func (r *runner) settled(j job, rc Receipt, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := &r.sum
	var (
		mismatch *claim.MismatchError
		ce       *ChargeError
	)
	switch {
	case err == nil && rc.Processing:
		s.Processing++
	case err == nil && (rc.Outcome == Created || rc.Outcome == Replayed):
		s.Created++
	case err == nil:
		s.AlreadyBilled++
	case errors.Is(err, ErrInvalid), errors.As(err, &mismatch):
		s.Invalid++
	case errors.As(err, &ce) && errors.Is(err, ErrDeclined) && ce.AfterProcessing:
		s.DeclinedAfterProcessing++
	case errors.Is(err, ErrDeclined):
		s.Declined++
	default:
		s.Pending++
	}
	s.Done++
	if err != nil {
		if len(s.Failures) < maxFailures {
			s.Failures = append(s.Failures, err)
		}
		if StopsRun(err) && r.stopErr == nil {
			r.stopErr = err
			r.cancel()
			r.b.log.Error("billonce: stopping the run", "period", j.period, "customer", j.customer,
				"done", r.sum.Done, "elapsed", time.Since(r.start).Round(time.Millisecond).String(), "error", err)
		}
	}
	if r.o.Progress != nil {
		p := s.Progress
		r.o.Progress(p)
	}
	// The tasks that follow j go back to the queue, from goroutines of
	// their own, since a worker or the recorder settles j, and neither may
	// wait for the queue.
	if key := j.key.String(); r.sending[key] != nil && r.sending[key].owner == j.owner {
		for _, t := range r.sending[key].next {
			go r.requeue(t)
		}
		delete(r.sending, key)
	}
}
