package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"sync"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/stripe/stripe-go/v79"
)

// abandon deletes the claim held, whose key never executed at Stripe.
func (b *Biller) abandon(ctx context.Context, j job) {
	if err := b.claims.Abandon(context.WithoutCancel(ctx), j.key.String(), j.owner); err != nil {
		b.log.LogAttrs(ctx, slogWarn, "billonce: could not abandon an unsent claim; it is resumed once its lease expires", attrs(j, "error", err)...)
	}
}

// underWay tells a call that meets c, another attempt of its period being
// sent (or left pending with an unknown outcome), which holds the period's
// one live claim, to wait: that attempt's outcome decides whether this one
// may bill, so it is an ErrInProgress, not a refusal. It returns nil for
// any other claim.
func (b *Biller) underWay(j job, c claim.Claim) *ChargeError {
	if c.State != claim.StatePending || c.Key == j.key.String() || c.Scope != b.cfg.Scope ||
		c.Customer != j.customer || c.Period != j.period || c.Account != j.account {
		return nil
	}
	if c.Owner != "" && time.Now().Before(c.LeaseUntil) {
		e := chargeErr(j, ErrInProgress, fmt.Sprintf("attempt %d of this period is being sent, claimed by %s until %s",
			c.Attempt, c.Owner, c.LeaseUntil.UTC().Format(time.RFC3339)), nil)
		e.Until = c.LeaseUntil
		return e
	}
	// Nobody is sending it: its outcome is unknown until Reconcile, or a
	// call for that attempt, resumes it with its key. Try again in a minute.
	how := "Reconcile or Charge"
	if c.Attempt > 1 {
		how = fmt.Sprintf("Reconcile or Rebill with attempt %d", c.Attempt)
	}
	e := chargeErr(j, ErrInProgress, fmt.Sprintf("attempt %d of this period is pending with an unknown outcome; %s settles it with its key", c.Attempt, how), nil)
	e.Until = time.Now().Add(time.Minute)
	return e
}

// paidBy answers a call that meets c, another attempt of its period and
// scope that holds the period's one live claim, succeeded or processing:
// that attempt paid the period (the call's own attempt has no claim, its
// failed claim deleted by hand), and its receipt is the answer,
// AlreadyBilled. Only a payment answers for a payment: ok is false for a
// call or a claim of another kind (an invoice of a period a charge paid
// is refused), and for any other claim.
func (b *Biller) paidBy(j job, c claim.Claim) (r Receipt, ok bool) {
	if _, out := j.kind.(moneyOut); out {
		return b.paidOutBy(j, c)
	}
	if _, pays := j.kind.(charges); !pays || c.Endpoint == endpointInvoices || c.Endpoint == endpointMeterEvents {
		return Receipt{}, false
	}
	if c.State != claim.StateSucceeded && c.State != claim.StateProcessing || c.Key == j.key.String() {
		return Receipt{}, false
	}
	paid, ok := b.attemptJob(j, c)
	if !ok {
		return Receipt{}, false
	}
	r = b.receipt(paid, c.StripeID, AlreadyBilled)
	r.Processing = c.State == claim.StateProcessing
	return r, true
}

// claimLoop claims j and settles the claim, waiting up to
// Config.InProgressWait for another runner that holds it.
func (b *Biller) claimLoop(ctx context.Context, j job, start time.Time) (Receipt, error) {
	deadline := start.Add(b.cfg.InProgressWait)
	for {
		res, err := b.claims.Claim(ctx, b.request(j))
		var r Receipt
		if err != nil {
			var m *claim.MismatchError
			var wait *ChargeError
			if errors.As(err, &m) && !inputRefused(m) {
				if r, ok := b.paidBy(j, m.Existing); ok {
					b.outcome(j, start, r, nil)
					return r, nil
				}
				wait = b.underWay(j, m.Existing)
			}
			if wait == nil {
				return Receipt{}, chargeErr(j, nil, "claiming", err)
			}
			err = wait
		} else {
			r, err = b.settleClaim(ctx, j, res)
		}
		if !errors.Is(err, ErrInProgress) || !time.Now().Before(deadline) {
			b.outcome(j, start, r, err)
			return r, err
		}
		select {
		case <-ctx.Done():
			b.outcome(j, start, r, err)
			return r, err
		case <-time.After(min(time.Until(deadline), 500*time.Millisecond)):
		}
	}
}

