package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/retry"
)

// ChargeOptions are the options of one [Biller.Charge] or [Biller.Rebill].
// A nil *ChargeOptions takes every default.
type ChargeOptions struct {
	// Price, when not nil, is charged instead of Config.Price's answer.
	// The price is part of the claim: a later call for the same customer
	// and period with another amount is refused (a [*claim.MismatchError]
	// in the error), never charged.
	Price *Price
}

func (o *ChargeOptions) price() *Price {
	if o == nil {
		return nil
	}
	return o.Price
}

// Charge bills customer for period exactly once, at the price from
// Config.Price (or opts.Price). Call it as often as you like: once the
// charge exists, later calls return its receipt without charging again,
// whichever replica makes them.
//
// The flow: the key is derived from (scope, customer, period, attempt) before
// anything else; a claim row is committed; only then is Stripe called, inside
// retries that all carry that key; the outcome is recorded on the claim.
//
// When ctx is done after Stripe may have charged, the outcome is still
// recorded, for up to two seconds more: a write that takes longer (a claim
// row locked by another session) is given up, and Charge returns an
// [ErrNotRecorded] or [ErrOutcomeUnknown] that wraps ctx's error. The
// claim then stays pending with its key (or the record lands once the
// row is free), and the next call gets Stripe's replay and records it.
//
// Every error is a [*ChargeError]; its documentation has the table of what
// each kind means for the claim and what to do.
func (b *Biller) Charge(ctx context.Context, customer, period string, opts *ChargeOptions) (Receipt, error) {
	return b.bill(ctx, customer, period, opts.price(), 1)
}

// Rebill bills customer for period again after a definitive failure (an
// [ErrDeclined]), as billing attempt number attempt: 2 for the first
// re-bill, ChargeError.Attempt+1 in general, at most 10,000. Each
// attempt has its own key, so this is the one way to try a second payment
// for one period, and it never happens on its own: a person or a dunning
// process decides it. Rebill with the same attempt is as idempotent as
// Charge, and a period already paid by an earlier attempt (or processing)
// is never charged again: Rebill returns that attempt's receipt with
// Outcome AlreadyBilled. Attempts follow one another: a re-bill whose
// attempt-1 has no claim (a skipped number, or a customer never charged)
// is refused with [ErrInvalid] before anything is claimed or sent, so
// that Charge and Run, which look for re-bills in order from the declined
// attempt, always find the one that paid. A re-bill made while an earlier
// attempt is still being sent, or pending with an unknown outcome, waits
// for it like Charge does for another runner: ErrInProgress, with
// ChargeError.Until its claim's lease.
func (b *Biller) Rebill(ctx context.Context, customer, period string, attempt int, opts *ChargeOptions) (Receipt, error) {
	if attempt < 2 || attempt > maxAttempt {
		return Receipt{}, chargeErr(job{customer: customer, period: period, attempt: attempt}, nil, "",
			invalid("Rebill attempt %d: re-bills are numbered from 2 (attempt 1 is Charge) to %d", attempt, maxAttempt))
	}
	return b.bill(ctx, customer, period, opts.price(), attempt)
}

