package billing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// endpointRefunds and endpointCreditNotes are the endpoints recorded on
// a refund's claim: a payment's refund, an invoice's credit note.
const (
	endpointRefunds     = "refunds"
	endpointCreditNotes = "credit_notes"
)

// metaRefund is the metadata key of a refund's id, the caller's name for
// it (an RMA or a credit number).
const metaRefund = "billonce_refund"

// maxRefundID is the longest refund id accepted, in bytes: the refund's
// claim is named by its payment's period and its id.
const maxRefundID = 200

// Refund refunds amount (in the currency's smallest unit) of the payment
// that billed customer for period, exactly once per refundID: the caller's
// own name for this refund, such as an RMA or a credit number, which is
// the refund's identity with the payment's claim. Call it as often as you
// like with the same refundID, from any replica, after a crash or a lost
// answer, days later: the refund is made once, and later calls return its
// receipt (AlreadyBilled). Two refunds of the same amount with two ids are
// two refunds; the same id with another amount is refused
// ([*claim.MismatchError]), never refunded again.
//
// The payment is the period's paid attempt in this Biller's Config.Scope:
// Charge's, or the Rebill that paid, or the paid invoice that billed it
// (Biller.Invoice). An invoice is refunded by a credit note: one whose
// refund_amount is the whole of it, which Stripe refunds from the
// invoice's payment and records against the invoice; the rules are the
// same, with Stripe's listing of the invoice's credit notes past the
// window, and the receipt's StripeID is the credit note's. A refund of more than is left of it
// (its amount less the refunds billonce made of it that did not fail, on
// every replica: they never add up to more than the payment) is
// [ErrInvalid], as is one of a period not paid (declined, still
// processing, an invoice still open, never billed), before anything is
// sent. Stripe refuses a refund beyond what it holds as left (one made in
// the dashboard, say): the refund's claim is failed with Stripe's answer,
// [ErrDeclined], and nothing was refunded by this id.
//
// The refund is claimed before it is sent, and sent through the same
// guard as a charge: one key, derived from the payment's claim and
// refundID before anything can retry. Stripe has no search for refunds:
// before a call first sends the key, and again past Stripe's window, the
// refund is looked for by listing the payment's refunds and matching its
// metadata (billonce_key); one found is recorded, not made again (its
// claim row may have been lost, a claim table restored from an older
// copy, after Stripe forgot the key), and a listing is current at once,
// so a miss is trusted and the key sent. A refund Stripe answers
// pending (some bank debits and cards) is processing: the receipt says
// Processing, and the refund's charge.refund.updated event ([Biller.Webhook])
// or Reconcile's read of it settles it. A refund that fails, then or
// later, is failed for its id and reported (ErrDeclined, or an
// EventSettled with Err); refunding again is a person's decision, under a
// new refundID.
//
// Every error is a [*ChargeError], whose Period is the refund claim's
// period: period, " refund " and refundID. A [Biller.Run] item with a
// Refund makes the same refund, among many.
func (b *Biller) Refund(ctx context.Context, customer, period, refundID string, amount int64) (Receipt, error) {
	start := time.Now()
	j, err := b.prepareRefund(ctx, customer, period, refundID, amount)
	if err != nil {
		return Receipt{}, err
	}
	return b.claimLoop(ctx, j, start)
}

// prepareRefund checks a refund, finds its payment's claim and derives
// the refund's key. Its errors are *ChargeError.
func (b *Biller) prepareRefund(ctx context.Context, customer, period, refundID string, amount int64) (job, error) {
	j := job{customer: customer, period: period + " refund " + refundID, attempt: 1}
	if err := errors.Join(checkID("customer ID", customer), checkPeriod(period), checkRefund(refundID, amount)); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	payment, err := b.paymentOf(ctx, customer, period)
	if err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	key, err := idemkey.For(b.cfg.Scope, payment.Key, "refund", refundID)
	if err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.kind, j.account = refunds{payment: payment, id: refundID}, payment.Account
	j.price, j.key, j.owner = Price{Amount: amount, Currency: payment.Currency}, key, b.newOwner()
	return j, nil
}

