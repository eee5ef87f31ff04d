package billing

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// DefaultSettleAfter is Config.SettleAfter's default: how long a payment
// may be processing before Reconcile reads it from Stripe.
const DefaultSettleAfter = time.Hour

// DefaultEventRetention is Config.EventRetention's default: how long the
// record of an applied webhook event is kept, three times the 30 days for
// which Stripe can resend an event.
const DefaultEventRetention = 90 * 24 * time.Hour

// minEventRetention is the shortest Config.EventRetention: the 30 days
// for which an event can be resent from Stripe's dashboard or API.
const minEventRetention = 30 * 24 * time.Hour

// Payments that settle later
//
// A bank debit (ACH, SEPA, BACS) exists at Stripe long before it settles:
// Stripe answers a charge "pending" or a PaymentIntent "processing", and
// days later the payment succeeds or fails. The claim is then processing
// (claim.StateProcessing): it holds the period, nothing is sent again,
// and its outcome arrives by webhook ([Biller.Webhook]) or by Reconcile
// reading the payment. A payment that fails after processing is failed for
// its key with Stripe's failure code, and like a decline it is billed
// again only by an explicit Rebill.

// updateFromCharge is what a charge object says about its claim's payment:
// the one mapping shared by webhooks and polling. A charge made by a
// PaymentIntent is reported under the PaymentIntent, which is what the
// claim records.
func updateFromCharge(ch *stripe.Charge) claimengine.Update {
	u := claimengine.Update{Key: ch.Metadata[MetaKey], StripeID: ch.ID, Refunded: ch.AmountRefunded, Amount: ch.Amount, Currency: string(ch.Currency)}
	if ch.PaymentIntent != nil && ch.PaymentIntent.ID != "" {
		u.StripeID = ch.PaymentIntent.ID
	}
	switch ch.Status {
	case stripe.ChargeStatusPending:
		u.State = string(claim.StateProcessing)
	case stripe.ChargeStatusSucceeded:
		u.State = string(claim.StateSucceeded)
	case stripe.ChargeStatusFailed:
		u.State, u.FailureCode = string(claim.StateFailed), ch.FailureCode
	}
	return u
}

// updateFromIntent is what a PaymentIntent says about its claim's payment.
// A PaymentIntent that needs a payment method again after being confirmed
// off-session has failed: billonce never confirms it a second time.
func updateFromIntent(pi *stripe.PaymentIntent) claimengine.Update {
	u := claimengine.Update{Key: pi.Metadata[MetaKey], StripeID: pi.ID, Amount: intentPaid(pi), Currency: string(pi.Currency)}
	switch pi.Status {
	case stripe.PaymentIntentStatusProcessing:
		u.State = string(claim.StateProcessing)
	case stripe.PaymentIntentStatusSucceeded:
		u.State = string(claim.StateSucceeded)
	case stripe.PaymentIntentStatusRequiresPaymentMethod, stripe.PaymentIntentStatusCanceled:
		u.State, u.FailureCode = string(claim.StateFailed), string(pi.Status)
		if e := pi.LastPaymentError; e != nil {
			u.FailureCode = string(e.Code)
			if e.DeclineCode != "" {
				u.FailureCode += " (" + string(e.DeclineCode) + ")"
			}
		}
	}
	return u
}

// intentPaid is the amount PaymentIntent pi pays: what it received once
// it succeeded, which is less than its amount when other code captured it
// in part (capture_method manual), and its amount before.
func intentPaid(pi *stripe.PaymentIntent) int64 {
	if pi.Status == stripe.PaymentIntentStatusSucceeded {
		return pi.AmountReceived
	}
	return pi.Amount
}

// applied reports an update that changed a claim to the logger and to
// Config.Observe: a settlement, a refund, a dispute. source names where
// the update came from (an event id, or "poll").
func (b *Biller) applied(ctx context.Context, source string, a claimApplied) {
	c := a.Claim
	log := []slog.Attr{slog.String("customer", c.Customer), slog.String("period", c.Period), slog.String("key", c.Key),
		slog.String("stripe_id", c.StripeID), slog.String("source", source)}
	base := Event{Object: objectOf(c.Endpoint), Customer: c.Customer, Period: c.Period, Key: c.Key, StripeID: c.StripeID}
	if a.Before.State != c.State {
		e := base
		e.Kind = EventSettled
		e.State = string(c.State)
		switch c.State {
		case claim.StateFailed:
			e.Err = failedFrom(c)
			msg := "billonce: payment failed after it was sent; the claim is failed and is not billed again without a Rebill"
			switch {
			case c.RefundOf != "":
				msg = "billonce: refund failed after it was sent; nothing is refunded by its id: refunding again is a person's decision, under a new refund ID"
			case c.Endpoint == endpointTransfers || c.Endpoint == endpointPayouts:
				msg = "billonce: " + strings.TrimSuffix(c.Endpoint, "s") + " failed after it was sent; paying again is a person's decision, under the next attempt"
			}
			b.log.LogAttrs(ctx, slogWarn, msg, append(log, slog.String("failure_code", c.FailureCode), slog.String("was", string(a.Before.State)))...)
		case claim.StateSucceeded:
			b.log.LogAttrs(ctx, slogInfo, "billonce: payment settled", append(log, slog.String("was", string(a.Before.State)))...)
		default:
			b.log.LogAttrs(ctx, slogInfo, "billonce: payment is processing", log...)
		}
		b.observe(e)
	}
	if c.Refunded != a.Before.Refunded {
		e := base
		e.Kind, e.Refunded = EventRefunded, c.Refunded
		b.log.LogAttrs(ctx, slogWarn, "billonce: payment refunded; the claim stays billed: a refund is not a reason to bill again",
			append(log, slog.Int64("refunded", c.Refunded), slog.Int64("amount", c.Amount))...)
		b.observe(e)
	}
	if s := a.Superseded; s.Key != "" {
		b.log.LogAttrs(ctx, slogError, "billonce: a re-bill of the period was stopped, since an earlier attempt's own payment paid it; if the re-bill's key reached Stripe before, its payment is not recorded: look it up by its key",
			append(log, slog.String("stopped_key", s.Key), slog.Int("stopped_attempt", s.Attempt), slog.String("stopped_last_error", s.LastError))...)
	}
	if c.Dispute != a.Before.Dispute {
		e := base
		e.Kind, e.Dispute = EventDisputed, c.Dispute
		b.log.LogAttrs(ctx, slogWarn, "billonce: payment disputed; the claim stays billed: a dispute is not a reason to bill again",
			append(log, slog.String("dispute", c.Dispute))...)
		b.observe(e)
	}
}