// settle acts on a claim result and reports the outcome to Config.Observe.
// With a recorder, a success is settled by the recorder once written, and
// settle returns errRecording.
func (b *Biller) settle(ctx context.Context, j job, res claimResult) (Receipt, error) {
	j.start = time.Now()
	r, err := b.settleClaim(ctx, j, res)
	if err != errRecording {
		b.outcome(j, j.start, r, err)
	}
	return r, err
}

// outcome reports a charge's outcome to Config.Observe.
func (b *Biller) outcome(j job, start time.Time, r Receipt, err error) {
	e := Event{Kind: EventOutcome, Object: j.object(b), Customer: j.customer, Period: j.period, Duration: time.Since(start), Err: err}
	if !j.key.IsZero() {
		e.Key = j.key.String()
	}
	var ce *ChargeError
	switch {
	case err == nil:
		e.Outcome = r.Outcome
	case errors.As(err, &ce):
		e.RequestID = ce.RequestID
	}
	b.observe(e)
}

func (b *Biller) receipt(j job, id string, o Outcome) Receipt {
	return Receipt{Customer: j.customer, Period: j.period, StripeID: id, Amount: j.price.Amount,
		Currency: j.price.Currency, Key: j.key, Attempt: j.attempt, Outcome: o}
}

// object is a Stripe object as billonce sees it: what Stripe answered to
// a write, or what a lookup found.
type object struct {
	id       string
	status   string
	replayed bool
	// customer, amount and currency are what a search found the payment
	// made for (see Biller.ownHits); empty in an answer to a write.
	customer string
	amount   int64
	currency string
	// paidBy is, for a transfer or payout found by listing, the attempt
	// of the same account and period whose key it carries when that is
	// not the claim's: it pays the period, and is never the claim's own.
	paidBy int
	// requestID is Stripe's id of the request that answered.
	requestID string
}

// outcomeUnknown reports whether err leaves open whether Stripe charged:
// anything but a definitive 4xx refusal or a run-stopping answer.
func outcomeUnknown(err error) bool {
	if StopsRun(err) {
		return false
	}
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode >= 400 && se.HTTPStatusCode < 500 &&
		se.HTTPStatusCode != 409 && se.HTTPStatusCode != 429 {
		return false
	}
	return true
}

// succeeded reports whether Stripe's answer is a money movement:
// Charges: succeeded or pending (funds on the way); PaymentIntents:
// succeeded or processing. Either way it must never be created again.
func succeeded(out object) bool {
	switch out.status {
	case "succeeded", "pending", "processing", "":
		return true
	}
	return false
}

// recordGrace is how long writing the outcome of a request Stripe may have
// executed outlasts the caller's giving up.
var recordGrace = 2 * time.Second

// recordCtx returns the context that writes the outcome of a request
// Stripe may have executed. It is not cancelled with caller, so that a
// charge that exists is recorded even when the caller gives up just after
// Stripe answered; it ends recordGrace after caller does, so that a write
// waiting on a claim row another session holds locked does not keep the
// call from returning. A write cut short leaves the claim pending with its
// key, which is safe: the next run gets Stripe's replay and records it.
func recordCtx(caller context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.WithoutCancel(caller))
	var (
		mu    sync.Mutex
		timer *time.Timer
	)
	stop := context.AfterFunc(caller, func() {
		mu.Lock()
		defer mu.Unlock()
		timer = time.AfterFunc(recordGrace, func() {
			cancel(fmt.Errorf("gave up writing the outcome %v after the caller stopped: %w", recordGrace, context.Cause(caller)))
		})
	})
	return ctx, func() {
		stop()
		mu.Lock()
		if timer != nil {
			timer.Stop()
		}
		mu.Unlock()
		cancel(nil)
	}
}