// checkRefund checks a refund's id and amount.
func checkRefund(refundID string, amount int64) error {
	err := checkID("refund ID", refundID)
	if err == nil && len(refundID) > maxRefundID {
		err = invalid("refund ID is %d bytes long; the limit is %d", len(refundID), maxRefundID)
	}
	if err == nil && amount <= 0 {
		err = invalid("refund amount %d: must be a positive number of the currency's smallest unit (cents)", amount)
	}
	return err
}

// paymentOf returns the claim of the payment that paid customer's period
// in this Biller's scope: a succeeded charge attempt, or a paid invoice.
// Its errors wrap ErrInvalid when there is none to refund.
func (b *Biller) paymentOf(ctx context.Context, customer, period string) (claim.Claim, error) {
	cs, err := b.claims.Period(ctx, customer, period)
	if err != nil {
		return claim.Claim{}, fmt.Errorf("reading the period's claims: %w", err)
	}
	probe := job{kind: charges{}, customer: customer, period: period}
	var other []string
	for _, c := range cs {
		probe.account = c.Account
		_, charged := b.attemptJob(probe, c)
		invoiced := c.Endpoint == endpointInvoices && c.Scope == b.cfg.Scope && c.RefundOf == ""
		if (charged || invoiced) && c.State == claim.StateSucceeded && c.StripeID != "" {
			return c, nil
		}
		switch {
		case invoiced && c.State == claim.StateProcessing:
			other = append(other, fmt.Sprintf("invoice %s is open, not paid: a credit note of an open invoice lowers what it asks, and is not a refund", orUnknown(c.StripeID)))
		case c.Scope == b.cfg.Scope && c.State != claim.StateFailed:
			other = append(other, fmt.Sprintf("attempt %d is %s, not paid yet", c.Attempt, c.State))
		}
	}
	if other == nil {
		other = []string{"no payment of it succeeded"}
	}
	return claim.Claim{}, invalid("customer %s, period %s in scope %s has no payment to refund: %s", customer, period, b.cfg.Scope, strings.Join(other, "; "))
}

// refunds is the kind of a refund of a payment billonce made, by one
// write: a refund of a charge or a PaymentIntent, a credit note of an
// invoice. Its key is (scope, the payment's key, refund id); its claim
// names the payment's (claim.Claim.RefundOf), which keeps the payment's
// refunds from adding up to more than it; past the key's window the
// refund is found by listing the payment's refunds or credit notes.
type refunds struct {
	payment claim.Claim // the payment's claim
	id      string      // the caller's refund id
}

func (k refunds) endpoint(*Biller) string {
	if k.payment.Endpoint == endpointInvoices {
		return endpointCreditNotes
	}
	return endpointRefunds
}

func (k refunds) describe(r *claimengine.Request)    { r.RefundOf = k.payment.Key }
func (refunds) alreadyThere(error) bool              { return false }
func (refunds) localFirstSend() bool                 { return true }
func (refunds) follows(*Biller) (idemkey.Key, error) { return idemkey.Key{}, nil }
func (k refunds) send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.sendOnce(ctx, k, j, c)
}

// failed answers for a refund found failed: Stripe refused it, or it
// failed after it was pending. Refunding again is a person's decision.
func (refunds) failed(_ context.Context, _ *Biller, j job, c claim.Claim) (Receipt, error) {
	e := chargeErr(j, ErrDeclined, c.LastError+"; nothing is refunded by this id: to refund the payment again, call Refund with a new refund ID", nil)
	e.Code, e.StripeID, e.AfterProcessing = c.FailureCode, c.StripeID, !c.ProcessingAt.IsZero()
	return Receipt{}, e
}

// ready looks a refund up at Stripe before a call first sends it (see
// Biller.listFirst).
func (k refunds) ready(ctx context.Context, b *Biller, j *job, c claim.Claim) (Receipt, bool, error) {
	return b.listFirst(ctx, k, j, c)
}

func (refunds) lookup(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.searchThen(ctx, j, c, nil)
}

func (k refunds) findOwn(ctx context.Context, b *Biller, j job) (object, bool) {
	return b.findOwn(ctx, k, j)
}