// settleProcessing reads from Stripe each of this Biller's claims that
// has been processing for at least Config.SettleAfter, one GET per claim
// under the Biller's rate limit, and applies what it finds. It is how a
// service without webhooks converges.
func (b *Biller) settleProcessing(ctx context.Context, r *runner) error {
	claims, err := b.claims.Unsettled(ctx, b.cfg.Scope, b.cfg.SettleAfter)
	if err != nil {
		return fmt.Errorf("billing: listing processing claims: %w", err)
	}
	var mine []claim.Claim
	for _, c := range claims {
		if c.Attempt = b.attemptOf(c); c.Attempt > 0 {
			mine = append(mine, c)
		}
	}
	r.mu.Lock()
	r.sum.Total += len(mine)
	r.mu.Unlock()
	for _, c := range mine {
		if err := ctx.Err(); err != nil {
			return err
		}
		j := job{account: claimAccount(c), customer: c.Customer, period: c.Period, attempt: c.Attempt, price: Price{Amount: c.Amount, Currency: c.Currency}}
		a, err := b.poll(onAccount(ctx, j.account), c)
		switch {
		case err != nil:
			e := chargeErr(j, nil, "reading processing payment "+c.StripeID, err)
			e.Key = c.Key
			r.settled(j, Receipt{}, e)
		case a.Claim.State == claim.StateFailed:
			r.settled(j, Receipt{}, failedFrom(a.Claim))
		default:
			r.settled(j, Receipt{Customer: c.Customer, Period: c.Period, StripeID: c.StripeID, Amount: c.Amount, Currency: c.Currency,
				Attempt: c.Attempt, Outcome: Reconciled, Processing: a.Claim.State == claim.StateProcessing}, nil)
		}
	}
	return nil
}

// poll reads c's payment from Stripe and applies it.
func (b *Biller) poll(ctx context.Context, c claim.Claim) (claimApplied, error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return claimApplied{}, err
	}
	var u claimengine.Update
	switch {
	case c.Endpoint == endpointInvoices:
		in, err := b.invoices.Get(c.StripeID, &stripe.InvoiceParams{Params: stripe.Params{Context: ctx}})
		if err != nil {
			return claimApplied{}, err
		}
		u = updateFromInvoice("", in)
	case c.Endpoint == endpointPayouts:
		po, err := b.payouts.Get(c.StripeID, &stripe.PayoutParams{Params: stripe.Params{Context: ctx}})
		if err != nil {
			return claimApplied{}, err
		}
		u = updateFromPayout(po)
	case c.Endpoint == endpointRefunds:
		re, err := b.refunds.Get(c.StripeID, &stripe.RefundParams{Params: stripe.Params{Context: ctx}})
		if err != nil {
			return claimApplied{}, err
		}
		u = updateFromRefund(re)
	case strings.HasPrefix(c.StripeID, "pi_"):
		pi, err := b.intents.Get(c.StripeID, &stripe.PaymentIntentParams{Params: stripe.Params{Context: ctx}})
		if err != nil {
			return claimApplied{}, err
		}
		u = updateFromIntent(pi)
	default:
		ch, err := b.charges.Get(c.StripeID, &stripe.ChargeParams{Params: stripe.Params{Context: ctx}})
		if err != nil {
			return claimApplied{}, err
		}
		u = updateFromCharge(ch)
	}
	return b.applyRead(ctx, c, u)
}

// applyRead applies u, what a read from Stripe says of c's payment, to c
// as an event is applied, by the claim store's one rule (the payment is
// the one c recorded, or nothing moves).
func (b *Biller) applyRead(ctx context.Context, c claim.Claim, u claimengine.Update) (claimApplied, error) {
	if u.Key != c.Key {
		return claimApplied{}, fmt.Errorf("payment %s carries key %q in its metadata, not the claim's %q", c.StripeID, u.Key, c.Key)
	}
	u.EventType, u.Created, u.Account = "poll", time.Now(), accountOf(ctx)
	a, err := b.claims.Apply(ctx, u)
	if err != nil {
		return claimApplied{}, err
	}
	if a.Outcome == claimengine.Changed {
		b.applied(ctx, "poll", a)
	}
	return a, nil
}

// pruneEvents deletes the records of webhook events older than
// Config.EventRetention, unless it is negative.
func (b *Biller) pruneEvents(ctx context.Context) error {
	if b.cfg.EventRetention < 0 {
		return nil
	}
	n, err := b.claims.PruneEvents(ctx, b.cfg.EventRetention)
	if n > 0 {
		b.log.LogAttrs(ctx, slogInfo, "billonce: pruned the records of old webhook events",
			slog.Int("pruned", n), duration("older_than", b.cfg.EventRetention))
	}
	if err != nil {
		return fmt.Errorf("billing: pruning webhook event records older than %v (%d deleted): %w", b.cfg.EventRetention, n, err)
	}
	return nil
}
