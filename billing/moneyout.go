package billing

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// Money going out to connected accounts: a transfer from the platform's
// balance to an account, a payout from an account's balance to its bank.
// Each is once per (account, period, attempt): its claim's customer is
// the account and its period "transfer <period>" or "payout <period>", so
// that the claim table holds one live transfer and one live payout per
// account and period, on every replica; a failed one is paid again only
// under the next attempt, a person's decision.

const (
	endpointTransfers = "transfers"
	endpointPayouts   = "payouts"
)

// MoneyOutOptions are the options of one [Biller.Transfer] or
// [Biller.Payout]. A nil *MoneyOutOptions takes every default.
type MoneyOutOptions struct {
	// Attempt numbers the transfers (payouts) of one account and period:
	// 0 or 1 for the first. After one failed (Stripe refused it, or a
	// payout failed at the bank, even after it was paid), paying again is
	// a person's decision: the next number, which needs the one before it
	// failed. Called while an earlier attempt is still being sent or
	// pending with an unknown outcome, it waits for that outcome:
	// ErrInProgress, as a re-bill does.
	Attempt int
}

func (o *MoneyOutOptions) attempt() int {
	if o == nil || o.Attempt == 0 {
		return 1
	}
	return o.Attempt
}

// Transfer moves p from the platform's balance to connected account
// account for period, exactly once per (account, period, attempt), as a
// Stripe transfer with a transfer group of the account's period
// ("billonce <scope> <period>") and the claim's key in its metadata. It
// is claimed before it is sent, and sent through the same guard as a
// charge; past the key's window it is found by listing the account's
// transfers of the group; one made by another attempt of the period that
// the claim table has no record of (rows lost, or restored from an older
// copy) stops it, ErrNeedsReconciliation, and nothing is sent (the same
// for a payout, unless that payout failed). A platform balance short of it is Stripe's
// balance_insufficient: the claim fails, with what to do, and nothing is
// retried; transferring again is the next attempt. Reversing a transfer
// is a person's decision too: billonce never reverses one.
func (b *Biller) Transfer(ctx context.Context, account, period string, p Price, opts *MoneyOutOptions) (Receipt, error) {
	return b.moveOut(ctx, moneyOut{payout: false}, account, period, p, opts.attempt())
}

// Payout pays p out of connected account account's balance to its bank
// for period, exactly once per (account, period, attempt), as a payout
// made on the account (the Stripe-Account header), with the claim's key
// in its metadata. It is claimed before it is sent; past the key's window
// it is found by listing the account's payouts.
// A pending or in-transit payout is processing; paid, it succeeds, and a
// payout the bank returns later (Stripe's payout.failed after paid, by
// webhook or Reconcile's read) fails its claim and is reported (an
// EventSettled with ErrDeclined): paying out again is a person's
// decision, under the next attempt. A balance short of it is refused
// (balance_insufficient) and fails the claim.
func (b *Biller) Payout(ctx context.Context, account, period string, p Price, opts *MoneyOutOptions) (Receipt, error) {
	return b.moveOut(ctx, moneyOut{payout: true}, account, period, p, opts.attempt())
}

func (b *Biller) moveOut(ctx context.Context, k moneyOut, account, period string, p Price, attempt int) (Receipt, error) {
	start := time.Now()
	j, err := b.prepareMoneyOut(k, account, period, p, attempt)
	if err != nil {
		return Receipt{}, err
	}
	if r, done, err := b.earlierMoves(ctx, j); done {
		if err == nil {
			b.outcome(j, start, r, nil)
		}
		return r, err
	}
	return b.claimLoop(ctx, j, start)
}

// prepareMoneyOut checks a transfer or payout and derives its job. Its
// errors are *ChargeError.
func (b *Biller) prepareMoneyOut(k moneyOut, account, period string, p Price, attempt int) (job, error) {
	j := job{kind: k, customer: account, period: k.what() + " " + period, attempt: attempt}
	if k.payout {
		j.account = account
	}
	err := errors.Join(checkAccount(account), checkPeriod(period))
	if err == nil && account == "" {
		err = invalid("account is empty: a %s goes to a connected account (acct_…)", k.what())
	}
	if err == nil && (attempt < 1 || attempt > maxAttempt) {
		err = invalid("attempt %d: attempts are numbered from 1 to %d", attempt, maxAttempt)
	}
	if err == nil {
		p, err = checkPrice(p, Charges)
	}
	if err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	if j.key, err = b.moneyOutKey(k, account, period, attempt); err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.price, j.owner = Price{Amount: p.Amount, Currency: p.Currency}, b.newOwner()
	return j, nil
}