// checkRebill looks at the attempts before a re-bill that has no claim yet.
// If one of them paid (or is processing), the period is billed: its
// receipt is returned with billed set, and nothing is claimed or sent. A
// re-bill whose attempt-1 has no claim is refused: re-bills are numbered
// one after the other, so that Charge and Run, which walk the attempts in
// order from the declined one, find a re-bill that succeeded and report
// the period as billed. Its errors are *ChargeError.
func (b *Biller) checkRebill(ctx context.Context, j job) (r Receipt, billed bool, err error) {
	_, err = b.claims.Get(ctx, j.key.String())
	if !errors.Is(err, claim.ErrNotFound) {
		if err != nil {
			return Receipt{}, false, chargeErr(j, nil, "looking up the re-bill's claim", err)
		}
		return Receipt{}, false, nil // this re-bill is claimed already: resume or report it
	}
	for a := 1; a < j.attempt; a++ {
		key, err := b.keyFor(j.customer, j.period, a)
		if err != nil {
			return Receipt{}, false, chargeErr(j, nil, "", invalid("%v", err))
		}
		c, err := b.claims.Get(ctx, key.String())
		switch {
		case errors.Is(err, claim.ErrNotFound):
			return Receipt{}, false, chargeErr(j, nil, "", invalid("Rebill attempt %d: attempt %d has no claim in scope %s; a re-bill follows the attempt that declined: use ChargeError.Attempt+1 of the decline Charge reports", j.attempt, a, b.cfg.Scope))
		case err != nil:
			return Receipt{}, false, chargeErr(j, nil, fmt.Sprintf("looking up attempt %d", a), err)
		case c.State == claim.StateSucceeded || c.State == claim.StateProcessing:
			paid := j
			paid.key, paid.attempt, paid.price = key, a, Price{Amount: c.Amount, Currency: c.Currency}
			r := b.receipt(paid, c.StripeID, AlreadyBilled)
			r.Processing = c.State == claim.StateProcessing
			return r, true, nil
		}
	}
	return Receipt{}, false, nil
}

// checkChain looks again, once a re-bill has won or resumed its claim and
// before anything is sent, for the claims of the attempts before it.
// checkRebill saw them, but one that was pending then (a re-bill under
// way) may since have been abandoned, which deletes it: sending now would
// leave the skipped number checkRebill refuses. The claim held is the
// period's one live claim, so no earlier attempt can be claimed or
// abandoned while it lives: what this check sees stays true. A gap
// abandons a claim just won, whose key was never sent. A resumed claim's
// key may have been sent before the gap appeared (a declined attempt's
// claim deleted by hand after its re-bill was sent), so Stripe's search
// settles it instead (see afterGap). A lookup that fails is no gap: it
// abandons a claim just won, and releases a resumed one. Attempt 1 has
// nothing before it. When stop is set, nothing may be sent and r, err
// are the call's answer; its errors are *ChargeError.
func (b *Biller) checkChain(ctx context.Context, j job, c claim.Claim) (r Receipt, stop bool, err error) {
	for a := 1; a < j.attempt; a++ {
		key, err := b.keyFor(j.customer, j.period, a)
		if err != nil {
			return Receipt{}, true, chargeErr(j, nil, "", invalid("%v", err))
		}
		_, err = b.claims.Get(ctx, key.String())
		if err == nil {
			continue
		}
		if !errors.Is(err, claim.ErrNotFound) {
			// No gap seen: a resumed claim's key may have executed at
			// Stripe, so the claim stays pending with its key.
			err = chargeErr(j, nil, fmt.Sprintf("looking up attempt %d", a), err)
			if !j.won {
				b.release(context.WithoutCancel(ctx), j, err)
				return Receipt{}, true, err
			}
		} else {
			err = chargeErr(j, nil, "", invalid("Rebill attempt %d: attempt %d has no claim in scope %s any more (abandoned unsent meanwhile, or deleted); a re-bill follows the attempt that declined: use ChargeError.Attempt+1 of the decline Charge reports", j.attempt, a, b.cfg.Scope))
			if !j.won {
				r, err := b.afterGap(ctx, j, c, a, err)
				return r, true, err
			}
		}
		b.abandon(ctx, j)
		return Receipt{}, true, err
	}
	return Receipt{}, false, nil
}

