package billing

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// ErrInvalid is returned, wrapped, for bad input: an empty
// or oversized customer ID, a malformed period, a zero or negative amount, an
// unknown currency, a bad configuration. Nothing was written and nothing was
// sent when it is returned. Every package of billonce names its own
// invalid-input error ErrInvalid.
var ErrInvalid = errors.New("billing: invalid input")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// ErrRunHeldElsewhere is returned by [Biller.Run] and [Biller.Reconcile]
// when their options set a Lock and another runner holds it. Nothing was
// claimed or sent.
var ErrRunHeldElsewhere = errors.New("billing: another runner holds the lock for this billing run")

// Answers that stop a whole billing run, besides the refusals of a
// spend-cap proxy ([spendcap.ErrSpendCapReached],
// [spendcap.ErrEndpointNotAllowed], [spendcap.ErrVaultKeyRevoked]); test
// for all of them with [StopsRun]. They are never retried; a [Biller.Run]
// that meets one sends nothing more. Claims it made whose key never
// executed at Stripe (not sent, or refused before execution) are
// abandoned, so the run after the fix claims them afresh with its own
// configuration; the others stay pending, to be resumed with the same
// keys.
var (
	// ErrStripeAuth is returned when Stripe answers 401 or 403 (a revoked,
	// expired or wrong secret key, or a restricted key without permission
	// for the call). errors.As finds Stripe's *stripe.Error in the chain.
	ErrStripeAuth = errors.New("billing: Stripe refused the API key")
	// ErrStripeRequest is returned when Stripe (or whatever answers at
	// Config.StripeURL) refuses the request itself, in a way that no
	// customer's request could get past: a wrong URL (404 without a
	// resource), an unknown or invalid parameter, a key in the wrong mode
	// (livemode_mismatch, testmode_charges_only), an API version it does
	// not take, a proxy's or a web server's own 4xx, or any 4xx refusal not
	// known to concern one customer. Stripe stores nothing for such a
	// request, so the same key is sent again once the configuration is
	// fixed. errors.As finds the *stripe.Error in the chain. See [Classify]
	// for the table.
	ErrStripeRequest = errors.New("billing: Stripe refused the request")
	// ErrStripeUnreachable is returned when attempts to create a payment,
	// across all of a Biller's calls, get no HTTP answer at all from
	// Config.StripeURL (or the spend-cap proxy): connection refused, DNS
	// or TLS failure, timeout, connection reset, any transport error. It
	// takes Config.UnreachableAttempts such attempts in a row, or
	// Config.UnreachableAfter of them (a retry that would start later is
	// not waited for); any HTTP answer, a 5xx included,
	// starts the count again, and a 5xx storm is retried as before. A
	// claim whose request may have been written stays pending with its
	// key (its outcome is unknown, and the next run resumes it); one whose
	// request never reached a connection is abandoned. errors.As finds the
	// last transport error in the chain.
	ErrStripeUnreachable = errors.New("billing: Stripe unreachable")
)

// proxyRefused reports whether err is a spend-cap proxy's refusal: the
// request did not reach Stripe.
func proxyRefused(err error) bool {
	return errors.Is(err, spendcap.ErrSpendCapReached) || errors.Is(err, spendcap.ErrEndpointNotAllowed) ||
		errors.Is(err, spendcap.ErrVaultKeyRevoked)
}

// StopsRun reports whether err is an answer that stops a whole billing run
// ([ErrStripeAuth], [ErrStripeRequest], [ErrStripeUnreachable] or a
// spend-cap proxy's refusal): no customer's charge can get past it until
// the configuration (or the network) is fixed, so a caller that bills
// customers one by one (a job queue, its own loop) stops too, rather than
// trying the next customer.
func StopsRun(err error) bool {
	return proxyRefused(err) || errors.Is(err, ErrStripeAuth) || errors.Is(err, ErrStripeRequest) ||
		errors.Is(err, ErrStripeUnreachable)
}