// recordErr is err, the failure of a write made with a recordCtx, with the
// reason that context ended, if it did.
func recordErr(ctx context.Context, err error) error {
	if err == nil || ctx.Err() == nil {
		return err
	}
	if cause := context.Cause(ctx); !errors.Is(err, cause) {
		return fmt.Errorf("%w (%w)", err, cause)
	}
	return err
}

// callerOf is the context whose end bounds the writes of j's outcome: the
// context a Run was given, or ctx.
func callerOf(ctx context.Context, j job) context.Context {
	if j.caller != nil {
		return j.caller
	}
	return ctx
}

// record writes a definitive Stripe answer to the claim. The writes
// outlast ctx by recordGrace at most (see recordCtx).
func (b *Biller) record(ctx context.Context, j job, out object) (Receipt, error) {
	ctx, cancel := recordCtx(callerOf(ctx, j))
	defer cancel()
	if !succeeded(out) {
		reason := "Stripe object " + out.id + " has status " + out.status
		if err := recordErr(ctx, b.claims.Fail(ctx, j.key.String(), out.id, reason)); err != nil {
			e := chargeErr(j, ErrNotRecorded, reason, err)
			e.StripeID, e.RequestID = out.id, out.requestID
			return Receipt{}, e
		}
		e := chargeErr(j, ErrDeclined, reason, nil)
		e.Code, e.RequestID = out.status, out.requestID
		return Receipt{}, e
	}
	// Record even if the caller gave up meanwhile: the charge exists.
	if processing(out) {
		if err := b.recordProcessing(ctx, j, out); err != nil {
			return Receipt{}, err
		}
		return b.recorded(ctx, j, out, nil)
	}
	return b.recorded(ctx, j, out, b.claims.Succeed(ctx, j.key.String(), out.id))
}

// processing reports whether Stripe's answer is a payment that has not
// settled yet: a pending charge or a processing PaymentIntent.
func processing(out object) bool {
	return out.status == "pending" || out.status == "processing"
}

// recorded is the receipt of a success whose recording returned err; ctx
// is the recordCtx it was written with.
func (b *Biller) recorded(ctx context.Context, j job, out object, err error) (Receipt, error) {
	if err != nil {
		if err := recordErr(ctx, b.settledByEvent(ctx, j, out, err)); err != nil {
			e := chargeErr(j, ErrNotRecorded, "charged "+out.id, err)
			e.StripeID, e.RequestID = out.id, out.requestID
			return Receipt{}, e
		}
	}
	how := Created
	if out.replayed {
		how = Replayed
		b.log.LogAttrs(ctx, slogInfo, "billonce: Stripe replayed an earlier charge for the key", attrs(j, "stripe_id", out.id)...)
	}
	r := b.receipt(j, out.id, how)
	r.Processing = processing(out)
	return r, nil
}

// giveUp hands the claim on after a send that did not settle it: a claim
// this call made and whose key never executed at Stripe is abandoned, so
// the next run claims afresh, with its own endpoint and credential (after
// a rotated key, say); any other claim is released.
func (b *Biller) giveUp(ctx context.Context, j job, cause error) {
	if !j.won {
		b.release(ctx, j, cause)
		return
	}
	b.abandon(ctx, j)
}

// release leaves the claim pending with its key, expiring the lease so the
// next run can resume it at once. A claim that holds an object at Stripe
// (an invoice) records it, if it records none yet.
func (b *Biller) release(ctx context.Context, j job, cause error) {
	if err := b.claims.Release(ctx, j.key.String(), j.owner, j.holds, cause.Error()); err != nil {
		b.log.LogAttrs(ctx, slogWarn, "billonce: could not release claim; it is resumed once its lease expires", attrs(j, "error", err)...)
	}
}