// afterGap settles a resumed re-bill claim that found attempt a without a
// claim, gap being that refusal. The claim is the only record that its
// key may have charged, so it is neither sent nor deleted blind: Stripe's
// search decides, as for a claim past its deadline. A payment found is
// recorded, and the period is billed. Finding none is trusted once the
// key's whole window has passed (see elsewhere): then no payment carries
// the key or ever will, and the claim is abandoned with gap, as a claim
// just won would be. Otherwise the claim stays pending with its key:
// ErrNeedsReconciliation.
func (b *Biller) afterGap(ctx context.Context, j job, c claim.Claim, a int, gap error) (Receipt, error) {
	return b.searchThen(ctx, j, c, func(serr error) error {
		after := b.cfg.elsewhereAfter()
		if serr == nil && c.SentAge >= after {
			b.abandon(ctx, j)
			return gap
		}
		why := fmt.Sprintf("Stripe's search found no payment for its key, which proves none only %s after the key was first sent", after.Round(time.Hour))
		if serr != nil {
			why = "Stripe's search for its key failed: " + serr.Error()
		}
		e := chargeErr(j, ErrNeedsReconciliation, fmt.Sprintf("attempt %d has no claim in scope %s any more, but this re-bill's key may have been sent before it went; %s; nothing was sent and the claim stays pending: restore attempt %d's claim if it was deleted by mistake, or look the key up in Stripe and record it with billonce resolve; Reconcile settles it once the search can tell",
			a, b.cfg.Scope, why, a), nil)
		if serr == nil {
			e.Until = time.Now().Add(after - c.SentAge)
		}
		b.release(context.WithoutCancel(ctx), j, e)
		b.log.LogAttrs(ctx, slogWarn, "billonce: re-bill claim needs reconciliation: an earlier attempt's claim is gone and its key may have been sent; nothing was sent", attrs(j, "missing_attempt", a)...)
		return e
	})
}

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

// prepare checks one charge and derives its key. Its errors are
// *ChargeError.
func (b *Biller) prepare(ctx context.Context, customer, period string, p *Price, attempt int) (job, error) {
	j := job{customer: customer, period: period, attempt: attempt}
	if err := checkID("customer ID", customer); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	if err := checkPeriod(period); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	var price Price
	if p != nil {
		price = *p
	} else {
		if b.cfg.Price == nil {
			return j, chargeErr(j, nil, "", invalid("no price: set Config.Price or pass ChargeOptions.Price"))
		}
		var err error
		if price, err = b.cfg.Price(ctx, customer, period); err != nil {
			return j, chargeErr(j, nil, "Config.Price", err)
		}
	}
	price, err := checkPrice(price, b.cfg.API)
	if err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	key, err := b.keyFor(customer, period, attempt)
	if err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.price, j.key, j.owner = price, key, b.newOwner()
	return j, nil
}

// keyFor is the key of (scope, customer, period, attempt), derived once before anything can retry.
func (b *Biller) keyFor(customer, period string, attempt int) (idemkey.Key, error) {
	return idemkey.For(b.cfg.Scope, customer, period, strconv.Itoa(attempt))
}