// find lists the refunds of the claim's payment (the credit notes of its
// invoice) and returns those that carry its key. A listing is current at
// once, unlike search.
func (k refunds) find(ctx context.Context, b *Biller, j job) ([]object, error) {
	if k.payment.Endpoint == endpointInvoices {
		return k.findCreditNotes(ctx, b, j)
	}
	params := &stripe.RefundListParams{}
	if strings.HasPrefix(k.payment.StripeID, "pi_") {
		params.PaymentIntent = stripe.String(k.payment.StripeID)
	} else {
		params.Charge = stripe.String(k.payment.StripeID)
	}
	params.Context = ctx
	if err := b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return listed(b.refunds.List(params).Iter, func(re *stripe.Refund) (object, bool, bool) {
		if re == nil || re.ID == "" || re.Status == "" {
			return object{}, false, false
		}
		// Listed by the payment: each is of the claim's customer.
		return object{id: re.ID, status: refundStatus(re.Status), customer: j.customer, amount: re.Amount, currency: string(re.Currency)},
			re.Metadata[MetaKey] == j.key.String(), true
	})
}

// findCreditNotes lists the credit notes of the claim's invoice and
// returns those that carry its key.
func (k refunds) findCreditNotes(ctx context.Context, b *Biller, j job) ([]object, error) {
	params := &stripe.CreditNoteListParams{Invoice: stripe.String(k.payment.StripeID)}
	params.Context = ctx
	if err := b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	return listed(b.creditNotes.List(params).Iter, func(cn *stripe.CreditNote) (object, bool, bool) {
		if cn == nil || cn.ID == "" || cn.Status == "" {
			return object{}, false, false
		}
		return creditNoteObject(cn, j.customer), cn.Metadata[MetaKey] == j.key.String(), true
	})
}

// creditNoteObject is what credit note cn says about the refund it makes,
// listed by its invoice, whose customer is customer: issued is money
// moved (its refund_amount, which billonce's are its whole amount); a
// void one is not.
func creditNoteObject(cn *stripe.CreditNote, customer string) object {
	status := "succeeded"
	if cn.Status != stripe.CreditNoteStatusIssued {
		status = string(cn.Status)
	}
	return object{id: cn.ID, status: status, customer: customer, amount: cn.Amount, currency: string(cn.Currency)}
}

// refused answers for no refusal of its own: Stripe's refusals of a
// refund are in the engine's table (see refundCodes).
func (refunds) refused(context.Context, *Biller, job, error) (Receipt, bool, error) {
	return Receipt{}, false, nil
}

// advice says what a person can do about Stripe's refusal code of a
// refund, where it differs from a charge's.
func (refunds) advice(code stripe.ErrorCode) string { return refundCodes[code] }

// refundCodes are Stripe's refusals of a refund of this payment alone,
// with what a person can do: the refund's claim fails, and the run goes
// on.
var refundCodes = map[stripe.ErrorCode]string{
	stripe.ErrorCodeChargeAlreadyRefunded: "the payment has nothing left to refund at Stripe: it was refunded outside billonce (the dashboard, other code); check its refunds in Stripe",
	stripe.ErrorCodeAmountTooLarge:        "Stripe holds less of the payment as left to refund: part of it was refunded outside billonce (the dashboard, other code); check its refunds in Stripe, and refund what is owed under a new refund ID",
	stripe.ErrorCodeChargeDisputed:        "the payment is disputed, and a disputed payment is not refunded: the dispute decides; refund under a new refund ID once it is closed, if money is still owed",
}

// write makes the refund, carrying its key and id in its metadata too: a
// refund of a charge or a PaymentIntent, or a credit note of an invoice
// that refunds its whole amount from the invoice's payment.
func (k refunds) write(ctx context.Context, b *Biller, j job, key idemkey.Key) (object, error) {
	meta := map[string]string{MetaKey: key.String(), MetaCustomer: j.customer, MetaPeriod: k.payment.Period, metaRefund: k.id}
	if k.payment.Endpoint == endpointInvoices {
		params := &stripe.CreditNoteParams{Invoice: stripe.String(k.payment.StripeID),
			Amount: stripe.Int64(j.price.Amount), RefundAmount: stripe.Int64(j.price.Amount)}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		cn, err := b.creditNotes.New(params)
		if err != nil {
			return object{}, err
		}
		out := creditNoteObject(cn, j.customer)
		out.customer, out.amount, out.currency = "", 0, ""
		out.replayed, out.requestID = replayed(cn.LastResponse), requestID(cn.LastResponse)
		if out.id == "" || cn.Status == "" {
			return out, notAPayment(cn.LastResponse)
		}
		return out, nil
	}
	params := &stripe.RefundParams{Amount: stripe.Int64(j.price.Amount)}
	if strings.HasPrefix(k.payment.StripeID, "pi_") {
		params.PaymentIntent = stripe.String(k.payment.StripeID)
	} else {
		params.Charge = stripe.String(k.payment.StripeID)
	}
	params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
	re, err := b.refunds.New(params)
	if err != nil {
		return object{}, err
	}
	out := object{id: re.ID, status: refundStatus(re.Status), replayed: replayed(re.LastResponse), requestID: requestID(re.LastResponse)}
	if out.id == "" || re.Status == "" {
		return out, notAPayment(re.LastResponse)
	}
	return out, nil
}