// moneyOutKey is the key of a transfer or payout: (scope, kind, account,
// period, attempt).
func (b *Biller) moneyOutKey(k moneyOut, account, period string, attempt int) (idemkey.Key, error) {
	return idemkey.For(b.cfg.Scope, k.what(), account, period, strconv.Itoa(attempt))
}

// earlierMoves looks at the claims of j's account and period before it is
// claimed: one of another attempt that paid (or is paying) means the
// period is paid, and its receipt is the answer (AlreadyBilled); an
// earlier attempt still being sent, or pending with an unknown outcome,
// is waited for (ErrInProgress, as a re-bill waits); an attempt after the
// first needs the one before it failed. done is set
// when nothing is to be claimed; its errors are *ChargeError.
func (b *Biller) earlierMoves(ctx context.Context, j job) (r Receipt, done bool, err error) {
	cs, err := b.claims.Period(ctx, j.customer, j.period)
	if err != nil {
		return Receipt{}, true, chargeErr(j, nil, "reading the period's claims", err)
	}
	before := j.attempt == 1
	for _, c := range cs {
		if r, ok := b.paidOutBy(j, c); ok {
			return r, true, nil
		}
		if e := b.underWay(j, c); e != nil && c.Attempt < j.attempt && c.Endpoint == j.kind.endpoint(b) {
			return Receipt{}, true, e // its outcome decides whether this attempt may pay
		}
		if c.Scope == b.cfg.Scope && c.Endpoint == j.kind.endpoint(b) && c.Attempt == j.attempt-1 && c.State == claim.StateFailed {
			before = true
		}
	}
	if !before {
		if _, err := b.claims.Get(ctx, j.key.String()); err == nil {
			return Receipt{}, false, nil // this attempt is claimed already: resume or report it
		}
		return Receipt{}, true, chargeErr(j, nil, "", invalid("%s attempt %d: attempt %d has not failed in scope %s; another %s is a person's decision after the one before it failed",
			j.kind.(moneyOut).what(), j.attempt, j.attempt-1, b.cfg.Scope, j.kind.(moneyOut).what()))
	}
	return Receipt{}, false, nil
}

// paidOutBy is paidBy for a transfer or payout: c, another attempt of
// j's account and period, of the same kind and scope, that paid
// (succeeded or processing), answers with its receipt.
func (b *Biller) paidOutBy(j job, c claim.Claim) (Receipt, bool) {
	if c.Scope != b.cfg.Scope || c.Endpoint != j.kind.endpoint(b) || c.Customer != j.customer || c.Period != j.period ||
		c.Key == j.key.String() || c.State != claim.StateSucceeded && c.State != claim.StateProcessing {
		return Receipt{}, false
	}
	paid := j
	paid.attempt, paid.price = c.Attempt, Price{Amount: c.Amount, Currency: c.Currency}
	if k, err := idemkey.Parse(c.Key); err == nil {
		paid.key = k
	}
	r := b.receipt(paid, c.StripeID, AlreadyBilled)
	r.Processing = c.State == claim.StateProcessing
	return r, true
}

// moneyOut is the kind of a transfer (to a connected account) or a payout
// (from one): one write, found past the window by listing.
type moneyOut struct{ payout bool }

func (k moneyOut) what() string {
	if k.payout {
		return "payout"
	}
	return "transfer"
}

func (k moneyOut) endpoint(*Biller) string {
	if k.payout {
		return endpointPayouts
	}
	return endpointTransfers
}

func (moneyOut) describe(*claimengine.Request)        {}
func (moneyOut) alreadyThere(error) bool              { return false }
func (moneyOut) localFirstSend() bool                 { return true }
func (moneyOut) follows(*Biller) (idemkey.Key, error) { return idemkey.Key{}, nil }

func (k moneyOut) send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.sendOnce(ctx, k, j, c)
}