// renewWhileSending keeps the claim's lease alive during long retries. It
// runs on a timer, not a goroutine of its own: most sends end long before
// the first renewal is due. No Renew runs after stop returns.
func (b *Biller) renewWhileSending(ctx context.Context, j job, c claim.Claim) (stop func()) {
	lease := c.LeaseUntil.Sub(c.UpdatedAt)
	if lease <= 0 {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var (
		mu      sync.Mutex // held while renewing
		stopped bool
		t       *time.Timer
	)
	mu.Lock()
	defer mu.Unlock()
	t = time.AfterFunc(lease/3, func() {
		mu.Lock()
		defer mu.Unlock()
		if stopped {
			return
		}
		if err := b.claims.Renew(ctx, j.key.String(), j.owner); err != nil && ctx.Err() == nil {
			b.log.LogAttrs(ctx, slogWarn, "billonce: renewing the claim's lease failed", attrs(j, "error", err)...)
		}
		t.Reset(lease / 3)
	})
	return func() {
		cancel() // ends a Renew under way
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
	}
}

// A kind is what billonce bills: a charge, an invoice or a usage report.
// The engine runs the claims of every kind the same way (claim, check,
// send through the one guard, record, and find past the key's window);
// a kind holds only what differs between them, each a method here.
type kind interface {
	// endpoint is where the kind's writes go, recorded on its claims.
	endpoint(b *Biller) string
	// describe adds the kind's own columns to the request of its claim.
	describe(r *claimengine.Request)
	// ready runs before anything is sent for c, won or resumed: the
	// checks of other claims a send depends on, and, where the key may
	// have gone where this Biller's requests would not meet it, the
	// lookup that settles c instead. When stop is set nothing more is
	// sent, and r, err are the call's answer.
	ready(ctx context.Context, b *Biller, j *job, c claim.Claim) (r Receipt, stop bool, err error)
	// send takes c, which may be sent, to its end.
	send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error)
	// failed answers for a claim found failed.
	failed(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error)
	// follows is the key of the claim that must be settled before this
	// one is sent, or the zero Key when it follows none: a window's total
	// follows the window's total before it. The kind's ready checks that
	// claim before anything is sent (see Biller.checkRevision), and a Run
	// holds a claim that follows another of its own until that one is
	// settled (see runner.hold).
	follows(b *Biller) (idemkey.Key, error)
}

// A charge or an invoice follows no other claim: a re-bill that meets
// the period's earlier attempt being sent waits for it by Biller.underWay,
// and a Run bills each period's first attempt only.
func (charges) follows(*Biller) (idemkey.Key, error)  { return idemkey.Key{}, nil }
func (invoices) follows(*Biller) (idemkey.Key, error) { return idemkey.Key{}, nil }

// A writer is a kind made by one write to Stripe (a charge, a usage
// report), whose claims the engine sends with [Biller.sendOnce].
type writer interface {
	kind
	// write makes one attempt of the write, with key in its header and
	// its body. It never makes a key.
	write(ctx context.Context, b *Biller, j job, key idemkey.Key) (object, error)
	// alreadyThere reports whether err is Stripe's word that a write
	// with the key exists already (a meter event's identifier seen):
	// the claim's own, if its key may have been sent before.
	alreadyThere(err error) bool
	// lookup settles a claim whose key Stripe may have forgotten, or
	// keeps where this Biller's requests do not meet it, by finding what
	// the key made; a miss it may trust reopens the key's window and
	// sends again.
	lookup(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error)
	// findOwn looks once, after retries left the outcome unknown, for
	// what the claim's own write made; found is set only for a hit that
	// is the claim's own.
	findOwn(ctx context.Context, b *Biller, j job) (out object, found bool)
	// refused answers for a write Stripe refused, where the refusal means
	// more for the kind than the engine's refusal table says (done set);
	// otherwise the table decides (see Biller.failure).
	refused(ctx context.Context, b *Biller, j job, err error) (r Receipt, done bool, rerr error)
	// localFirstSend reports whether the first send of a claim a Run
	// just won may leave on the local clock's word (see firstSendSafe).
	localFirstSend() bool
}

