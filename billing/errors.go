package billing

import (
	"errors"
	"fmt"
	"time"

	"github.com/billonce/billonce/billing/spendcap"
)

// ErrInvalidInput is wrapped by every error that reports bad input: an empty
// or oversized customer ID, a malformed period, a zero or negative amount, an
// unknown currency, a bad configuration. Nothing was written and nothing was
// sent when it is returned.
var ErrInvalidInput = errors.New("billing: invalid input")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalidInput}, args...)...)
}

// Answers that stop a whole billing run (invariant I8), besides the
// refusals of a spend-cap proxy ([spendcap.ErrSpendCapReached],
// [spendcap.ErrEndpointNotAllowed], [spendcap.ErrVaultKeyRevoked]). They are never
// retried; a [Biller.Run] that meets one sends nothing more. Claims it made
// whose key never executed at Stripe (not sent, or refused before
// execution) are abandoned, so the run after the fix claims them afresh
// with its own configuration; the others stay pending, to be resumed with
// the same keys.
var (
	// ErrStripeAuth: Stripe answered 401 or 403 (a revoked, expired or wrong
	// secret key, or a restricted key without permission for the call).
	// errors.As finds Stripe's *stripe.Error in the chain.
	ErrStripeAuth = errors.New("billing: Stripe refused the API key")
	// ErrStripeRequest: Stripe (or whatever answers at Config.StripeURL)
	// refused the request itself, in a way that no customer's request
	// could get past: a wrong URL (404 without a resource), an unknown or
	// invalid parameter, a key in the wrong mode (livemode_mismatch,
	// testmode_charges_only), an API version it does not take, a proxy's
	// or a web server's own 4xx, or any 4xx refusal not known to concern
	// one customer. Stripe stores nothing for such a request, so the same
	// key is sent again once the configuration is fixed. errors.As finds
	// the *stripe.Error in the chain. See [Classify] for the table.
	ErrStripeRequest = errors.New("billing: Stripe refused the request")
)

// proxyRefused reports whether err is a spend-cap proxy's refusal: the
// request did not reach Stripe.
func proxyRefused(err error) bool {
	return errors.Is(err, spendcap.ErrSpendCapReached) || errors.Is(err, spendcap.ErrEndpointNotAllowed) ||
		errors.Is(err, spendcap.ErrVaultKeyRevoked)
}

// stopsRun reports whether err is an answer that must stop a billing run.
func stopsRun(err error) bool {
	return proxyRefused(err) || errors.Is(err, ErrStripeAuth) || errors.Is(err, ErrStripeRequest)
}

// FailedError reports a charge that failed definitively: a decline, or
// another refusal about the customer's own account, payment method or price
// that sending again with the same key cannot change (see [Classify]). The
// claim is recorded as failed; billing the customer again for the period is
// a decision for a person, made with [Biller.Rebill].
type FailedError struct {
	Customer, Period string
	Key              string
	Attempt          int
	// Code and DeclineCode are Stripe's error code and decline code, when the
	// failure came from Stripe in this call ("card_declined",
	// "insufficient_funds").
	Code, DeclineCode string
	// Reason is what was recorded on the claim.
	Reason string
	// AfterProcessing: the payment was accepted as processing (a bank
	// debit) and failed when it settled; Code is Stripe's failure code.
	// It is not a card decline, and like one it is never billed again
	// without a Rebill.
	AfterProcessing bool
}

func (e *FailedError) Error() string {
	next := "the next attempt number"
	if e.Attempt > 0 {
		next = fmt.Sprintf("attempt %d", e.Attempt+1)
	}
	return fmt.Sprintf("billing: charge for customer %s, period %s failed: %s; to bill again, call Rebill with %s",
		e.Customer, e.Period, e.Reason, next)
}

// KeyReuseError reports Stripe's idempotency_error: a key was sent with
// parameters that differ from those it was first used with. It means a bug
// (the amount changed under a claimed key, or keys collide); nothing was
// charged by this request, and the claim stays pending for a person to look
// at.
type KeyReuseError struct {
	Customer, Period, Key string
	Err                   error
}

func (e *KeyReuseError) Error() string {
	return fmt.Sprintf("billing: Stripe refused key %s for customer %s, period %s: it was used before with other parameters; this is a bug, not a retryable error: %v",
		e.Key, e.Customer, e.Period, e.Err)
}

