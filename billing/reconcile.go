package billing

import (
	"cmp"
	"context"
	"fmt"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/lock"
)

// ReconcileOptions tunes a [Biller.Reconcile]. A nil *ReconcileOptions
// takes every default.
type ReconcileOptions struct {
	// Progress, when set, is called after each claim is settled.
	Progress func(Progress)
	// Lock, when set, makes Reconcile take the lock named LockName first; if
	// another runner holds it, Reconcile returns ErrRunHeldElsewhere.
	Lock lock.Locker
	// LockName defaults to "billonce-reconcile:<scope>".
	LockName string
}

// Reconcile settles the claims that runners left pending and no longer hold
// (crashed, stopped, or gave up with an unknown outcome), across all periods:
// each is resumed with its own key, or, past the window margin, looked up in
// Stripe first. Run does the same for the customers it is given; Reconcile
// catches those no run will visit again. Claims are settled one at a time.
//
// Reconcile settles only the claims of its own Config.Scope, and claims of
// unknown scope (made before scopes were recorded) whose key this Biller
// derives: another product's claims on the same table are left to that
// product's Biller.
//
// Last, Reconcile deletes the records of webhook events older than
// Config.EventRetention (90 days by default) from the claim store, a batch
// at a time: Reconcile is the job an operator already schedules, and the
// records are needed only while Stripe may still deliver an event again.
// A failure to prune is returned, with the complete Summary.
func (b *Biller) Reconcile(ctx context.Context, opts *ReconcileOptions) (Summary, error) {
	var o ReconcileOptions
	if opts != nil {
		o = *opts
	}
	if o.Lock != nil && nilness.Is(o.Lock) {
		return Summary{}, invalid("ReconcileOptions.Lock is a nil %T: check the error of the constructor (lock.NewAdvisory), or leave Lock nil", o.Lock)
	}
	name := cmp.Or(o.LockName, "billonce-reconcile:"+b.cfg.Scope)
	return locked(ctx, o.Lock, name, func(ctx context.Context) (Summary, error) {
		return b.reconcileAll(ctx, o.Progress)
	})
}

func (b *Biller) reconcileAll(ctx context.Context, progress func(Progress)) (Summary, error) {
	start := time.Now()
	listed, err := b.claims.Stale(ctx, b.cfg.Scope)
	if err != nil {
		return Summary{}, fmt.Errorf("billing: listing pending claims: %w", err)
	}
	var stale []claim.Claim
	for _, c := range listed {
		if c.Attempt = b.attemptOf(c); c.Attempt > 0 {
			stale = append(stale, c)
		}
	}
	r := &runner{b: b, o: &RunOptions{Progress: progress}, start: start}
	r.sum.Total = len(stale)
	caller := ctx
	ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	for _, c := range stale {
		if ctx.Err() != nil {
			break
		}
		j, err := b.jobFromClaim(ctx, c)
		if err != nil {
			j := job{account: c.Account, customer: c.Customer, period: c.Period, attempt: c.Attempt}
			r.settled(j, Receipt{}, asChargeError(j, err))
			continue
		}
		res, err := b.claims.Claim(ctx, b.request(j))
		if err != nil {
			r.settled(j, Receipt{}, chargeErr(j, nil, "claiming", err))
			continue
		}
		j.caller = caller
		rc, err := b.settle(ctx, j, res)
		r.settled(j, rc, err)
	}
	if ctx.Err() == nil && r.stopErr == nil {
		if err := b.settleProcessing(ctx, r); err != nil && ctx.Err() == nil {
			return r.sum, err
		}
	}
	var pruneErr error
	if ctx.Err() == nil && r.stopErr == nil {
		pruneErr = b.pruneEvents(ctx)
	}
	sum := r.sum
	sum.Elapsed = time.Since(start)
	if r.stopErr != nil {
		return sum, fmt.Errorf("billing: reconciliation stopped: %w", r.stopErr)
	}
	if err := ctx.Err(); err != nil {
		return sum, err
	}
	return sum, pruneErr
}

// jobFromClaim rebuilds the charge a pending claim stands for, with the
// claim's own key and price.
func (b *Biller) jobFromClaim(ctx context.Context, c claim.Claim) (job, error) {
	c.Account = claimAccount(c)
	j, err := b.claimJob(onAccount(ctx, c.Account), c)
	j.account = c.Account
	return j, err
}

// claimJob is jobFromClaim's work, on the claim's account.
func (b *Biller) claimJob(ctx context.Context, c claim.Claim) (job, error) {
	if c.Endpoint == endpointInvoices {
		return b.invoiceJob(ctx, c)
	}
	if c.Endpoint == endpointMeterEvents {
		return b.usageFromClaim(ctx, c)
	}
	if c.RefundOf != "" || c.Endpoint == endpointRefunds {
		return b.refundJob(ctx, c)
	}
	if c.Endpoint == endpointTransfers || c.Endpoint == endpointPayouts {
		return b.moneyOutJob(c)
	}
	key, err := idemkey.Parse(c.Key)
	if err != nil {
		return job{}, fmt.Errorf("billing: claim for customer %s, period %s has an unusable key: %w", c.Customer, c.Period, err)
	}
	p := Price{Amount: c.Amount, Currency: c.Currency}
	if b.cfg.API == PaymentIntents {
		if b.cfg.Price == nil {
			return job{}, invalid("resuming a PaymentIntents claim needs Config.Price for the payment method")
		}
		cur, err := b.cfg.Price(ctx, c.Customer, c.Period)
		if err != nil {
			return job{}, fmt.Errorf("billing: price for customer %s, period %s: %w", c.Customer, c.Period, err)
		}
		p.PaymentMethod = cur.PaymentMethod
	}
	if p, err = checkPrice(p, b.cfg.API); err != nil {
		return job{}, err
	}
	return job{kind: charges{}, customer: c.Customer, period: c.Period, price: p, key: key, attempt: c.Attempt, owner: b.newOwner()}, nil
}

// maxLegacyAttempt bounds the attempts attemptOf tries for a claim that
// does not record its own.
const maxLegacyAttempt = 100

// attemptOf returns the billing attempt c's key stands for if this Biller
// derives that key, 0 if it does not. Claims made before scopes and
// attempts were recorded are recognised by deriving their key again.
func (b *Biller) attemptOf(c claim.Claim) int {
	if c.Scope != "" {
		if c.Scope != b.cfg.Scope {
			return 0
		}
		return max(c.Attempt, 1)
	}
	for a := 1; a <= maxLegacyAttempt; a++ {
		if k, err := b.keyFor(c.Account, c.Customer, c.Period, a); err == nil && k.String() == c.Key {
			return a
		}
	}
	return 0
}