// job is one claim's work: a charge, an invoice or a usage report,
// prepared and checked.
type job struct {
	kind             kind   // what is billed
	account          string // the connected account it is billed on; "" for the platform
	customer, period string
	price            Price
	key              idemkey.Key
	attempt          int
	owner            string // this attempt's name on the claim
	reopened         bool   // a lookup found nothing and reopened the key's window
	// neverSent is set for a resumed claim whose key is known never to
	// have executed although Stripe refused it as seen (claim.Claim.Unsent:
	// a usage report's identifier another writer took).
	neverSent bool
	won       bool // this call made the claim, and no write of it has run yet
	ran       bool // a write of this call may have run at Stripe
	// holds is the Stripe object the claim holds once it exists, before
	// the claim is settled (an invoice's draft): a later refusal never
	// fails such a claim (see Biller.failure).
	holds       string
	rec         *recorder // in a Run over a batching store: checks and records in shared round trips
	start       time.Time // when settling began, for Config.Observe
	claimedAt   time.Time // local time just before the claim statement left, in a Run
	firstSendBy time.Time // see firstSendSafe
	// caller is the context a Run or Reconcile was given. Their own stop
	// cancels the context they hand on, which refuses every later send;
	// a request already on its way is bounded by caller and its attempt
	// timeout only, so that it gets Stripe's answer instead of leaving
	// an outcome unknown.
	caller context.Context
}

// object is the Object of j's events: what its kind's writes make, or
// "" for a job refused before its kind was known.
func (j job) object(b *Biller) string {
	if j.kind == nil {
		return ""
	}
	return objectOf(j.kind.endpoint(b))
}

// request is the claim of j, recording where its key goes.
func (b *Biller) request(j job) claimengine.Request {
	r := claimengine.Request{Customer: j.customer, Period: j.period, Key: j.key.String(),
		Amount: j.price.Amount, Currency: j.price.Currency, Owner: j.owner,
		Scope: b.cfg.Scope, Attempt: j.attempt, Endpoint: j.kind.endpoint(b), Credential: b.credential, Account: j.account}
	j.kind.describe(&r)
	return r
}

// settleClaim acts on a claim result: report it, or have the kind get it
// ready and send it. Its errors are *ChargeError, but errRecording: the
// recorder settles that claim.
func (b *Biller) settleClaim(ctx context.Context, j job, res claimResult) (Receipt, error) {
	r, err := b.act(onAccount(ctx, j.account), j, res)
	if err == errRecording {
		return r, err
	}
	return r, asChargeError(j, err)
}

// act is settleClaim's work: a claim already settled, failed, held or
// refused is reported from the claim; one won or resumed is handed to its
// kind, which gets it ready and sends it.
func (b *Biller) act(ctx context.Context, j job, res claimResult) (Receipt, error) {
	c := res.Claim
	switch res.Outcome {
	case claimengine.Succeeded:
		return b.receipt(j, c.StripeID, AlreadyBilled), nil
	case claimengine.Processing:
		r := b.receipt(j, c.StripeID, AlreadyBilled)
		r.Processing = true
		return r, nil
	case claimengine.Failed:
		return j.kind.failed(ctx, b, j, c)
	case claimengine.InProgress:
		e := chargeErr(j, ErrInProgress, fmt.Sprintf("claimed by %s until %s", c.Owner, c.LeaseUntil.UTC().Format(time.RFC3339)), nil)
		e.Until = c.LeaseUntil
		return Receipt{}, e
	case claimengine.Mismatch:
		if r, ok := b.paidBy(j, c); ok {
			return r, nil
		}
		if e := b.underWay(j, c); e != nil {
			return Receipt{}, e
		}
		return Receipt{}, chargeErr(j, nil, "nothing sent", &claim.MismatchError{Existing: c})
	case claimengine.Resumed:
		b.log.LogAttrs(ctx, slogInfo, "billonce: resuming a pending claim with its key",
			attrs(j, "leases", c.Leases, "age", c.Age.Round(time.Second), "last_error", c.LastError)...)
	case claimengine.Won:
		j.won = true
	default:
		return Receipt{}, fmt.Errorf("billing: unexpected claim outcome %v", res.Outcome)
	}
	if r, stop, err := j.kind.ready(ctx, b, &j, c); stop {
		return r, err
	}
	return j.kind.send(ctx, b, j, c)
}