// The kinds of [*ChargeError]. Test for them with errors.Is; what to do
// about each is said here, once, rather than in every message.
var (
	// ErrDeclined is returned when Stripe refuses the charge for a reason about this
	// customer alone (a decline, an expired card, no such customer or
	// payment method, an amount Stripe will not take, a usage report older
	// than Stripe takes), and sending the same key again cannot change
	// that. The claim is recorded as failed, and later calls for the
	// customer and period return this error again without calling Stripe. Billing the customer again is a decision for
	// a person or a dunning process: [Biller.Rebill] with attempt
	// ChargeError.Attempt+1. Code and DeclineCode carry Stripe's codes when
	// the refusal came from Stripe in this call.
	// A payment accepted as processing (a bank debit) that fails when it
	// settles is ErrDeclined too, with ChargeError.AfterProcessing set.
	ErrDeclined = errors.New("billing: declined")
	// ErrOutcomeUnknown is returned when retries run out, or the call is
	// stopped, before Stripe gives a definitive answer. The charge may or may not exist. The
	// claim stays pending with its key; the next Charge, Run or Reconcile
	// for the customer and period resumes it with that key, which is safe:
	// Stripe replays the charge if it was made.
	ErrOutcomeUnknown = errors.New("billing: outcome unknown")
	// ErrInProgress is returned when another runner holds a live claim on the customer and
	// period and may be charging right now, or another attempt of the
	// period (a re-bill, or the attempt a re-bill follows) is pending and
	// its outcome decides this one. Until is when its lease ends (a minute
	// from now when nobody holds it); try again after that (or set
	// Config.InProgressWait).
	ErrInProgress = errors.New("billing: charge in progress elsewhere")
	// ErrNeedsReconciliation is returned when a pending claim is past its
	// key's deadline, or is a re-bill whose earlier attempt's claim is
	// gone, and Stripe's search could not settle whether its charge
	// exists. Sending again could charge twice, so nothing was sent.
	// Run Reconcile again later, or look the key up in the Stripe dashboard
	// (metadata billonce_key = ChargeError.Key) and record what you found
	// with the billonce command: billonce resolve -key KEY -payment ID (or
	// -payment none once the key's 24-hour window has passed). A re-bill
	// stopped after an attempt that may have reached Stripe, because an
	// earlier attempt's own payment paid the period (its claim is failed
	// with claim.FailureSuperseded), is this error too: look its key up,
	// and refund a payment of it.
	ErrNeedsReconciliation = errors.New("billing: needs reconciliation")
	// ErrNotRecorded is returned when Stripe gave a definitive answer (a
	// charge, StripeID, or a decline) but it could not be written to the
	// claim store, or not before the caller gave up (the write outlasts the
	// caller by two seconds at most). Nothing is lost: the claim stays
	// pending with its key, or the write lands later, and the next run gets
	// the same answer back from Stripe (a replay) and records it.
	ErrNotRecorded = errors.New("billing: charged but not recorded")
	// ErrKeyReused is returned when Stripe answers idempotency_error: the key was sent
	// with parameters other than those it was first used with. It is a bug
	// (the price changed under a claimed key, or keys collide), not a
	// retryable error. Nothing was charged by this request; the claim stays
	// pending for a person to look at.
	ErrKeyReused = errors.New("billing: idempotency key reused with other parameters")
	// ErrSentElsewhere is returned when a pending claim's key was sent to the other API, or
	// with another credential (a rotated secret key), than this Biller's.
	// Stripe may keep idempotency keys per endpoint and per API key, so
	// sending it from here could charge twice; Stripe's search found no
	// payment for it (for an invoice, nothing of the step it was sent
	// for), which proves nothing before the key's window has passed.
	// Nothing was sent and the claim stays pending. Finish it with a
	// Biller configured as the one that made it, or wait until Until:
	// after the key's 24-hour window any Biller of the same scope settles
	// it by looking at Stripe first, and sends it only if nothing exists.
	ErrSentElsewhere = errors.New("billing: key was sent with another endpoint or credential")
)