// failed answers for a transfer or payout found failed.
func (k moneyOut) failed(_ context.Context, _ *Biller, j job, c claim.Claim) (Receipt, error) {
	e := chargeErr(j, ErrDeclined, fmt.Sprintf("%s; nothing more is sent for this attempt: to pay again, call with MoneyOutOptions.Attempt %d", c.LastError, j.attempt+1), nil)
	e.Code, e.StripeID, e.AfterProcessing = c.FailureCode, c.StripeID, !c.ProcessingAt.IsZero()
	return Receipt{}, e
}

// ready looks a transfer or payout up at Stripe before a call first sends
// it (see Biller.listFirst).
func (k moneyOut) ready(ctx context.Context, b *Biller, j *job, c claim.Claim) (Receipt, bool, error) {
	return b.listFirst(ctx, k, j, c)
}

func (moneyOut) lookup(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.searchThen(ctx, j, c, nil)
}

func (k moneyOut) findOwn(ctx context.Context, b *Biller, j job) (object, bool) {
	return b.findOwn(ctx, k, j)
}

func (moneyOut) refused(context.Context, *Biller, job, error) (Receipt, bool, error) {
	return Receipt{}, false, nil
}

// advice says what a person can do about Stripe's refusal of a transfer
// or payout.
func (k moneyOut) advice(code stripe.ErrorCode) string { return moneyOutCodes[code] }

// moneyOutCodes are Stripe's refusals of a transfer or payout of this
// account alone, with what a person can do: the claim fails, and a Run
// goes on.
var moneyOutCodes = map[stripe.ErrorCode]string{
	stripe.ErrorCodeBalanceInsufficient: "the balance it is paid from is short of it: wait for funds to become available or top the balance up, then pay again with the next attempt (MoneyOutOptions.Attempt)",
}

// group is a transfer's transfer group: the account's period.
func (b *Biller) group(j job) string {
	return "billonce " + b.cfg.Scope + " " + strings.TrimPrefix(j.period, "transfer ")
}

func (k moneyOut) write(ctx context.Context, b *Biller, j job, key idemkey.Key) (object, error) {
	meta := map[string]string{MetaKey: key.String(), MetaCustomer: j.customer, MetaPeriod: strings.TrimPrefix(j.period, k.what()+" ")}
	if k.payout {
		params := &stripe.PayoutParams{Amount: stripe.Int64(j.price.Amount), Currency: stripe.String(j.price.Currency)}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		po, err := b.payouts.New(params)
		if err != nil {
			return object{}, err
		}
		out := object{id: po.ID, status: payoutStatus(po.Status), replayed: replayed(po.LastResponse), requestID: requestID(po.LastResponse)}
		if out.id == "" || po.Status == "" {
			return out, notAPayment(po.LastResponse)
		}
		return out, nil
	}
	params := &stripe.TransferParams{Amount: stripe.Int64(j.price.Amount), Currency: stripe.String(j.price.Currency),
		Destination: stripe.String(j.customer), TransferGroup: stripe.String(b.group(j))}
	params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
	tr, err := b.transfers.New(params)
	if err != nil {
		return object{}, err
	}
	out := object{id: tr.ID, status: "succeeded", replayed: replayed(tr.LastResponse), requestID: requestID(tr.LastResponse)}
	if out.id == "" {
		return out, notAPayment(tr.LastResponse)
	}
	return out, nil
}

// payoutStatus is a payout's status as the engine reads a payment's: on
// its way (pending, in transit) is processing, paid is succeeded.
func payoutStatus(s stripe.PayoutStatus) string {
	switch s {
	case stripe.PayoutStatusPending, stripe.PayoutStatusInTransit:
		return "pending"
	case stripe.PayoutStatusPaid:
		return "succeeded"
	}
	return string(s)
}