// moved reports whether c's key may have gone where this Biller's
// requests do not meet it: with another endpoint or credential.
func (b *Biller) moved(j job, c claim.Claim) bool {
	return c.Endpoint != j.kind.endpoint(b) || c.Credential != b.credential
}

// sendOnce sends the claim of a writer under retry with its key, through
// the guard, and records the outcome. Past the key's deadline the
// writer's lookup settles the claim instead.
func (b *Biller) sendOnce(ctx context.Context, w writer, j job, c claim.Claim) (Receipt, error) {
	if w.localFirstSend() {
		j.firstSendBy = b.firstSendSafe(j, c)
	}
	stop := b.renewWhileSending(ctx, j, c)
	out, err := b.guarded(ctx, &j, j.key, w.alreadyThere, func(ctx context.Context, key idemkey.Key) (object, error) {
		return w.write(ctx, b, j, key)
	})
	stop()
	switch {
	case err == nil && j.rec != nil && succeeded(out) && !processing(out):
		j.rec.succeeded(j, out)
		return Receipt{}, errRecording
	case err == nil:
		return b.record(ctx, j, out)
	}
	if r, stopped, serr := b.sendStopped(ctx, w, j, c, err); stopped {
		return r, serr
	}
	if ctx.Err() == nil && outcomeUnknown(err) {
		// Retries could not tell whether Stripe made it (or Stripe said
		// not to retry a 5xx it had stored). One lookup may: what is the
		// claim's own is the truth; finding nothing proves nothing (an
		// index lags), and the claim stays pending.
		if found, ok := w.findOwn(ctx, b, j); ok {
			r, rerr := b.record(ctx, j, found)
			if rerr == nil {
				r.Outcome = Reconciled
				b.log.LogAttrs(ctx, slogInfo, "billonce: settled an unknown outcome by looking at Stripe", attrs(j, "stripe_id", r.StripeID)...)
			}
			return r, rerr
		}
	}
	if r, done, rerr := w.refused(ctx, b, j, err); done {
		return r, rerr
	}
	return Receipt{}, b.failure(ctx, j, err)
}

// sendStopped answers for a write of c's claim that the guard stopped
// before it left (stopped set): past the key's deadline, the writer's
// lookup settles the claim; with the claim no longer this call's, see
// leaseLost.
func (b *Biller) sendStopped(ctx context.Context, w writer, j job, c claim.Claim, err error) (r Receipt, stopped bool, _ error) {
	switch {
	case errors.Is(err, claimengine.ErrWindowClosed) && j.reopened:
		// A window just reopened closed again: retries outlasted it.
		return Receipt{}, true, b.needs(ctx, j, fmt.Sprintf("claimed %s ago; the key's window closed twice in one call; the next run looks again", c.Age.Round(time.Minute)), nil)
	case errors.Is(err, claimengine.ErrWindowClosed):
		r, err := w.lookup(ctx, b, j, c)
		return r, true, err
	case errors.Is(err, claimengine.ErrLeaseLost):
		r, err := b.leaseLost(ctx, j, err)
		return r, true, err
	}
	return Receipt{}, false, nil
}