// ChargeError is the error of one customer's charge: every error that
// [Biller.Charge] and [Biller.Rebill] return is a *ChargeError, and so is
// every entry of Summary.Failures. Err says what happened; test it with
// errors.Is:
//
//	errors.Is(err, …)        claim      what to do
//	ErrInvalid               none       fix the input; nothing was written or sent
//	ErrDeclined              failed     nothing, or Rebill with Attempt+1
//	ErrDeclined and          failed     the same; a bank debit that failed when it
//	  AfterProcessing                   settled, not a card decline (Code: Stripe's failure code)
//	ErrOutcomeUnknown        pending    nothing: the next run resumes it safely
//	ErrInProgress            held       nothing, or try again after Until
//	ErrNeedsReconciliation   pending    look the Key up in Stripe
//	ErrNotRecorded           pending    nothing: the next run records it
//	ErrKeyReused             pending    a bug: the price changed under the key
//	ErrSentElsewhere         pending    finish with the Biller that sent it, or wait until Until
//	ErrStripeAuth            deleted    fix the API key (the run stopped)
//	ErrStripeRequest         deleted    fix the configuration (the run stopped)
//	ErrStripeUnreachable     pending    fix the network or StripeURL (the run stopped);
//	                         or deleted the next run resumes the pending ones
//	spendcap.ErrSpendCapReached, spendcap.ErrVaultKeyRevoked, spendcap.ErrEndpointNotAllowed:
//	                         deleted    see the spend-cap proxy (the run stopped)
//
// "deleted" is for a claim the call made: its key never executed at
// Stripe, so it is abandoned and the next run claims the customer afresh;
// a claim resumed from an earlier call stays pending with its key. [StopsRun]
// reports the answers that stop a run.
//
// A price that contradicts the claim already made for the customer and
// period is a [*claim.MismatchError] in Err (errors.As); nothing was sent.
// Stripe's own error answer, whenever this call got one, declines
// included, is Stripe's *stripe.Error in Err (errors.As), with its
// request id, param, doc URL and request log URL; RequestID repeats its
// request id. An outcome read from the claim store (a decline recorded by
// an earlier call) has no Stripe answer and no RequestID. Claims the call
// made and whose key never executed at Stripe are abandoned rather than
// left pending, so the next run claims them afresh.
type ChargeError struct {
	Customer, Period string
	// Account is the connected account the customer was billed on; "" for
	// the platform's own.
	Account string
	// Key is the idempotency key of the charge (empty when the input was
	// refused before a key was made).
	Key string
	// Attempt is the billing attempt: 1 for Charge, 2 and up for Rebill.
	Attempt int
	// RequestID is Stripe's id ("req_…", the Request-Id header) of the
	// answer that decided the error in this call: Stripe's error answer,
	// or the payment it answered with (a declined status, or a charge
	// whose recording failed). Quote it to Stripe support, or find it in
	// the dashboard's request logs. Empty when no answer came (a network
	// failure) or no call was made. It is not a secret.
	RequestID string
	// Err is the kind (see the table above) wrapping the cause.
	Err error

	// Code and DeclineCode are Stripe's error code and decline code
	// ("card_declined", "insufficient_funds") with ErrDeclined, when the
	// refusal came from Stripe in this call.
	Code, DeclineCode string
	// AfterProcessing is set with ErrDeclined when the payment was
	// accepted as processing (a bank debit) and failed when it settled;
	// Code is then Stripe's failure code. It is not a card decline, and
	// like one it is never billed again without a Rebill.
	AfterProcessing bool
	// StripeID is the charge or payment intent that exists, with
	// ErrNotRecorded.
	StripeID string
	// Until is when another runner's lease ends, with ErrInProgress, and
	// when a search may settle the claim, with ErrSentElsewhere.
	Until time.Time
}

func (e *ChargeError) Error() string {
	what := "<nil>"
	if e.Err != nil {
		what = strings.TrimPrefix(e.Err.Error(), "billing: ")
	}
	customer := e.Customer
	if e.Account != "" {
		customer += " on account " + e.Account
	}
	switch {
	case e.Key == "":
		return fmt.Sprintf("billing: customer %s, period %s: %s", customer, e.Period, what)
	case e.RequestID != "":
		return fmt.Sprintf("billing: customer %s, period %s (key %s, attempt %d, request %s): %s", customer, e.Period, e.Key, e.Attempt, e.RequestID, what)
	}
	return fmt.Sprintf("billing: customer %s, period %s (key %s, attempt %d): %s", customer, e.Period, e.Key, e.Attempt, what)
}

func (e *ChargeError) Unwrap() error { return e.Err }

// kindError is a ChargeError's Err: a kind sentinel, what happened, the
// cause, and Stripe's answer. errors.Is matches the kind; errors.Is and
// errors.As look into the cause and the answer.
type kindError struct {
	kind  error
	msg   string
	cause error
	// answer is Stripe's error answer when msg already says what it
	// says (a decline): found by errors.As, not printed again.
	answer *stripe.Error
}

func (e *kindError) Error() string {
	s := e.kind.Error()
	if e.msg != "" {
		s += ": " + e.msg
	}
	if e.cause != nil {
		s += ": " + e.cause.Error()
	}
	return s
}

func (e *kindError) Unwrap() []error {
	out := []error{e.kind}
	if e.cause != nil {
		out = append(out, e.cause)
	}
	if e.answer != nil {
		out = append(out, e.answer)
	}
	return out
}