func (e *KeyReuseError) Unwrap() error { return e.Err }

// UnknownOutcomeError reports that retries ran out before Stripe gave a
// definitive answer. The charge may or may not exist. The claim stays pending
// with its key; the next Charge or Run for the same customer and period
// resumes it with that key, which is safe: Stripe replays the charge if it was
// made.
type UnknownOutcomeError struct {
	Customer, Period, Key string
	Err                   error
}

func (e *UnknownOutcomeError) Error() string {
	return fmt.Sprintf("billing: outcome unknown for customer %s, period %s (key %s); the claim stays pending and the next run resumes it safely with the same key: %v",
		e.Customer, e.Period, e.Key, e.Err)
}

func (e *UnknownOutcomeError) Unwrap() error { return e.Err }

// InProgressError reports that another runner holds a live claim on the
// customer and period and may be charging right now.
type InProgressError struct {
	Customer, Period, Key string
	Owner                 string
	LeaseUntil            time.Time
}

func (e *InProgressError) Error() string {
	return fmt.Sprintf("billing: customer %s, period %s is being charged by %s (lease until %s); try again after that",
		e.Customer, e.Period, e.Owner, e.LeaseUntil.UTC().Format(time.RFC3339))
}

// NeedsReconciliationError reports a pending claim older than the key window
// margin for which Stripe's search could not settle whether a charge exists.
// Sending again could charge twice, so billonce does not; look the key up in
// the Stripe dashboard, then record the outcome.
type NeedsReconciliationError struct {
	Customer, Period, Key string
	Age                   time.Duration
	Reason                string
}

func (e *NeedsReconciliationError) Error() string {
	return fmt.Sprintf("billing: customer %s, period %s (key %s) was claimed %s ago and its outcome is unknown: %s; check Stripe for metadata billonce_key=%s before billing again",
		e.Customer, e.Period, e.Key, e.Age.Round(time.Minute), e.Reason, e.Key)
}

// RecordError reports that Stripe charged the customer but the outcome could
// not be written to the claim store. The charge is not lost: the claim stays
// pending with its key, and the next run gets the same charge back from
// Stripe (a replay) and records it.
type RecordError struct {
	Customer, Period, Key, StripeID string
	Err                             error
}

func (e *RecordError) Error() string {
	return fmt.Sprintf("billing: customer %s, period %s was charged (%s) but recording it failed; the next run records it from Stripe's replay: %v",
		e.Customer, e.Period, e.StripeID, e.Err)
}

func (e *RecordError) Unwrap() error { return e.Err }

// IdentityError reports a pending claim whose key was sent to another
// endpoint (the other API) or with another credential (a rotated or
// different secret key) than this Biller's (invariant I11). Stripe may keep
// idempotency keys per endpoint and per API key, so sending the key from
// here could be refused as reused or, worse, charge a second time. Stripe's
// search found no payment for the key, which before the key's deadline
// proves nothing (search may not have indexed it yet). Nothing was sent and
// the claim stays pending.
//
// Finish the claim with a Biller configured as the one that made it, or
// let SearchIn pass: after the key's 24-hour window any Biller of the same scope
// settles it by searching Stripe for its payment first, and sends it again
// only if none exists. Endpoint and Credential are empty for claims made
// before they were recorded.
type IdentityError struct {
	Customer, Period, Key string
	// Where the key went: the API and the credential's fingerprint.
	Endpoint, Credential string
	// Where this Biller would send it.
	WantEndpoint, WantCredential string
	// SearchIn is how long until the key's 24-hour window has passed.
	SearchIn time.Duration
}

func (e *IdentityError) Error() string {
	where := fmt.Sprintf("to %s with credential %s", orUnknown(e.Endpoint), orUnknown(e.Credential))
	return fmt.Sprintf("billing: customer %s, period %s: the pending claim's key %s was sent %s, but this Biller sends to %s with credential %s; "+
		"nothing was sent: finish it with the Biller that made it, or in %s any Biller of this scope settles it by searching Stripe first",
		e.Customer, e.Period, e.Key, where, e.WantEndpoint, e.WantCredential, e.SearchIn.Round(time.Minute))
}

func orUnknown(s string) string {
	if s == "" {
		return "(not recorded)"
	}
	return s
}
