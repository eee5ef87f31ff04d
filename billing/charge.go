package billing

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// ChargeOptions are the options of one [Biller.Charge] or [Biller.Rebill].
// A nil *ChargeOptions takes every default.
type ChargeOptions struct {
	// Price, when not nil, is charged instead of Config.Price's answer.
	// The price is part of the claim: a later call for the same customer
	// and period with another amount is refused (a [*claim.MismatchError]
	// in the error), never charged.
	Price *Price
	// Account, when set, bills the customer on this connected account
	// ("acct_…"), with the Stripe-Account header: the customer and the
	// payment live on it. The account is part of the claim and of the
	// key: the same customer and period on another account, or on the
	// platform's own, is refused (a [*claim.MismatchError] on "account"),
	// never billed again.
	Account string
}

func (o *ChargeOptions) price() *Price {
	if o == nil {
		return nil
	}
	return o.Price
}

func (o *ChargeOptions) account() string {
	if o == nil {
		return ""
	}
	return o.Account
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
	return b.bill(ctx, opts.account(), customer, period, opts.price(), 1)
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
//
// A PaymentIntent declined off session stays confirmable: its customer
// may complete it on session (Stripe's recovery of an
// authentication_required decline), and after a re-bill that would pay
// the period twice. So before a re-bill's key is sent (first sent,
// resumed, or sent again past its deadline), the PaymentIntent that each
// earlier attempt's failed claim records is canceled at Stripe, with a
// key derived from that attempt's key; a cancel made again is Stripe's
// replay, and one already canceled (by a person, say) is as good. If
// Stripe refuses because the PaymentIntent succeeded or is processing,
// its customer completed it meanwhile and it pays the period: nothing is
// sent, a succeeded one is recorded on its attempt's claim (a processing
// one is, by its success event, once it settles), and Rebill returns that
// attempt's receipt, AlreadyBilled (with Processing for one still
// processing); one completed for another amount or currency than its
// claim's (changed by another writer) does not show the period paid, and
// Rebill sends nothing and returns ErrNeedsReconciliation, for a person to
// settle. A cancel that gets no answer sends nothing: the error is
// ErrOutcomeUnknown, and the next Rebill cancels again with the same key.
// A declined charge (the Charges API) cannot be completed later, and is
// left as it is.
func (b *Biller) Rebill(ctx context.Context, customer, period string, attempt int, opts *ChargeOptions) (Receipt, error) {
	if attempt < 2 || attempt > maxAttempt {
		return Receipt{}, chargeErr(job{customer: customer, period: period, attempt: attempt}, nil, "",
			invalid("Rebill attempt %d: re-bills are numbered from 2 (attempt 1 is Charge) to %d", attempt, maxAttempt))
	}
	return b.bill(ctx, opts.account(), customer, period, opts.price(), attempt)
}

// checkRebill looks at the attempts before a re-bill that has no claim yet.
// If one of them paid (or is processing), the period is billed: its
// receipt is returned with billed set, and nothing is claimed or sent. A
// re-bill whose attempt-1 has no claim is refused: a re-bill follows the
// attempt that declined, so that Charge and Run, which walk the attempts
// in order from the latest declined one, find a re-bill that succeeded
// and report the period as billed. An earlier attempt without a claim (a
// failed claim deleted by hand) is no such gap: the claim store answers a
// Charge of it with the later attempts' claims. Its errors are
// *ChargeError.
func (b *Biller) checkRebill(ctx context.Context, j job) (r Receipt, billed bool, err error) {
	_, err = b.claims.Get(ctx, j.key.String())
	if !errors.Is(err, claim.ErrNotFound) {
		if err != nil {
			return Receipt{}, false, chargeErr(j, nil, "looking up the re-bill's claim", err)
		}
		return Receipt{}, false, nil // this re-bill is claimed already: resume or report it
	}
	for a := 1; a < j.attempt; a++ {
		key, err := b.keyFor(j.account, j.customer, j.period, a)
		if err != nil {
			return Receipt{}, false, chargeErr(j, nil, "", invalid("%v", err))
		}
		c, err := b.claims.Get(ctx, key.String())
		switch {
		case errors.Is(err, claim.ErrNotFound) && a < j.attempt-1:
			continue
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
// before anything is sent, for the claim of the attempt before it.
// checkRebill saw it, but one that was pending then (a re-bill under
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
	if a := j.attempt - 1; a >= 1 {
		key, err := b.keyFor(j.account, j.customer, j.period, a)
		if err != nil {
			return Receipt{}, true, chargeErr(j, nil, "", invalid("%v", err))
		}
		_, err = b.claims.Get(ctx, key.String())
		if err == nil {
			return Receipt{}, false, nil
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
		e := b.needs(ctx, j, fmt.Sprintf("attempt %d has no claim in scope %s any more, but this re-bill's key may have been sent before it went; %s; nothing was sent and the claim stays pending: restore attempt %d's claim if it was deleted by mistake, or look the key up in Stripe and record it with billonce resolve; Reconcile settles it once the search can tell",
			a, b.cfg.Scope, why, a), nil)
		if serr == nil {
			e.Until = time.Now().Add(after - c.SentAge)
		}
		return e
	})
}

// prepare checks one charge and derives its key. Its errors are
// *ChargeError.
func (b *Biller) prepare(ctx context.Context, account, customer, period string, p *Price, attempt int) (job, error) {
	j := job{kind: charges{}, account: account, customer: customer, period: period, attempt: attempt}
	if err := errors.Join(checkAccount(account), checkID("customer ID", customer)); err != nil {
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
	key, err := b.keyFor(account, customer, period, attempt)
	if err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.price, j.key, j.owner = price, key, b.newOwner()
	return j, nil
}

// keyFor is the key of (scope, customer, period, attempt) on account,
// derived once before anything can retry. The platform's own keys (account
// "") are those billonce has always derived.
func (b *Biller) keyFor(account, customer, period string, attempt int) (idemkey.Key, error) {
	return idemkey.For(b.cfg.Scope, onAccountParts(account, customer, period, strconv.Itoa(attempt))...)
}

// onAccountParts are the parts of a key on account: parts themselves for
// the platform's own, and the account after them for a connected one.
func onAccountParts(account string, parts ...string) []string {
	if account == "" {
		return parts
	}
	return append(parts, "account", account)
}

// Key returns the idempotency key of customer's charge for period at billing
// attempt attempt (1 for Charge), on the platform's own account, which its
// Stripe object carries in the metadata billonce_key: look a charge up with
// it before it is made, or match your own records to Stripe's. A charge
// on a connected account has a key of its own, in its Receipt.Key.
func (b *Biller) Key(customer, period string, attempt int) (idemkey.Key, error) {
	return b.keyFor("", customer, period, attempt)
}

func (b *Biller) bill(ctx context.Context, account, customer, period string, p *Price, attempt int) (Receipt, error) {
	j, err := b.prepare(ctx, account, customer, period, p, attempt)
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

// afterFailure answers for a failed attempt from the claims of its
// period, read at once: an attempt that paid it (succeeded, or
// processing), before or after this one, means the period is billed, and
// its receipt is returned; a later one still under way (pending) is
// ErrInProgress; otherwise the latest failure, whose *ChargeError names the
// next attempt to re-bill with. failed is the claim the claim store
// answered with: j's own, or a later attempt's when j's own failed claim
// was deleted by hand. Claims of other scopes and kinds are not attempts
// of this Biller's and are left out. Should the period's claims not be
// readable, failed answers.
func (b *Biller) afterFailure(ctx context.Context, j job, failed claim.Claim) (Receipt, error) {
	last := j
	if a, ok := b.attemptJob(j, failed); ok {
		last.key, last.attempt, last.price = a.key, a.attempt, a.price
	}
	cs, err := b.claims.Period(ctx, j.customer, j.period)
	if err != nil {
		b.log.LogAttrs(ctx, slogWarn, "billonce: reading the period's attempts failed; answering with the failed claim", attrs(j, "error", err)...)
	}
	for _, c := range cs {
		a, ok := b.attemptJob(j, c)
		if !ok {
			continue
		}
		switch c.State {
		case claim.StateSucceeded, claim.StateProcessing:
			r := b.receipt(a, c.StripeID, AlreadyBilled)
			r.Processing = c.State == claim.StateProcessing
			return r, nil
		case claim.StatePending:
			// A re-bill under way: its outcome decides the period.
			if a.attempt > j.attempt {
				if e := b.underWay(j, c); e != nil {
					return Receipt{}, e
				}
			}
		case claim.StateFailed:
			if a.attempt > last.attempt {
				last, failed = a, c
			}
		}
	}
	e := chargeErr(last, ErrDeclined, failed.LastError, nil)
	e.Code, e.AfterProcessing = failed.FailureCode, !failed.ProcessingAt.IsZero()
	return Receipt{}, e
}

// attemptJob returns j as the attempt c is a claim of, when c is one of
// this Biller's charge attempts of j's customer and period (see attemptOf)
// whose key is that attempt's: an invoice or usage claim of the period is
// not.
func (b *Biller) attemptJob(j job, c claim.Claim) (job, bool) {
	n := b.attemptOf(c)
	if n < 1 || n > maxAttempt || c.Customer != j.customer || c.Period != j.period || c.Account != j.account {
		return job{}, false
	}
	key, err := b.keyFor(j.account, j.customer, j.period, n)
	if err != nil || key.String() != c.Key {
		return job{}, false
	}
	a := j
	a.key, a.attempt, a.price = key, n, Price{Amount: c.Amount, Currency: c.Currency}
	return a, true
}

// completedSinceDecline handles a decline Stripe replayed for j's key: Stripe
// replays a key's stored answer whatever became of the PaymentIntent it
// names since, and a customer may have completed that PaymentIntent on
// session meanwhile (Stripe's recovery of an off-session decline). So a
// replayed decline of a PaymentIntent is read again before it fails the
// claim: one that succeeded or is processing for the claim's customer,
// amount and currency (see ownHits) is the claim's payment and is recorded
// (done is set); one completed for another amount, changed by another
// writer, needs a person (ErrNeedsReconciliation, the claim left pending);
// a read that fails leaves the claim pending.
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
		if _, other := b.ownHits(j, []object{intentObject(pi)}); other != nil {
			e := b.needs(ctx, j, changedIntent(pi, j.price), nil)
			e.StripeID = pi.ID
			return Receipt{}, true, e
		}
		b.log.LogAttrs(ctx, slogInfo, "billonce: a replayed decline's PaymentIntent was completed since", attrs(j, "stripe_id", pi.ID)...)
		r, rerr := b.record(ctx, j, object{id: pi.ID, status: string(pi.Status)})
		return r, true, rerr
	}
	return Receipt{}, false, nil
}

// changedIntent says why PaymentIntent pi, declined for p and completed
// since for another customer, amount or currency (changed by another
// writer, such as the dashboard), neither settles its claim nor lets the
// period be billed again: what its customer paid is not the claim's price.
func changedIntent(pi *stripe.PaymentIntent, p Price) string {
	o := intentObject(pi)
	return fmt.Sprintf("PaymentIntent %s was declined for %d %s and is %s since for %d %s (%s): another writer changed it before its customer completed it, so it does not show the claim's price paid, and billing the period again could charge its customer twice; nothing was sent: settle the period in Stripe, then record the claim with billonce resolve",
		o.id, p.Amount, p.Currency, o.status, o.amount, o.currency, o.customer)
}

// cancelDeclined cancels at Stripe, before a re-bill's key is sent, the
// PaymentIntent that each earlier attempt's failed claim records: a
// PaymentIntent declined off session can still be completed by its
// customer on session (Stripe's recovery of an authentication_required
// decline), which after the re-bill would pay the period twice. A
// declined charge cannot be completed later, and is left as it is.
//
// It runs before every send of the re-bill, the first one, a resume, a
// send after a lookup reopened the key's window, so that the re-bill's
// key never leaves while an earlier attempt's PaymentIntent can still
// succeed. Each cancel is a write through the guard, with a key derived
// from its attempt's key: a cancel made again (by the next re-bill, or a
// resume) is Stripe's replay.
//
//   - Canceled, now or before: the re-bill may be sent.
//   - Refused because the PaymentIntent succeeded or is processing (its
//     customer completed it meanwhile): it pays the period. The re-bill
//     sends nothing and answers that attempt's receipt, AlreadyBilled (see
//     paidBefore), or ErrNeedsReconciliation when it was completed for
//     another amount or currency than its claim's.
//   - No answer: whether it can still be completed is unknown, so nothing
//     is sent (ErrOutcomeUnknown); the next call cancels again with the
//     same key.
//   - Any other refusal: nothing is sent, ErrNeedsReconciliation.
//
// When stop is set, nothing may be sent and r, err are the call's answer;
// the claim is given up as one whose key never ran, or a person's to
// settle. Its errors are *ChargeError.
func (b *Biller) cancelDeclined(ctx context.Context, w writer, j job, c claim.Claim) (r Receipt, stop bool, err error) {
	if j.attempt <= 1 {
		return Receipt{}, false, nil
	}
	cs, err := b.claims.Period(ctx, j.customer, j.period)
	if err != nil {
		err = chargeErr(j, nil, "looking up the attempts before sending", err)
		b.giveUp(context.WithoutCancel(ctx), j, err)
		return Receipt{}, true, err
	}
	for _, earlier := range cs {
		a, ok := b.attemptJob(j, earlier)
		if !ok || a.attempt >= j.attempt || earlier.State != claim.StateFailed || !strings.HasPrefix(earlier.StripeID, "pi_") {
			continue // an attempt without a claim has nothing to cancel; a gap is checkChain's
		}
		if r, stop, err := b.cancelIntent(ctx, w, j, c, earlier, a.attempt); stop {
			return r, true, err
		}
	}
	return Receipt{}, false, nil
}

// cancelIntent cancels the PaymentIntent of earlier, attempt a's failed
// claim, before j's key is sent (see cancelDeclined).
func (b *Biller) cancelIntent(ctx context.Context, w writer, j job, c, earlier claim.Claim, a int) (Receipt, bool, error) {
	id := earlier.StripeID
	key, err := idemkey.For(b.cfg.Scope, earlier.Key, "cancel")
	if err != nil {
		return Receipt{}, true, chargeErr(j, nil, "", invalid("%v", err))
	}
	// The cancel's writes are not the re-bill's: whether its own key may
	// have run (j.ran, j.won) stays as it was.
	cj := j
	out, err := b.guarded(ctx, &cj, key, nil, func(ctx context.Context, key idemkey.Key) (object, error) {
		params := &stripe.PaymentIntentCancelParams{CancellationReason: stripe.String(string(stripe.PaymentIntentCancellationReasonAbandoned))}
		params.Context, params.IdempotencyKey = ctx, stripe.String(key.String())
		pi, err := b.intents.Cancel(id, params)
		if err != nil {
			return object{}, err
		}
		out := object{id: pi.ID, status: string(pi.Status), replayed: replayed(pi.LastResponse), requestID: requestID(pi.LastResponse)}
		if out.id != id || out.status == "" {
			return out, notAPayment(pi.LastResponse)
		}
		return out, nil
	})
	what := fmt.Sprintf("attempt %d's declined PaymentIntent %s", a, id)
	var se *stripe.Error
	switch {
	case err == nil && out.status == string(stripe.PaymentIntentStatusCanceled):
		return Receipt{}, false, nil
	case err == nil:
		// Stripe answers a cancel with the canceled PaymentIntent: read
		// what became of this one.
		err = fmt.Errorf("the cancel was answered with the PaymentIntent %s", out.status)
	case errors.As(err, &se) && se.Code == stripe.ErrorCodePaymentIntentUnexpectedState:
		// Canceled already, or completed meanwhile: read which.
	default:
		if r, stopped, serr := b.sendStopped(ctx, w, j, c, err); stopped {
			return r, true, serr
		}
		if errors.As(err, &se) && !outcomeUnknown(err) && !StopsRun(err) {
			return Receipt{}, true, b.needs(ctx, j, fmt.Sprintf("Stripe refused to cancel %s (%s: %s), which its customer could still complete; nothing was sent: cancel it in Stripe, then call again", what, se.Code, se.Msg), se)
		}
		b.giveUp(context.WithoutCancel(ctx), j, err)
		if StopsRun(err) {
			return Receipt{}, true, chargeErr(j, nil, "cancelling "+what, err)
		}
		b.log.LogAttrs(ctx, slogWarn, "billonce: cancelling a declined attempt's PaymentIntent before a re-bill got no answer; nothing was sent", attrs(j, "stripe_id", id, "error", err)...)
		return Receipt{}, true, chargeErr(j, ErrOutcomeUnknown, "cancelling "+what+", which its customer could still complete, got no answer; nothing was sent, and the next call cancels it again with the same key", err)
	}
	pi, rerr := readRetried(ctx, b, j, func(ctx context.Context) (*stripe.PaymentIntent, error) {
		if err := b.limiter.Wait(ctx); err != nil {
			return nil, err
		}
		return b.intents.Get(id, &stripe.PaymentIntentParams{Params: stripe.Params{Context: ctx}})
	})
	switch {
	case rerr != nil:
		b.giveUp(context.WithoutCancel(ctx), j, rerr)
		return Receipt{}, true, chargeErr(j, ErrOutcomeUnknown, fmt.Sprintf("Stripe did not cancel %s (%v), and reading it failed; nothing was sent, and the next call cancels it again", what, err), rerr)
	case pi.Status == stripe.PaymentIntentStatusCanceled:
		return Receipt{}, false, nil
	case pi.Status == stripe.PaymentIntentStatusSucceeded || pi.Status == stripe.PaymentIntentStatusProcessing:
		r, err := b.paidBefore(ctx, j, earlier, a, pi)
		return r, true, err
	}
	// Refused in a state it has left (processing, then failed): the next
	// call cancels it.
	left := fmt.Errorf("%s was not canceled, and is %s now; nothing was sent, and the next call cancels it: %w", what, pi.Status, err)
	b.giveUp(context.WithoutCancel(ctx), j, left)
	return Receipt{}, true, chargeErr(j, ErrOutcomeUnknown, "", left)
}

// paidBefore answers for a re-bill j whose cancel of attempt a's
// PaymentIntent pi found it succeeded or processing: its customer
// completed it, and it pays the period. Nothing of the re-bill is sent:
// its claim is given up (abandoned, since its key never left; a resumed
// one released, for the success to stop). A succeeded PaymentIntent is
// recorded on earlier, its failed claim, by the claim store's one rule
// (its own payment succeeded after it failed); a processing one is
// recorded by its success event, or the next call's cancel, once it
// settles. The answer is attempt a's receipt, AlreadyBilled.
func (b *Biller) paidBefore(ctx context.Context, j job, earlier claim.Claim, a int, pi *stripe.PaymentIntent) (Receipt, error) {
	paid := j
	paid.attempt, paid.price = a, Price{Amount: earlier.Amount, Currency: earlier.Currency}
	if k, err := b.keyFor(j.account, j.customer, j.period, a); err == nil {
		paid.key = k
	}
	if _, other := b.ownHits(paid, []object{intentObject(pi)}); other != nil {
		why := changedIntent(pi, paid.price)
		b.giveUp(context.WithoutCancel(ctx), j, errors.New(why))
		b.log.LogAttrs(ctx, slogWarn, "billonce: claim needs reconciliation; nothing more was sent", attrs(paid, "reason", why, "stripe_id", pi.ID)...)
		e := chargeErr(paid, ErrNeedsReconciliation, why, nil)
		e.StripeID = pi.ID
		return Receipt{}, e
	}
	b.log.LogAttrs(ctx, slogInfo, "billonce: a declined attempt's PaymentIntent was completed by its customer and pays the period; the re-bill sends nothing",
		attrs(j, "stripe_id", pi.ID, "paid_attempt", a, "status", pi.Status)...)
	b.giveUp(context.WithoutCancel(ctx), j, fmt.Errorf("attempt %d's PaymentIntent %s is %s: it pays the period", a, pi.ID, pi.Status))
	if pi.Status == stripe.PaymentIntentStatusSucceeded {
		if _, err := b.applyRead(ctx, earlier, updateFromIntent(pi)); err != nil {
			e := chargeErr(paid, ErrNotRecorded, "attempt's PaymentIntent succeeded after its decline, and pays the period", err)
			e.StripeID = pi.ID
			return Receipt{}, e
		}
	}
	r := b.receipt(paid, pi.ID, AlreadyBilled)
	r.Processing = pi.Status == stripe.PaymentIntentStatusProcessing
	return r, nil
}

// charges is the kind of a payment made by one write: a charge, or a
// PaymentIntent confirmed off-session (Config.API). Its key is
// (scope, customer, period, attempt); past the key's window its payment
// is found by Stripe's search on its metadata.
type charges struct{}

func (charges) endpoint(b *Biller) string     { return b.endpoint }
func (charges) describe(*claimengine.Request) {}
func (charges) alreadyThere(error) bool       { return false }
func (charges) localFirstSend() bool          { return true }

// send sends the claim's payment, once the PaymentIntents of the
// attempts before it are canceled (see cancelDeclined).
func (k charges) send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	if r, stop, err := b.cancelDeclined(ctx, k, j, c); stop {
		return r, err
	}
	return b.sendOnce(ctx, k, j, c)
}

func (charges) failed(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.afterFailure(ctx, j, c)
}

// ready checks a re-bill's earlier attempts (see checkChain), and looks a
// resumed claim up first when its key went with another endpoint or
// credential.
func (charges) ready(ctx context.Context, b *Biller, j *job, c claim.Claim) (Receipt, bool, error) {
	if r, stop, err := b.checkChain(ctx, *j, c); stop {
		return r, true, err
	}
	if !j.won && b.moved(*j, c) {
		r, err := b.reconcile(ctx, *j, c)
		return r, true, err
	}
	return Receipt{}, false, nil
}

func (charges) lookup(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.reconcile(ctx, j, c)
}

func (k charges) findOwn(ctx context.Context, b *Biller, j job) (object, bool) {
	return b.findOwn(ctx, k, j)
}

// find searches Stripe for the payments that carry j's key.
func (charges) find(ctx context.Context, b *Biller, j job) ([]object, error) {
	return b.search(ctx, j.key)
}

func (charges) refused(ctx context.Context, b *Biller, j job, err error) (Receipt, bool, error) {
	return b.completedSinceDecline(ctx, j, err)
}

// write makes the payment: a charge, or a PaymentIntent confirmed
// off-session, carrying the key in its metadata too.
func (charges) write(ctx context.Context, b *Biller, j job, key idemkey.Key) (object, error) {
	meta := map[string]string{MetaKey: key.String(), MetaCustomer: j.customer, MetaPeriod: j.period}
	if b.cfg.API == PaymentIntents {
		params := &stripe.PaymentIntentParams{
			Amount:        stripe.Int64(j.price.Amount),
			Currency:      stripe.String(j.price.Currency),
			Customer:      stripe.String(j.customer),
			PaymentMethod: stripe.String(j.price.PaymentMethod),
			Confirm:       stripe.Bool(true),
			OffSession:    stripe.Bool(true),
		}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		pi, err := b.intents.New(params)
		if err != nil {
			return object{}, err
		}
		out := object{id: pi.ID, status: string(pi.Status), replayed: replayed(pi.LastResponse), requestID: requestID(pi.LastResponse)}
		if out.id == "" || out.status == "" {
			return out, notAPayment(pi.LastResponse)
		}
		return out, nil
	}
	params := &stripe.ChargeParams{
		Amount:   stripe.Int64(j.price.Amount),
		Currency: stripe.String(j.price.Currency),
		Customer: stripe.String(j.customer),
	}
	params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
	ch, err := b.charges.New(params)
	if err != nil {
		return object{}, err
	}
	out := object{id: ch.ID, status: string(ch.Status), replayed: replayed(ch.LastResponse), requestID: requestID(ch.LastResponse)}
	if out.id == "" || out.status == "" {
		return out, notAPayment(ch.LastResponse)
	}
	return out, nil
}