// Key returns the idempotency key of customer's charge for period at billing
// attempt attempt (1 for Charge), which its Stripe object carries in the
// metadata billonce_key: look a charge up with it before it is made, or
// match your own records to Stripe's.
func (b *Biller) Key(customer, period string, attempt int) (idemkey.Key, error) {
	return b.keyFor(customer, period, attempt)
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

// newOwner names one charge attempt on its claim: the Biller's owner, its
// random instance and a sequence number. Two calls in one process for the
// same customer, or two replicas with the same Config.Owner, then see each
// other as in progress instead of both sending.
func (b *Biller) newOwner() string {
	return b.cfg.Owner + "/" + b.instance + "/" + strconv.FormatUint(b.seq.Add(1), 10)
}

func (b *Biller) bill(ctx context.Context, customer, period string, p *Price, attempt int) (Receipt, error) {
	j, err := b.prepare(ctx, customer, period, p, attempt)
	if err != nil {
		return Receipt{}, err
	}
	start := time.Now()
	if attempt > 1 {
		r, billed, err := b.checkRebill(ctx, j)
		if err != nil {
			return Receipt{}, err
		}
		if billed {
			b.outcome(j, start, r, nil)
			return r, nil
		}
	}
	return b.claimLoop(ctx, j, start)
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

// afterFailure answers for a failed attempt: a later re-bill that succeeded
// means the period is billed, and its receipt is returned; one still under
// way (pending) is ErrInProgress; otherwise the latest failure, whose
// *ChargeError names the next attempt to re-bill with.
// Re-bills are numbered one after the other (see checkRebill), so the walk
// ends at the first attempt without a claim: one lookup per re-bill made.
func (b *Biller) afterFailure(ctx context.Context, j job, failed claim.Claim) (Receipt, error) {
	last := j
	for a := 1; a < j.attempt; a++ {
		// An earlier attempt whose own payment succeeded after it failed
		// (a PaymentIntent completed on session) paid the period, and
		// stopped this re-bill.
		key, err := b.keyFor(j.customer, j.period, a)
		if err != nil {
			break
		}
		if c, err := b.claims.Get(ctx, key.String()); err == nil && c.State == claim.StateSucceeded {
			paid := j
			paid.key, paid.attempt, paid.price = key, a, Price{Amount: c.Amount, Currency: c.Currency}
			return b.receipt(paid, c.StripeID, AlreadyBilled), nil
		}
	}
	if j.attempt > 0 {
		for a := j.attempt + 1; a <= maxAttempt; a++ {
			key, err := b.keyFor(j.customer, j.period, a)
			if err != nil {
				break
			}
			c, err := b.claims.Get(ctx, key.String())
			if err != nil {
				break // no such re-bill
			}
			if c.State == claim.StatePending {
				// A re-bill under way: its outcome decides the period.
				if e := b.underWay(j, c); e != nil {
					return Receipt{}, e
				}
				break
			}
			later := j
			later.key, later.attempt, later.price = key, a, Price{Amount: c.Amount, Currency: c.Currency}
			if c.State == claim.StateSucceeded || c.State == claim.StateProcessing {
				r := b.receipt(later, c.StripeID, AlreadyBilled)
				r.Processing = c.State == claim.StateProcessing
				return r, nil
			}
			last, failed = later, c
		}
	}
	e := chargeErr(last, ErrDeclined, failed.LastError, nil)
	e.Code, e.AfterProcessing = failed.FailureCode, !failed.ProcessingAt.IsZero()
	return Receipt{}, e
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

// completedSinceDecline handles a decline Stripe replayed for j's key: Stripe
// replays a key's stored answer whatever became of the PaymentIntent it
// names since, and a customer may have completed that PaymentIntent on
// session meanwhile (Stripe's recovery of an off-session decline). So a
// replayed decline of a PaymentIntent is read again before it fails the
// claim: one that succeeded or is processing is the claim's payment and is
// recorded (done is set); a read that fails leaves the claim pending.
func (b *Biller) completedSinceDecline(ctx context.Context, j job, err error) (_ Receipt, done bool, _ error) {
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusPaymentRequired || se.PaymentIntent == nil ||
		se.PaymentIntent.ID == "" || !replayed(se.LastResponse) {
		return Receipt{}, false, nil
	}
	var pi *stripe.PaymentIntent
	gerr := b.limiter.Wait(ctx)
	if gerr == nil {
		pi, gerr = b.intents.Get(se.PaymentIntent.ID, &stripe.PaymentIntentParams{Params: stripe.Params{Context: ctx}})
	}
	if gerr != nil {
		b.giveUp(context.WithoutCancel(ctx), j, gerr)
		return Receipt{}, true, chargeErr(j, ErrOutcomeUnknown, "Stripe replayed a decline of "+se.PaymentIntent.ID+", which could not be read again", gerr)
	}
	switch pi.Status {
	case stripe.PaymentIntentStatusSucceeded, stripe.PaymentIntentStatusProcessing:
		b.log.LogAttrs(ctx, slogInfo, "billonce: a replayed decline's PaymentIntent was completed since", attrs(j, "stripe_id", pi.ID)...)
		r, rerr := b.record(ctx, j, created{id: pi.ID, status: string(pi.Status)})
		return r, true, rerr
	}
	return Receipt{}, false, nil
}

// firstSendSafe returns the local time before which the first attempt of
// a claim a Run has just won may be sent without asking the store again,
// or the zero time if it must ask.
//
// The claim statement read the database clock after claimedAt: it made
// the row, so no request carried the key before, and leased it to this
// attempt for the lease c records. Until half that lease has passed on the
// local clock, no other runner can have taken the claim over (a takeover
// needs the lease to have ended on the database clock), so nothing else
// sends the key and this send is its first: the window, which starts at
// the claim, cannot be over. The time left in the window at the claim,
// less an attempt's longest duration, bounds it too, so a check reused
// here is always one that a fresh CheckSend would pass, with an attempt's
// whole duration to spare. Retries ask the store, as every send of a
// resumed claim does, and so does every send of a usage report: what a
// meter error report may be about is judged by the key's window on the
// store's clock (see claim's own-send rule), so no usage event may leave
// on the local clock's word alone, even if that clock stopped while the
// database's went on.
func (b *Biller) firstSendSafe(j job, c claim.Claim) time.Time {
	if !j.won || j.rec == nil || j.claimedAt.IsZero() || j.usage != nil {
		return time.Time{}
	}
	attempt := b.policy.AttemptTimeout
	if attempt <= 0 {
		attempt = retry.DefaultAttemptTimeout
	}
	within := min(c.LeaseUntil.Sub(c.UpdatedAt)/2, b.cfg.WindowMargin-c.SentAge-attempt)
	if within <= 0 {
		return time.Time{}
	}
	return j.claimedAt.Add(within)
}

// beforeOnBothClocks reports whether now is before t on the monotonic clock
// and on the wall clock: the monotonic clock stops while the machine
// sleeps, the wall clock does not.
func beforeOnBothClocks(t time.Time) bool {
	if t.IsZero() {
		return false
	}
	now := time.Now()
	return now.Before(t) && now.Round(0).Before(t.Round(0))
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

// wire is what one attempt did on the network.
type wire struct {
	// writes counts the requests written: 0 when nothing was sent (the
	// attempt never left, or net/http never got a connection for it), -1
	// when it cannot be told (a transport other than a *http.Transport, or
	// one that got a connection and wrote nothing that it reported).
	writes int
	// called is set when the request was handed to the HTTP client.
	called bool
	// answered is set when an HTTP answer came back, whatever its status.
	answered bool
}

// create makes one HTTP attempt. It never makes a key: it sends the one it
// is given, in the header and in the metadata.
func (b *Biller) create(ctx context.Context, j job, key idemkey.Key, attempt int) (_ created, _ wire, _ error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return created{}, wire{}, err
	}
	// The last check before the key leaves: the deadline, on the database
	// clock, after any wait.
	var err error
	switch {
	case attempt == 1 && beforeOnBothClocks(j.firstSendBy):
		// The claim's own statement made this check (see firstSendSafe).
		// A stopped run sends nothing more, as the store would have
		// refused: a request cancelled before it is written may look
		// sent to the count below.
		err = ctx.Err()
	case j.rec != nil:
		err = j.rec.check(ctx, key.String(), j.owner)
	default:
		err = b.claims.CheckSend(ctx, key.String(), j.owner, b.cfg.WindowMargin)
	}
	if err != nil {
		return created{}, wire{}, err
	}
	if j.caller != nil {
		var cancel context.CancelFunc
		if dl, ok := ctx.Deadline(); ok {
			ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		} else {
			ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
		}
		defer cancel()
		defer context.AfterFunc(j.caller, cancel)()
	}
	// A request is written only on a connection net/http got for it
	// (GotConn comes before any write, in the caller's goroutine): one
	// that asked for a connection (GetConn) and got none was never sent.
	// Only a *http.Transport is known to send every request it is given
	// that way; any other transport may send it where these hooks do not
	// see (see Biller.traced).
	var wrote atomic.Int32
	var asked, connected, answered atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:              func(string) { asked.Store(true) },
		GotConn:              func(httptrace.GotConnInfo) { connected.Store(true) },
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Add(1) },
		GotFirstResponseByte: func() { answered.Store(true) },
	})
	ctx = idemkey.WithKey(ctx, key)
	meta := map[string]string{MetaKey: key.String(), MetaCustomer: j.customer, MetaPeriod: j.period}
	start := time.Now()
	var out created
	switch {
	case j.usage != nil:
		out, err = b.sendUsage(ctx, j, key)
	case b.cfg.API == PaymentIntents:
		params := &stripe.PaymentIntentParams{
			Amount:        stripe.Int64(j.price.Amount),
			Currency:      stripe.String(j.price.Currency),
			Customer:      stripe.String(j.customer),
			PaymentMethod: stripe.String(j.price.PaymentMethod),
			Confirm:       stripe.Bool(true),
			OffSession:    stripe.Bool(true),
		}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		var pi *stripe.PaymentIntent
		if pi, err = b.intents.New(params); err == nil {
			out = created{id: pi.ID, status: string(pi.Status), replayed: replayed(pi.LastResponse), requestID: requestID(pi.LastResponse)}
			if out.id == "" || out.status == "" {
				err = notAPayment(pi.LastResponse)
			}
		}
	default:
		params := &stripe.ChargeParams{
			Amount:   stripe.Int64(j.price.Amount),
			Currency: stripe.String(j.price.Currency),
			Customer: stripe.String(j.customer),
		}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		var ch *stripe.Charge
		if ch, err = b.charges.New(params); err == nil {
			out = created{id: ch.ID, status: string(ch.Status), replayed: replayed(ch.LastResponse), requestID: requestID(ch.LastResponse)}
			if out.id == "" || out.status == "" {
				err = notAPayment(ch.LastResponse)
			}
		}
	}
	rid := out.requestID
	var se *stripe.Error
	if errors.As(err, &se) {
		rid = se.RequestID
	}
	b.observe(Event{Kind: EventStripeCall, Customer: j.customer, Period: j.period, Key: key.String(), RequestID: rid,
		Attempt: attempt, Duration: time.Since(start), Err: err})
	w := wire{writes: int(wrote.Load()), called: true, answered: err == nil || answered.Load() || httpAnswer(err)}
	if w.writes == 0 && (!b.traced || !asked.Load() || connected.Load()) {
		w.writes = -1
	}
	return out, w, err
}