// find lists what j's key may have made: the account's transfers of the
// group, or every payout of the account (a claim made again after its row
// was lost may be much younger than what its key made), and returns those
// that carry the key, and those of another attempt of the period that
// did not fail (see moneyOutAttempt), which a send must never pay again.
func (k moneyOut) find(ctx context.Context, b *Biller, j job) ([]object, error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	if k.payout {
		// Every payout of the account, however old: a claim made again
		// after its row was lost may be days younger than its payout.
		params := &stripe.PayoutListParams{}
		params.Context = ctx
		return listed(b.payouts.List(params).Iter, func(po *stripe.Payout) (object, bool, bool) {
			if po == nil || po.ID == "" || po.Status == "" {
				return object{}, false, false
			}
			n, mine := b.moneyOutAttempt(k, j, po.Metadata)
			return object{id: po.ID, status: payoutStatus(po.Status), customer: j.customer, amount: po.Amount, currency: string(po.Currency), paidBy: otherAttempt(j, n)},
				mine && (n == j.attempt || po.Status != stripe.PayoutStatusFailed && po.Status != stripe.PayoutStatusCanceled), true
		})
	}
	params := &stripe.TransferListParams{Destination: stripe.String(j.customer), TransferGroup: stripe.String(b.group(j))}
	params.Context = ctx
	return listed(b.transfers.List(params).Iter, func(tr *stripe.Transfer) (object, bool, bool) {
		if tr == nil || tr.ID == "" {
			return object{}, false, false
		}
		n, mine := b.moneyOutAttempt(k, j, tr.Metadata)
		return object{id: tr.ID, status: "succeeded", customer: j.customer, amount: tr.Amount, currency: string(tr.Currency), paidBy: otherAttempt(j, n)}, mine, true
	})
}

// moneyOutAttempt tells which attempt of j's account and period, in this
// Biller's scope, made the transfer or payout whose metadata is md: j's
// own, or another whose claim row may be lost (a claim table restored
// from an older copy), and which pays the period unless it failed.
func (b *Biller) moneyOutAttempt(k moneyOut, j job, md map[string]string) (int, bool) {
	key := md[MetaKey]
	if key == j.key.String() {
		return j.attempt, true
	}
	period := strings.TrimPrefix(j.period, k.what()+" ")
	if key == "" || md[MetaCustomer] != j.customer || md[MetaPeriod] != period {
		return 0, false
	}
	for n := 1; n <= maxAttempt; n++ {
		if other, err := b.moneyOutKey(k, j.customer, period, n); err == nil && other.String() == key {
			return n, true
		}
	}
	return 0, false
}

// otherAttempt is an object's paidBy: n, when it is not j's attempt.
func otherAttempt(j job, n int) int {
	if n == j.attempt {
		return 0
	}
	return n
}

// updateFromPayout is what a payout says about its claim: on its way is
// processing, paid is succeeded, failed (even after paid) or canceled is
// failed.
func updateFromPayout(po *stripe.Payout) claimengine.Update {
	u := claimengine.Update{Key: po.Metadata[MetaKey], StripeID: po.ID, Amount: po.Amount, Currency: string(po.Currency), Endpoint: endpointPayouts}
	switch po.Status {
	case stripe.PayoutStatusPending, stripe.PayoutStatusInTransit:
		u.State = string(claim.StateProcessing)
	case stripe.PayoutStatusPaid:
		u.State = string(claim.StateSucceeded)
	case stripe.PayoutStatusFailed, stripe.PayoutStatusCanceled:
		u.State, u.FailureCode = string(claim.StateFailed), string(po.Status)
		if po.FailureCode != "" {
			u.FailureCode = string(po.FailureCode)
		}
	}
	return u
}

// claimAccount is the account c's key went to: a payout's is its
// customer, the account it pays out of, and a transfer's the platform's,
// whatever the claim's account column says (a row restored from a copy
// made before the column existed, or edited by hand); any other claim's
// is its column.
func claimAccount(c claim.Claim) string {
	switch c.Endpoint {
	case endpointPayouts:
		return c.Customer
	case endpointTransfers:
		return ""
	}
	return c.Account
}

// moneyOutJob rebuilds the transfer or payout a pending claim stands for.
func (b *Biller) moneyOutJob(c claim.Claim) (job, error) {
	key, err := idemkey.Parse(c.Key)
	if err != nil {
		return job{}, fmt.Errorf("billing: claim %s has an unusable key: %w", c.Key, err)
	}
	k := moneyOut{payout: c.Endpoint == endpointPayouts}
	j := job{kind: k, customer: c.Customer, period: c.Period, price: Price{Amount: c.Amount, Currency: c.Currency},
		key: key, attempt: max(c.Attempt, 1), owner: b.newOwner()}
	if k.payout {
		j.account = c.Customer
	}
	return j, nil
}
