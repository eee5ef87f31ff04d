package billing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/retry"
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
		c.Customer != j.customer || c.Period != j.period {
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

// job is one customer's charge, prepared and checked.
type job struct {
	customer, period string
	price            Price
	key              idemkey.Key
	attempt          int
	owner            string // this attempt's name on the claim
	reopened         bool   // a search found no payment and reopened the key's window
	// neverSent is set for a resumed usage claim released because its
	// identifier was taken although it never executed it (see
	// identifierTaken).
	neverSent   bool
	won         bool      // this call made the claim: no earlier send of its key exists
	rec         *recorder // in a Run over a batching store: checks and records in shared round trips
	start       time.Time // when settling began, for Config.Observe
	claimedAt   time.Time // local time just before the claim statement left, in a Run
	firstSendBy time.Time // see firstSendSafe
	inv         *Invoice  // billed as this invoice, checked; nil for a payment
	// usage is set for a usage report (see ReportUsage).
	usage *usageJob
	// caller is the context a Run or Reconcile was given. Their own stop
	// cancels the context they hand on, which refuses every later send;
	// a request already on its way is bounded by caller and its attempt
	// timeout only, so that it gets Stripe's answer instead of leaving
	// an outcome unknown.
	caller context.Context
}

// request is the claim of j, recording where its key goes.
func (b *Biller) request(j job) claimengine.Request {
	r := claimengine.Request{Customer: j.customer, Period: j.period, Key: j.key.String(),
		Amount: j.price.Amount, Currency: j.price.Currency, Owner: j.owner,
		Scope: b.cfg.Scope, Attempt: j.attempt, Endpoint: b.endpointOf(j), Credential: b.credential}
	if j.usage != nil {
		r.Meter, r.WindowStart, r.WindowEnd = j.usage.Meter, j.usage.Start, j.usage.End
	}
	return r
}

// endpointOf is where this Biller sends j's key: its claim's Endpoint.
func (b *Biller) endpointOf(j job) string {
	switch {
	case j.inv != nil:
		return endpointInvoices
	case j.usage != nil:
		return endpointMeterEvents
	}
	return b.endpoint
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
			if errors.As(err, &m) && !windowOverlap(m) {
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
	e := Event{Kind: EventOutcome, Customer: j.customer, Period: j.period, Duration: time.Since(start), Err: err}
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

// settleClaim acts on a claim result: send, resume, reconcile, or report.
// Its errors are *ChargeError.
func (b *Biller) settleClaim(ctx context.Context, j job, res claimResult) (Receipt, error) {
	r, err := b.settleClaim1(ctx, j, res)
	if err == errRecording {
		return r, err // the recorder settles it, with its own error
	}
	return r, asChargeError(j, err)
}

func (b *Biller) settleClaim1(ctx context.Context, j job, res claimResult) (Receipt, error) {
	c := res.Claim
	switch res.Outcome {
	case claimengine.Succeeded:
		return b.receipt(j, c.StripeID, AlreadyBilled), nil
	case claimengine.Processing:
		r := b.receipt(j, c.StripeID, AlreadyBilled)
		r.Processing = true
		return r, nil
	case claimengine.Failed:
		if j.usage != nil || j.inv != nil {
			e := chargeErr(j, ErrDeclined, c.LastError, nil)
			e.Code = c.FailureCode
			return Receipt{}, e
		}
		return b.afterFailure(ctx, j, c)
	case claimengine.InProgress:
		e := chargeErr(j, ErrInProgress, fmt.Sprintf("claimed by %s until %s", c.Owner, c.LeaseUntil.UTC().Format(time.RFC3339)), nil)
		e.Until = c.LeaseUntil
		return Receipt{}, e
	case claimengine.Resumed:
		b.log.LogAttrs(ctx, slogInfo, "billonce: resuming a pending claim with its key",
			attrs(j, "leases", c.Leases, "age", c.Age.Round(time.Second), "last_error", c.LastError)...)
		if j.usage != nil {
			// A usage report is identified at Stripe by its identifier,
			// whatever the credential: past the deadline, send checks
			// the meter's summary first.
			if err := b.checkRevision(ctx, j); err != nil {
				b.giveUp(context.WithoutCancel(ctx), j, err)
				return Receipt{}, err
			}
			if b.identifierMayBeForgotten(j, c) {
				return b.reconcileUsage(ctx, j, c)
			}
			j.neverSent = strings.HasPrefix(c.LastError, identifierTaken)
			break
		}
		if r, stop, err := b.checkChain(ctx, j, c); stop {
			return r, err
		}
		if j.inv == nil && (c.Endpoint != b.endpoint || c.Credential != b.credential) {
			return b.reconcile(ctx, j, c)
		}
	case claimengine.Mismatch:
		if e := b.underWay(j, c); e != nil {
			return Receipt{}, e
		}
		return Receipt{}, chargeErr(j, nil, "nothing sent", &claim.MismatchError{Existing: c})
	case claimengine.Won:
		j.won = true
		if j.usage != nil {
			if err := b.checkRevision(ctx, j); err != nil {
				b.giveUp(context.WithoutCancel(ctx), j, err)
				return Receipt{}, err
			}
			if b.identifierMayBeForgotten(j, c) {
				return b.reconcileUsage(ctx, j, c)
			}
			break
		}
		if r, stop, err := b.checkChain(ctx, j, c); stop {
			return r, err
		}
	default:
		return Receipt{}, fmt.Errorf("billing: unexpected claim outcome %v", res.Outcome)
	}
	if j.inv != nil {
		return b.sendInvoice(ctx, j, c)
	}
	return b.send(ctx, j, c)
}

func (b *Biller) receipt(j job, id string, o Outcome) Receipt {
	return Receipt{Customer: j.customer, Period: j.period, StripeID: id, Amount: j.price.Amount,
		Currency: j.price.Currency, Key: j.key, Attempt: j.attempt, Outcome: o}
}

// created is what Stripe answered to a create call.
type created struct {
	id       string
	status   string
	replayed bool
	// customer, amount and currency are what a search found the payment
	// made for (see Biller.ownHits); empty in an answer to a write.
	customer string
	amount   int64
	currency string
	// requestID is Stripe's id of the request that answered.
	requestID string
}

// send calls Stripe under retry with the claim's key and records the
// outcome. Before every attempt the claim store confirms that the key's
// deadline has not passed, but for a fresh claim's first attempt in a Run
// (see firstSendSafe); once it has, the claim is reconciled by search
// instead.
func (b *Biller) send(ctx context.Context, j job, c claim.Claim) (Receipt, error) {
	j.firstSendBy = b.firstSendSafe(j, c)
	stop := b.renewWhileSending(ctx, j, c)
	attempt := 0        // retry.Do runs attempts one after the other
	mayHaveRun := false // whether any attempt may have executed at Stripe
	// Stripe is unreachable, by the time rule, if the next attempt starts
	// at unreachableBy or later: a retry that cannot start before then
	// stops with unreachable, not after its wait.
	var unreachableBy time.Time
	var unreachable error
	policy := b.policyFor(ctx, j)
	classify := policy.Classify
	policy.Classify = func(err error) retry.Decision {
		d := classify(err)
		if unreachable != nil {
			d = d.Until(unreachableBy, unreachable)
		}
		return d
	}
	out, err := retry.Do(ctx, j.key, policy, func(actx context.Context, key idemkey.Key) (created, error) {
		attempt++
		unreachableBy, unreachable = time.Time{}, nil
		start := time.Now()
		sentBefore := mayHaveRun || !j.won && !j.reopened && !j.neverSent
		out, w, err := b.create(actx, j, key, attempt)
		if j.usage != nil && duplicateIdentifier(err) && sentBefore {
			// Stripe has an event with this identifier, and this
			// claim's key may have carried it: the event is there.
			b.log.LogAttrs(ctx, slogInfo, "billonce: Stripe already has the usage event; recorded as delivered", attrs(j)...)
			out, err = created{id: key.String(), status: "succeeded", replayed: true, requestID: out.requestID}, nil
		}
		// One write refused before execution ran nothing. Several writes
		// in one attempt (net/http resends a request with an
		// Idempotency-Key by itself when a reused connection closes, and
		// a caller's transport may retry) leave the earlier ones unknown;
		// so does a transport whose writes cannot be seen (-1).
		mayHaveRun = mayHaveRun || w.writes != 0 && (w.writes != 1 || !refusedBeforeExecution(err))
		// Whether Stripe answers at all, counted across the Biller's
		// calls; a stopped call's attempt says nothing about Stripe.
		switch {
		case !w.called || ctx.Err() != nil:
		case w.answered:
			b.reach.answered()
		case err != nil:
			if by, uerr := b.reach.missed(start, err); uerr != nil && by.IsZero() {
				err = uerr
			} else {
				unreachableBy, unreachable = by, uerr
			}
		}
		return out, err
	})
	j.won = j.won && !mayHaveRun
	stop()
	switch {
	case err == nil && j.rec != nil && succeeded(out) && !processing(out):
		j.rec.succeeded(j, out)
		return Receipt{}, errRecording
	case err == nil:
		return b.record(ctx, j, out)
	case errors.Is(err, claimengine.ErrWindowClosed):
		if j.reopened {
			// A window just reopened closed again: retries outlasted it.
			b.release(context.WithoutCancel(ctx), j, err)
			b.log.LogAttrs(ctx, slogWarn, "billonce: claim needs reconciliation: the key's window closed twice in one call; the next run searches again", attrs(j)...)
			return Receipt{}, chargeErr(j, ErrNeedsReconciliation, fmt.Sprintf("claimed %s ago; the key's window closed twice in one call; the next run searches again", c.Age.Round(time.Minute)), nil)
		}
		if j.usage != nil {
			return b.reconcileUsage(ctx, j, c)
		}
		return b.reconcile(ctx, j, c)
	case j.usage != nil && duplicateIdentifier(err):
		// The identifier was used by an event this claim never sent:
		// another claim table, or one restored from an old backup.
		// The claim records that reason, so that a resume knows the claim
		// still never sent its key, and answers the same.
		reason := identifierTakenReason
		b.release(context.WithoutCancel(ctx), j, errors.New(reason))
		b.log.LogAttrs(ctx, slogWarn, "billonce: usage report needs reconciliation: its identifier is taken", attrs(j)...)
		return Receipt{}, chargeErr(j, ErrNeedsReconciliation, reason, err)
	case errors.Is(err, claimengine.ErrLeaseLost):
		if c, gerr := b.claims.Get(ctx, j.key.String()); gerr == nil && c.State == claim.StateFailed && c.FailureCode == claim.FailureSuperseded {
			// Stopped by an earlier attempt's own payment, which paid
			// the period (see Biller.Webhook).
			if mayHaveRun {
				b.log.LogAttrs(ctx, slogError, "billonce: a re-bill was stopped after an attempt that may have reached Stripe; look its key up, and refund a payment of it", attrs(j)...)
				return Receipt{}, chargeErr(j, ErrNeedsReconciliation, "stopped after an attempt that may have reached Stripe, since an earlier attempt's payment paid the period: look its key up in Stripe, and refund a payment of it", err)
			}
			return b.afterFailure(ctx, j, c)
		}
		// Another runner took the claim over; it sends from now on.
		return Receipt{}, chargeErr(j, ErrInProgress, "stopped sending", err)
	}
	if ctx.Err() == nil && outcomeUnknown(err) && j.usage == nil {
		// Retries could not tell whether Stripe made the charge (or Stripe
		// said not to retry a 5xx it had stored). One search may: a charge
		// it finds is the truth; finding none proves nothing (the index
		// lags), and the claim stays pending. Only the claim's own
		// payment counts (see ownHits): another writer's copy of the
		// claim's metadata on a payment of its own is not the claim's.
		found, serr := b.search(ctx, j.key)
		if serr == nil {
			found, _ = b.ownHits(j, found)
		}
		if serr == nil && len(found) == 1 {
			r, rerr := b.record(ctx, j, found[0])
			if rerr == nil {
				r.Outcome = Reconciled
				b.log.LogAttrs(ctx, slogInfo, "billonce: settled an unknown outcome from Stripe search", attrs(j, "stripe_id", r.StripeID)...)
			}
			return r, rerr
		}
	}
	if r, done, rerr := b.completedSinceDecline(ctx, j, err); done {
		return r, rerr
	}
	return Receipt{}, b.failure(ctx, j, err)
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
func succeeded(out created) bool {
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
func (b *Biller) record(ctx context.Context, j job, out created) (Receipt, error) {
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
func processing(out created) bool {
	return out.status == "pending" || out.status == "processing"
}

// recorded is the receipt of a success whose recording returned err; ctx
// is the recordCtx it was written with.
func (b *Biller) recorded(ctx context.Context, j job, out created, err error) (Receipt, error) {
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

// failure records what a failed send means for the claim, and returns the
// error for the caller.
func (b *Biller) failure(ctx context.Context, j job, err error) error {
	bg, cancel := recordCtx(callerOf(ctx, j))
	defer cancel()
	key := j.key.String()
	var se *stripe.Error
	isStripe := errors.As(err, &se)
	refusal := isStripe && !outcomeUnknown(err) && se.Type != stripe.ErrorTypeIdempotency
	if refusal && refusedForItem(se) {
		// A definitive refusal about this item alone: a decline, no such
		// customer or payment method, a value of its own its key is
		// always sent with. Terminal for this key.
		// Any other refusal stops the run below (see Classify).
		reason := string(se.Code)
		if se.DeclineCode != "" {
			reason += " (" + string(se.DeclineCode) + ")"
		}
		if reason == "" {
			reason = string(se.Type)
		}
		reason += ": " + se.Msg
		if fix := itemCodes[se.Code]; fix != "" {
			reason += "; " + fix
		}
		if ferr := recordErr(bg, b.claims.Fail(bg, key, declinedObject(se), reason)); ferr != nil {
			return declined(j, ErrNotRecorded, "declined ("+reason+")", ferr, se)
		}
		e := declined(j, ErrDeclined, reason, nil, se)
		e.Code, e.DeclineCode = string(se.Code), string(se.DeclineCode)
		return e
	}

	// Anything else leaves the claim pending with its key, for a person or
	// the next run.
	b.giveUp(bg, j, err)
	switch {
	case isStripe && se.Type == stripe.ErrorTypeIdempotency:
		b.log.LogAttrs(ctx, slogError, "billonce: Stripe refused a key reused with other parameters", attrs(j, "error", err)...)
		return chargeErr(j, ErrKeyReused, "", err)
	case StopsRun(err):
		return chargeErr(j, nil, "", err)
	case refusal:
		return chargeErr(j, nil, "", refused(se))
	case ctx.Err() != nil:
		return chargeErr(j, ErrOutcomeUnknown, "stopped; the claim stays pending and the next run resumes it with the same key", err)
	}
	// Retries ran out (or a non-retryable transport failure): the charge may
	// exist.
	b.log.LogAttrs(ctx, slogWarn, "billonce: outcome unknown; claim left pending for a safe resume", attrs(j, "error", err)...)
	return chargeErr(j, ErrOutcomeUnknown, "", err)
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
// next run can resume it at once.
func (b *Biller) release(ctx context.Context, j job, cause error) {
	why := cause.Error()
	if j.neverSent && !strings.HasPrefix(why, identifierTaken) {
		why = identifierTaken + why // the mark stays until the claim settles
	}
	if err := b.claims.Release(ctx, j.key.String(), j.owner, why); err != nil {
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

// policyFor is the retry policy for one charge: every retry is logged with
// the charge's key, customer and period.
func (b *Biller) policyFor(ctx context.Context, j job) retry.Policy {
	p := b.policy
	classify := p.Classify
	p.Classify = func(err error) retry.Decision {
		if errors.Is(err, claimengine.ErrWindowClosed) || errors.Is(err, claimengine.ErrLeaseLost) ||
			errors.Is(err, ErrStripeUnreachable) {
			return retry.Stop()
		}
		return classify(err)
	}
	user := p.Notify
	p.Notify = func(e retry.Event) {
		b.log.LogAttrs(ctx, slogInfo, "billonce: retrying with the same key",
			attrs(j, "http_attempt", e.Attempt, "wait", e.Wait, "error", e.Err)...)
		if user != nil {
			user(e)
		}
	}
	return p
}