// leaseLost answers for a send stopped because the claim is no longer
// this call's: an earlier attempt's own payment paid the period and
// superseded it (see Biller.Webhook), or another runner took it over and
// sends from now on.
func (b *Biller) leaseLost(ctx context.Context, j job, err error) (Receipt, error) {
	c, gerr := b.claims.Get(ctx, j.key.String())
	if gerr != nil || c.State != claim.StateFailed || c.FailureCode != claim.FailureSuperseded {
		return Receipt{}, chargeErr(j, ErrInProgress, "stopped sending", err)
	}
	if j.ran {
		b.log.LogAttrs(ctx, slogError, "billonce: a re-bill was stopped after an attempt that may have reached Stripe; look its key up, and refund a payment of it", attrs(j)...)
		return Receipt{}, chargeErr(j, ErrNeedsReconciliation, "stopped after an attempt that may have reached Stripe, since an earlier attempt's payment paid the period: look its key up in Stripe, and refund a payment of it", err)
	}
	return j.kind.failed(ctx, b, j, c)
}

// needs leaves j's claim pending with its key, for a person or a later
// lookup, when what exists at Stripe could not be told: nothing more is
// sent. reason says why, in the claim's LastError and in the
// ErrNeedsReconciliation it returns, which names what the claim holds;
// answer, if not nil, is Stripe's answer that left it so.
func (b *Biller) needs(ctx context.Context, j job, reason string, answer *stripe.Error) *ChargeError {
	b.release(context.WithoutCancel(ctx), j, errors.New("reconciliation: "+reason))
	b.log.LogAttrs(ctx, slogWarn, "billonce: claim needs reconciliation; nothing more was sent", attrs(j, "reason", reason, "stripe_id", j.holds)...)
	e := chargeErr(j, ErrNeedsReconciliation, reason, nil)
	e.StripeID = j.holds
	if answer != nil {
		// Stripe's answer, in the chain but not a cause of another kind:
		// a refusal by a proxy stays what it was.
		e.Err.(*kindError).answer, e.RequestID = answer, answer.RequestID
	}
	return e
}

// failure is the refusal table of every kind: what a write Stripe did not
// make means for its claim, and the error for the caller.
//
//   - A refusal about this item alone (a decline, no such customer, a
//     value of its own) fails the claim: its key is done.
//   - Once the claim holds an object at Stripe (an invoice's draft), such
//     a refusal of a later write needs a person instead, who fixes the
//     cause and calls again, or voids the object.
//   - Anything else leaves the claim pending with its key (or abandons
//     one whose key never ran): a refusal no request could get past stops
//     a Run; a key reused with other parameters, a stop or retries run out
//     leave the outcome to the next call.
func (b *Biller) failure(ctx context.Context, j job, err error) error {
	bg, cancel := recordCtx(callerOf(ctx, j))
	defer cancel()
	var se *stripe.Error
	isStripe := errors.As(err, &se)
	refusal := isStripe && !outcomeUnknown(err) && se.Type != stripe.ErrorTypeIdempotency
	switch {
	case refusal && j.holds != "" && se.HTTPStatusCode != http.StatusUnauthorized && se.HTTPStatusCode != http.StatusForbidden && !proxyRefused(err):
		return b.needs(ctx, j, fmt.Sprintf("Stripe refused a write to %s (%s: %s); the claim stays pending: fix the cause and call again, or void %s", j.holds, se.Code, se.Msg, j.holds), se)
	case refusal && refusedForItem(se):
		reason := string(se.Code)
		if se.DeclineCode != "" {
			reason += " (" + string(se.DeclineCode) + ")"
		}
		if reason == "" {
			reason = string(se.Type)
		}
		reason += ": " + se.Msg
		fix := itemCodes[se.Code]
		if a, ok := j.kind.(interface{ advice(stripe.ErrorCode) string }); ok && a.advice(se.Code) != "" {
			fix = a.advice(se.Code)
		}
		if fix != "" {
			reason += "; " + fix
		}
		if ferr := recordErr(bg, b.claims.Fail(bg, j.key.String(), declinedObject(se), reason)); ferr != nil {
			return declined(j, ErrNotRecorded, "declined ("+reason+")", ferr, se)
		}
		e := declined(j, ErrDeclined, reason, nil, se)
		e.Code, e.DeclineCode = string(se.Code), string(se.DeclineCode)
		return e
	}
	b.giveUp(bg, j, err)
	var e *ChargeError
	switch {
	case isStripe && se.Type == stripe.ErrorTypeIdempotency:
		b.log.LogAttrs(ctx, slogError, "billonce: Stripe refused a key reused with other parameters", attrs(j, "error", err)...)
		e = chargeErr(j, ErrKeyReused, "", err)
	case StopsRun(err):
		e = chargeErr(j, nil, "", err)
	case refusal:
		e = chargeErr(j, nil, "", refused(se))
	case ctx.Err() != nil:
		e = chargeErr(j, ErrOutcomeUnknown, "stopped; the claim stays pending and the next run resumes it with the same key", err)
	default:
		// Retries ran out (or a non-retryable transport failure): the
		// write may exist.
		b.log.LogAttrs(ctx, slogWarn, "billonce: outcome unknown; claim left pending for a safe resume", attrs(j, "error", err)...)
		e = chargeErr(j, ErrOutcomeUnknown, "", err)
	}
	if e.StripeID == "" {
		e.StripeID = j.holds
	}
	return e
}

