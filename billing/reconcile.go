package billing

import (
	"context"
	"fmt"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/retry"
)

// reconcile settles a pending claim older than the window margin (I5).
// Stripe may have forgotten the key, so sending it again could make a second
// charge if the first one exists. Stripe's search by metadata decides:
//
//   - one object found: its outcome is recorded; nothing is sent;
//   - none found: no charge exists for the key (the claim is older than the
//     window margin, far longer than search takes to index a charge, and any
//     more recent send with this key is still remembered by Stripe and would
//     be replayed), so the key is sent again;
//   - search failed or found several objects: *NeedsReconciliationError;
//     nothing is sent.
func (b *Biller) reconcile(ctx context.Context, j job, c claim.Claim) (Receipt, error) {
	b.log.LogAttrs(ctx, slogWarn, "billonce: pending claim past the window margin; searching Stripe before sending",
		attrs(j, "age", c.Age.Round(time.Minute))...)
	found, err := retry.Do(ctx, j.key, b.policyFor(ctx, j), func(ctx context.Context, key idemkey.Key) ([]created, error) {
		return b.search(ctx, key)
	})
	needs := func(reason string) (Receipt, error) {
		b.release(context.WithoutCancel(ctx), j, fmt.Errorf("reconciliation: %s", reason))
		return Receipt{}, &NeedsReconciliationError{Customer: j.customer, Period: j.period, Key: j.key.String(), Age: c.Age, Reason: reason}
	}
	switch {
	case err != nil:
		return needs("Stripe search failed: " + err.Error())
	case len(found) > 1:
		return needs(fmt.Sprintf("Stripe search found %d objects for one key", len(found)))
	case len(found) == 1:
		b.log.LogAttrs(ctx, slogInfo, "billonce: reconciled a pending claim from Stripe search", attrs(j, "stripe_id", found[0].id)...)
		r, err := b.record(ctx, j, found[0])
		if err == nil {
			r.How = Reconciled
		}
		return r, err
	}
	b.log.LogAttrs(ctx, slogInfo, "billonce: Stripe has no charge for the pending claim; sending its key again", attrs(j)...)
	return b.send(ctx, j, c)
}

// search finds the objects whose metadata carries key.
func (b *Biller) search(ctx context.Context, key idemkey.Key) ([]created, error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	query := fmt.Sprintf("metadata['%s']:'%s'", MetaKey, key.String())
	var out []created
	if b.cfg.API == PaymentIntents {
		params := &stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: query, Context: ctx, Single: true}}
		it := b.intents.Search(params)
		for it.Next() {
			pi := it.PaymentIntent()
			out = append(out, created{id: pi.ID, status: string(pi.Status)})
		}
		return out, it.Err()
	}
	params := &stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: query, Context: ctx, Single: true}}
	it := b.charges.Search(params)
	for it.Next() {
		ch := it.Charge()
		out = append(out, created{id: ch.ID, status: string(ch.Status)})
	}
	return out, it.Err()
}

// Reconcile settles the claims that runners left pending and no longer hold
// (crashed, stopped, or gave up with an unknown outcome), across all periods:
// each is resumed with its own key, or, past the window margin, looked up in
// Stripe first. Run does the same for the customers it is given; Reconcile
// catches those no run will visit again. Claims are settled one at a time;
// of opts only Progress is used.
func (b *Biller) Reconcile(ctx context.Context, opts *RunOptions) (Summary, error) {
	start := time.Now()
	stale, err := b.cfg.Claims.Stale(ctx)
	if err != nil {
		return Summary{}, fmt.Errorf("billing: listing pending claims: %w", err)
	}
	r := &runner{b: b, o: &RunOptions{}, start: start}
	if opts != nil {
		r.o.Progress = opts.Progress
	}
	r.sum.Total = len(stale)
	ctx, r.cancel = context.WithCancel(ctx)
	defer r.cancel()
	for _, c := range stale {
		if ctx.Err() != nil {
			break
		}
		j, err := b.jobFromClaim(ctx, c)
		if err != nil {
			r.settled(job{customer: c.Customer, period: c.Period}, Receipt{}, err)
			continue
		}
		res, err := b.cfg.Claims.Claim(ctx, j.request())
		if err != nil {
			r.settled(j, Receipt{}, fmt.Errorf("billing: claiming customer %s, period %s: %w", j.customer, j.period, err))
			continue
		}
		rc, err := b.settle(ctx, j, res)
		r.settled(j, rc, err)
	}
	sum := r.sum
	sum.Elapsed = time.Since(start)
	if r.stopErr != nil {
		return sum, fmt.Errorf("billing: reconciliation stopped: %w", r.stopErr)
	}
	return sum, ctx.Err()
}

// jobFromClaim rebuilds the charge a pending claim stands for, with the
// claim's own key and price (I4).
func (b *Biller) jobFromClaim(ctx context.Context, c claim.Claim) (job, error) {
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
	// The re-bill attempt number is not on the claim; the key carries it.
	return job{customer: c.Customer, period: c.Period, price: p, key: key, owner: b.newOwner()}, nil
}