// httpAnswer reports whether err comes from an HTTP answer: Stripe's error,
// any other status put in its shape, or a spend-cap proxy's refusal.
func httpAnswer(err error) bool {
	var se *stripe.Error
	return proxyRefused(err) || errors.As(err, &se) && se.HTTPStatusCode != 0
}

func replayed(r *stripe.APIResponse) bool {
	return r != nil && r.Header.Get("Idempotent-Replayed") == "true"
}

func requestID(r *stripe.APIResponse) string {
	if r == nil {
		return ""
	}
	return r.RequestID
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

// declinedObject is the Stripe object a decline names, which the failed
// claim records as its own: the PaymentIntent, or else the charge.
func declinedObject(se *stripe.Error) string {
	if se.PaymentIntent != nil && se.PaymentIntent.ID != "" {
		return se.PaymentIntent.ID
	}
	return se.ChargeID
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

// refusedBeforeExecution reports whether err is an answer given before
// Stripe executed the request, so that nothing is stored under its key: a
// spend-cap proxy's refusal, an authentication failure, a rate limit, or a
// refusal of the request itself (Stripe saves no result for a request that
// fails validation).
func refusedBeforeExecution(err error) bool {
	if err == nil {
		return false
	}
	if proxyRefused(err) {
		return true
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return false
	}
	switch c := se.HTTPStatusCode; {
	case c == http.StatusUnauthorized, c == http.StatusForbidden:
		return true
	case c == http.StatusTooManyRequests:
		return se.Code != stripe.ErrorCodeLockTimeout
	case c >= 400 && c < 500 && c != http.StatusConflict && c != http.StatusPaymentRequired:
		return se.Type != stripe.ErrorTypeCard && se.Type != stripe.ErrorTypeIdempotency && !refusedForItem(se)
	}
	return false
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

func (b *Biller) observe(e Event) {
	if b.cfg.Observe != nil {
		b.cfg.Observe(e)
	}
}