// declinedObject is the Stripe object a decline names, which the failed
// claim records as its own: the PaymentIntent, or else the charge.
func declinedObject(se *stripe.Error) string {
	if se.PaymentIntent != nil && se.PaymentIntent.ID != "" {
		return se.PaymentIntent.ID
	}
	return se.ChargeID
}

// failedFrom is the *ChargeError of a failed claim: ErrDeclined, with
// AfterProcessing when its payment failed when it settled.
func failedFrom(c claim.Claim) *ChargeError {
	e := chargeErr(job{customer: c.Customer, period: c.Period, attempt: c.Attempt}, ErrDeclined, c.LastError, nil)
	e.Key, e.Code, e.AfterProcessing = c.Key, c.FailureCode, !c.ProcessingAt.IsZero()
	return e
}

// recordProcessing records a payment Stripe answered as pending or
// processing; ctx is a recordCtx.
func (b *Biller) recordProcessing(ctx context.Context, j job, out object) error {
	err := recordErr(ctx, b.claims.Process(ctx, j.key.String(), out.id))
	if err != nil {
		e := chargeErr(j, ErrNotRecorded, "processing "+out.id, err)
		e.StripeID = out.id
		return e
	}
	b.log.LogAttrs(ctx, slogInfo, "billonce: payment is processing; its outcome arrives by webhook or Reconcile", attrs(j, "stripe_id", out.id)...)
	return nil
}

// settledByEvent handles Succeed refusing a claim that an event already
// moved: a succeeded answer for a payment the claim records as
// processing is that payment settling, applied like an event.
func (b *Biller) settledByEvent(ctx context.Context, j job, out object, serr error) error {
	if !errors.Is(serr, claimengine.ErrConflict) {
		return serr
	}
	c, err := b.claims.Get(ctx, j.key.String())
	if err == nil && c.State == claim.StateFailed && c.FailureCode == claim.FailureSuperseded {
		b.log.LogAttrs(ctx, slogError, "billonce: a re-bill stopped while its request was on its way was charged: an earlier attempt's own payment paid the period too; refund one of them",
			attrs(j, "stripe_id", out.id)...)
		return serr
	}
	if err != nil || c.State != claim.StateProcessing || c.StripeID != out.id {
		return serr
	}
	a, err := b.claims.Apply(ctx, claimengine.Update{EventType: "answer", Key: c.Key, StripeID: out.id, State: string(claim.StateSucceeded), Created: time.Now()})
	if err != nil {
		return err
	}
	if a.Outcome == claimengine.Changed {
		b.applied(ctx, "answer", a)
	}
	return nil
}
