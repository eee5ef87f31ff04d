package billing

import (
	"fmt"
	"time"

	"github.com/billonce/billonce/idemkey"
)

// maxAttempt is the largest attempt number [Biller.Rebill] accepts. Re-bills
// are decided by a person or a dunning process, a few per period; a larger
// number is a typo or an overflow.
const maxAttempt = 10_000

// Metadata keys that every charge carries, so a charge can always be found
// again by key, customer and period (Stripe search: metadata['billonce_key']:'…').
const (
	MetaKey      = "billonce_key"
	MetaCustomer = "billonce_customer"
	MetaPeriod   = "billonce_period"
)

// Price is what one customer owes for one period.
type Price struct {
	// Amount in the currency's smallest unit (cents for usd); must be > 0.
	Amount int64
	// Currency is a three-letter ISO code Stripe supports ("usd", "eur").
	Currency string
	// PaymentMethod is the saved payment method to charge ("pm_…").
	// Required with the PaymentIntents API; ignored by Charges.
	PaymentMethod string
}

// Event is what [Config.Observe] receives.
type Event struct {
	Kind     EventKind
	Customer string
	Period   string
	// Object is the kind of write of the claim the event concerns, by
	// Stripe's name of the object it makes: "charge", "payment_intent",
	// "invoice", "meter_event", "refund", "credit_note", "transfer" or
	// "payout". It is set on EventStripeCall, EventOutcome, EventSettled,
	// EventRefunded and EventDisputed, and on EventWebhook and
	// EventNotApplied once their claim is known; it is empty on an
	// EventRun, and for a claim made before claims recorded their
	// endpoint.
	Object string
	// Key is the idempotency key of the claim the event concerns (every
	// kind but EventNotApplied and EventRun; empty for an outcome refused
	// before a key was made, and for an EventWebhook before its claim was
	// known). An EventStripeCall names the claim's key, also for a call
	// that sends a key of its own (an invoice's step).
	Key string
	// RequestID is Stripe's request id ("req_…") of the call an
	// EventStripeCall reports (empty when no answer came), and of the
	// answer that decided a failed EventOutcome (ChargeError.RequestID).
	// It is not a secret.
	RequestID string
	// Attempt is the HTTP attempt number within one send, from 1
	// (EventStripeCall).
	Attempt int
	// Duration is the HTTP call's (EventStripeCall), the time from the
	// claim to the outcome (EventOutcome), or the time Run took (EventRun).
	Duration time.Duration
	// Err is the call's or the charge's error, or nil.
	Err error
	// Outcome is set on an EventOutcome without Err.
	Outcome Outcome

	// StripeID names the payment (EventSettled, EventRefunded,
	// EventDisputed).
	StripeID string
	// State is the claim's state after an EventSettled: "processing",
	// "succeeded" or "failed" (then Err is a *ChargeError of kind
	// ErrDeclined, with AfterProcessing set when the payment failed after
	// processing).
	State string
	// Refunded is the amount refunded so far (EventRefunded).
	Refunded int64
	// Dispute is the dispute's id and reason (EventDisputed).
	Dispute string
	// EventID is the Stripe event's id (EventNotApplied, and EventWebhook
	// once the delivery's signature was verified).
	EventID string
	// Result is what came of a webhook delivery (EventWebhook): "applied"
	// (the claim changed), "duplicate" (applied before), "unchanged" (the
	// claim knew as much already), "other_payment" (the claim records
	// another payment), "unproven" (nothing shows the event is about the
	// claim's own send: the claim has recorded no payment yet, and its own
	// resume settles it), "ignored" (an event type not handled, or a payment
	// that is not billonce's or has no claim), "not_applied" (as
	// EventNotApplied), "rejected" (answered 4xx: not a POST, a body too
	// large or unreadable, a bad signature) or "retry" (answered 5xx, for
	// Stripe to deliver it again; Err says why).
	Result string
	// Summary is what Run returned (EventRun), its counts as of the end of
	// the run. It is shared with Run's caller: do not modify it.
	Summary *Summary
}

// EventKind tells what an [Event] reports. The zero EventKind, "none",
// is no event of billonce's (an Event built by hand).
type EventKind int

var eventKindNames = [...]string{"none", "stripe call", "outcome", "settled", "refunded", "disputed", "not applied", "webhook", "run"}