// chargeErr is the *ChargeError of j: kind (nil for a cause that carries its
// own kind, such as a run-stopping answer), what happened, and the cause.
func chargeErr(j job, kind error, msg string, cause error) *ChargeError {
	e := &ChargeError{Customer: j.customer, Period: j.period, Attempt: j.attempt, Account: j.account}
	if !j.key.IsZero() {
		e.Key = j.key.String()
	}
	if kind == nil && inputRefused(cause) {
		kind = ErrInvalid // bad input, whichever run or replica made the other claim
	}
	switch {
	case kind != nil:
		e.Err = &kindError{kind: kind, msg: msg, cause: cause}
	case msg != "":
		e.Err = fmt.Errorf("%s: %w", msg, cause)
	default:
		e.Err = cause
	}
	var se *stripe.Error
	if errors.As(e.Err, &se) {
		e.RequestID = se.RequestID
	}
	return e
}

// declined is the *ChargeError of kind (ErrDeclined, or ErrNotRecorded
// with cause) for Stripe's refusal se about this customer, which reason
// describes: se is in its chain, though not printed twice.
func declined(j job, kind error, reason string, cause error, se *stripe.Error) *ChargeError {
	e := chargeErr(j, kind, reason, cause)
	e.Err.(*kindError).answer = se
	e.RequestID = se.RequestID
	return e
}

// asChargeError returns err as the *ChargeError of j: err itself when it is
// one already, otherwise a ChargeError wrapping it.
func asChargeError(j job, err error) error {
	if err == nil {
		return nil
	}
	var ce *ChargeError
	if errors.As(err, &ce) {
		return err
	}
	return chargeErr(j, nil, "", err)
}

func orUnknown(s string) string {
	if s == "" {
		return "(not recorded)"
	}
	return s
}

// errorKinds are the words of ErrorKind, in the order it tests them:
// the answers that stop runs first, since a ChargeError may wrap one in
// another kind.
var errorKinds = []struct {
	err  error
	word string
}{
	{ErrStripeAuth, "stripe_auth"},
	{ErrStripeRequest, "stripe_request"},
	{ErrStripeUnreachable, "stripe_unreachable"},
	{spendcap.ErrSpendCapReached, "spend_cap_reached"},
	{spendcap.ErrEndpointNotAllowed, "endpoint_not_allowed"},
	{spendcap.ErrVaultKeyRevoked, "vault_key_revoked"},
	{ErrDeclined, "declined"},
	{ErrOutcomeUnknown, "outcome_unknown"},
	{ErrInProgress, "in_progress"},
	{ErrNeedsReconciliation, "needs_reconciliation"},
	{ErrNotRecorded, "not_recorded"},
	{ErrKeyReused, "key_reused"},
	{ErrSentElsewhere, "sent_elsewhere"},
	{ErrInvalid, "invalid"},
	{ErrRunHeldElsewhere, "run_held_elsewhere"},
	{context.Canceled, "canceled"},
	{context.DeadlineExceeded, "deadline_exceeded"},
}

// ErrorKind names the kind of err, one of billonce's errors, in one word
// for logs, JSON reports and metrics: "stripe_auth", "stripe_request",
// "stripe_unreachable", "spend_cap_reached", "endpoint_not_allowed",
// "vault_key_revoked", "declined", "failed_after_settlement" (a payment
// that failed when it settled), "outcome_unknown", "in_progress",
// "needs_reconciliation", "not_recorded", "key_reused", "sent_elsewhere",
// "mismatch" (a price that contradicts the claim, a [*claim.MismatchError]),
// "invalid" (a usage window that overlaps a claimed one, and a refund of
// more than is left, among them),
// "run_held_elsewhere", "canceled", "deadline_exceeded", or "other"; ""
// for nil. Test for a kind with errors.Is, not with its word.
func ErrorKind(err error) string {
	if err == nil {
		return ""
	}
	var me *claim.MismatchError
	if errors.As(err, &me) && !inputRefused(me) {
		return "mismatch"
	}
	for _, k := range errorKinds {
		if errors.Is(err, k.err) {
			var ce *ChargeError
			if k.err == ErrDeclined && errors.As(err, &ce) && ce.AfterProcessing {
				return "failed_after_settlement"
			}
			return k.word
		}
	}
	return "other"
}

// inputRefused reports whether err is the claim store's refusal of a
// request no retry can make right, whichever run, replica or scope made
// the claim it meets: bad input, an [ErrInvalid]. A usage report whose
// window overlaps the window of another live report of the same customer
// and meter ("window"), which the meter would count twice; a refund of
// more than is left of its payment, or of a payment not succeeded
// ("refund").
func inputRefused(err error) bool {
	var m *claim.MismatchError
	return errors.As(err, &m) && (m.Field == "window" || m.Field == "refund")
}