// refundStatus is a refund's status as the engine reads a payment's: a
// refund that waits on its customer's bank, or on an action, is pending
// (processing); a failed or canceled one is not money moved.
func refundStatus(s stripe.RefundStatus) string {
	if s == stripe.RefundStatusRequiresAction {
		return string(stripe.RefundStatusPending)
	}
	return string(s)
}

// updateFromRefund is what a refund says about its claim: the one mapping
// shared by webhooks and polling.
func updateFromRefund(re *stripe.Refund) claimengine.Update {
	u := claimengine.Update{Key: re.Metadata[MetaKey], StripeID: re.ID, Amount: re.Amount, Currency: string(re.Currency), Endpoint: endpointRefunds}
	switch re.Status {
	case stripe.RefundStatusPending, stripe.RefundStatusRequiresAction:
		u.State = string(claim.StateProcessing)
	case stripe.RefundStatusSucceeded:
		u.State = string(claim.StateSucceeded)
	case stripe.RefundStatusFailed, stripe.RefundStatusCanceled:
		u.State, u.FailureCode = string(claim.StateFailed), string(re.Status)
		if re.FailureReason != "" {
			u.FailureCode = string(re.FailureReason)
		}
	}
	return u
}

// updateFromCreditNote is what a credit note says about its claim: issued
// is the refund made, void is none.
func updateFromCreditNote(cn *stripe.CreditNote) claimengine.Update {
	u := claimengine.Update{Key: cn.Metadata[MetaKey], StripeID: cn.ID, Amount: cn.Amount, Currency: string(cn.Currency), Endpoint: endpointCreditNotes}
	switch cn.Status {
	case stripe.CreditNoteStatusIssued:
		u.State = string(claim.StateSucceeded)
	case stripe.CreditNoteStatusVoid:
		u.State, u.FailureCode = string(claim.StateFailed), "void"
	}
	return u
}

// refundJob rebuilds the refund a pending claim stands for, from its
// payment's claim. A claim of the refunds endpoint is a refund's, even
// with its payment's key lost: it is never resumed as anything else.
func (b *Biller) refundJob(ctx context.Context, c claim.Claim) (job, error) {
	key, err := idemkey.Parse(c.Key)
	if err != nil {
		return job{}, fmt.Errorf("billing: refund claim %s has an unusable key: %w", c.Key, err)
	}
	if c.RefundOf == "" {
		return job{}, fmt.Errorf("billing: refund claim %s names no payment claim (its refund_of is empty): nothing is sent; look its refund up in Stripe by billonce_key, and set refund_of to the key of the payment claim it refunds", c.Key)
	}
	payment, err := b.claims.Get(ctx, c.RefundOf)
	if err != nil {
		return job{}, fmt.Errorf("billing: refund claim %s: reading the claim of the payment it refunds (%s): %w", c.Key, c.RefundOf, err)
	}
	id, ok := strings.CutPrefix(c.Period, payment.Period+" refund ")
	if !ok {
		return job{}, fmt.Errorf("billing: refund claim %s: its period %q is not its payment's period %q and a refund ID", c.Key, c.Period, payment.Period)
	}
	return job{kind: refunds{payment: payment, id: id}, account: c.Account, customer: c.Customer, period: c.Period,
		price: Price{Amount: c.Amount, Currency: c.Currency}, key: key, attempt: max(c.Attempt, 1), owner: b.newOwner()}, nil
}