// String returns the kind as words: "stripe call", "outcome", "settled",
// "refunded", "disputed", "not applied", "webhook", "run", or "none" for
// the zero value.
func (k EventKind) String() string {
	if k >= 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Outcome tells how a charge came to be billed, in a [Receipt] and an
// [Event]. [Progress] counts the same words. The zero Outcome, "none", is
// that of a charge that was not billed: the Receipt returned with an
// error, the Event of a failed outcome.
type Outcome int

// String returns the outcome as words: "created", "replayed", "already
// billed", "reconciled", or "none" for the zero value.
func (o Outcome) String() string {
	switch o {
	case 0:
		return "none"
	case Created:
		return "created"
	case Replayed:
		return "replayed"
	case AlreadyBilled:
		return "already billed"
	case Reconciled:
		return "reconciled"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Receipt describes a customer's charge for a period.
type Receipt struct {
	Customer, Period string
	// StripeID is the charge ("ch_…"), payment intent ("pi_…") or
	// invoice ("in_…").
	StripeID string
	Amount   int64
	Currency string
	Key      idemkey.Key
	Attempt  int
	Outcome  Outcome
	// Processing: the payment exists but has not settled (a bank debit):
	// its outcome arrives by webhook or Reconcile. It is never sent again.
	Processing bool
}

const (
	// EventStripeCall: one HTTP call of a write finished (Attempt,
	// Duration, Err): creating a charge, payment intent, meter event,
	// refund, credit note, transfer or payout, or making a step of an
	// invoice (Object says which). Searches and reads are not reported.
	EventStripeCall EventKind = iota + 1
	// EventOutcome: one claim's write finished, a customer's charge or any
	// other kind (Object; Outcome on success, Err otherwise).
	EventOutcome
	// EventSettled: a webhook or Reconcile moved a claim: its payment is
	// processing, or a payment settled (State, Err).
	EventSettled
	// EventRefunded: a payment was refunded (Refunded). The claim stays
	// billed: a refund is not a reason to bill again.
	EventRefunded
	// EventDisputed: a payment was disputed (Dispute). The claim stays
	// billed: a dispute is not a reason to bill again.
	EventDisputed
	// EventNotApplied: a correctly signed webhook event could not be
	// applied and never will be (EventID, StripeID if known, Err): its
	// payment is not on this Stripe account, or it names a key or an id
	// longer than the claim table takes. It was answered 200, so that
	// Stripe does not deliver it again, and logged as an error. It deserves
	// a look.
	EventNotApplied
	// EventWebhook: the webhook handler answered a delivery (Result;
	// EventID, Key, StripeID, Customer and Period as far as they are
	// known; Err of a "rejected", "not_applied" or "retry"). Every
	// delivery is reported once, after the events it caused.
	EventWebhook
	// EventRun: a Run ended (Period, Duration, Summary, and Err, what Run
	// returned), whether it ran or was refused (ErrInvalid,
	// ErrRunHeldElsewhere). A Run that panics reports none.
	EventRun
)

const (
	// Created: this call made the charge at Stripe.
	Created Outcome = iota + 1
	// Replayed: Stripe already had a charge for the key (an earlier attempt
	// made it, its answer was lost) and replayed it. Progress counts it as
	// Created: the charge was made by this run.
	Replayed
	// AlreadyBilled: the claim store already held the charge; Stripe was
	// not called.
	AlreadyBilled
	// Reconciled: a pending claim was settled by finding its charge with
	// Stripe's search. Progress counts it as AlreadyBilled.
	Reconciled
)

// objectOf is the Object of the events of a claim whose writes go to
// endpoint (a kind's endpoint, a claim's Endpoint): the one mapping from
// where a kind writes to what an Event names. It is "" for an endpoint
// it does not know (a claim that records none).
func objectOf(endpoint string) string {
	switch endpoint {
	case string(Charges):
		return "charge"
	case string(PaymentIntents):
		return "payment_intent"
	case endpointInvoices:
		return "invoice"
	case endpointMeterEvents:
		return "meter_event"
	case endpointRefunds:
		return "refund"
	case endpointCreditNotes:
		return "credit_note"
	case endpointTransfers:
		return "transfer"
	case endpointPayouts:
		return "payout"
	}
	return ""
}
