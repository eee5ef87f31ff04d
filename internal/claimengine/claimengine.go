// Package claimengine is the claim store as billing drives it: claim,
// batch claim, lease, send checks, succeed, fail, processing, takeover,
// reconcile lists and events. Package claim implements it for its
// Postgres and Memory stores; users see only claim.Store, which says what
// they may call.
//
// The engine is generic over the claim row, C, which is always
// claim.Claim: package claim imports this one, so this one cannot name
// claim's types. Callers write Engine[claim.Claim].
//
// The methods return claim.ErrInvalid, claim.ErrNotFound and
// *claim.MismatchError, which users may meet, and the errors below, which
// billing handles itself.
package claimengine

import (
	"context"
	"errors"
	"fmt"
	"time"
)

var (
	// ErrLeaseLost is returned when the caller no longer holds the claim:
	// its lease expired and another runner resumed it, or it is no longer
	// pending. Stop working on it.
	ErrLeaseLost = errors.New("claim: lease lost: another runner holds this claim or it is no longer pending")
	// ErrWindowClosed is returned when the key's window is over: Stripe
	// may have forgotten the key, so sending it again could charge a
	// second time. Search for the key's payment first; if none exists,
	// Reopen the claim.
	ErrWindowClosed = errors.New("claim: the key's window is over; search for its payment before sending it again")
	// ErrConflict is returned when an outcome contradicts the recorded one
	// (a second, different charge id, or success after failure).
	ErrConflict = errors.New("claim: conflicting outcome")
	// ErrFenced is returned by Claim and ClaimBatch when a request's
	// Fence no longer holds: another holder took the lease over, or it
	// ended. Nothing was claimed; stop claiming under that lease.
	ErrFenced = errors.New("claim: fenced: the lease the claim was made under has another holder")
)

// Engine is what a claim store does for billing. All methods are safe for
// concurrent use.
type Engine[C any] interface {
	// Claim records the intent to charge before anything is sent. See
	// [Outcome] for what the caller does next. A request that conflicts
	// with an existing claim returns a *claim.MismatchError; one whose
	// Fence no longer holds claims nothing and returns ErrFenced.
	Claim(ctx context.Context, req Request) (Result[C], error)
	// ClaimBatch claims many requests at once, with the same outcomes as
	// Claim, in request order. Requests that conflict get Outcome Mismatch
	// with their *claim.MismatchError in Result.Conflict, also joined into
	// the returned error; the other results are still valid.
	ClaimBatch(ctx context.Context, reqs []Request) ([]Result[C], error)
	// CheckSend is asked before every send of key (a caller may skip it
	// only for the first send of a claim it has just won, while the lease
	// is certainly still its own: no request can have carried the key
	// yet): it returns nil if owner still holds the pending claim and less
	// than window has passed, on the store's clock, since the key's window
	// started (Claim.FirstSentAt). It returns ErrLeaseLost if owner
	// no longer holds the claim, and ErrWindowClosed once the window
	// is over: the key must not be sent again before a search proves no
	// payment exists for it (see Reopen).
	CheckSend(ctx context.Context, key, owner string, window time.Duration) error
	// Reopen records that a search, made after the key's window was over,
	// found no payment for key: the key starts a new window now, sent to
	// endpoint with credential. Only owner's pending claim can be
	// reopened; otherwise it returns ErrLeaseLost.
	Reopen(ctx context.Context, key, owner, endpoint, credential string) error
	// Renew extends owner's lease on a pending claim. It returns
	// ErrLeaseLost if owner no longer holds the claim.
	Renew(ctx context.Context, key, owner string) error
	// Advance records, on owner's pending claim whose lease is live, that
	// step is done at Stripe and that stripeID is the object the claim's
	// steps build on (an invoice's draft). The claim keeps stripeID from
	// then on: another id is ErrConflict. It starts the window of the
	// claim's next key now: that key has not been sent yet, so CheckSend
	// then counts its window from a time no later than its first send.
	// ErrLeaseLost when owner does not hold the claim.
	Advance(ctx context.Context, key, owner, stripeID, step string) error
	// Succeed records the charge. Calling it again with the same stripeID
	// is fine; a different id, or a failed claim, returns
	// ErrConflict.
	Succeed(ctx context.Context, key, stripeID string) error
	// Fail records a definitive failure: the key will never be charged.
	// stripeID is the Stripe object that failed, when Stripe's answer
	// named one (the declined PaymentIntent or charge), or "": the claim
	// records it as its own, so that the object's later events are shown
	// to be about its send (a PaymentIntent its customer completes after
	// the decline). Calling it again is fine; a succeeded claim returns
	// ErrConflict.
	Fail(ctx context.Context, key, stripeID, reason string) error
	// Release gives up owner's lease when the outcome is unknown: the
	// claim stays pending, lastErr is recorded and the lease expires at
	// once, so the next Claim resumes it with the same key. A stripeID
	// other than "" is the object the claim's steps made and build on (an
	// invoice): a claim that records none yet records it, without
	// starting a window, so that the object's events are known to be
	// about the claim's own send (see Advance).
	Release(ctx context.Context, key, owner, stripeID, lastErr string) error
	// ReleaseUnsent releases like Release, and records on the claim that
	// its key is known never to have executed at Stripe although Stripe
	// refused it as seen (claim.Claim.Unsent), until a Reopen.
	ReleaseUnsent(ctx context.Context, key, owner, lastErr string) error
	// Abandon deletes owner's pending claim whose key never executed at
	// Stripe: it was never sent, or every request carrying it was refused
	// before execution (an authentication failure, a rate limit, a refusal
	// of the request itself), so Stripe stored nothing under it. The next
	// Claim starts afresh. Never abandon a claim whose key may have run.
	// It returns ErrLeaseLost if owner no longer holds the claim.
	Abandon(ctx context.Context, key, owner string) error
	// Get returns the claim for key, or claim.ErrNotFound.
	Get(ctx context.Context, key string) (C, error)
	// Period returns the claims of customer's period, in every state and
	// of every scope, ordered by attempt and creation: the attempts of one
	// period read at once, whatever claims were deleted between them.
	Period(ctx context.Context, customer, period string) ([]C, error)
	// Stale lists pending claims whose lease has expired, oldest first: of
	// scope, and of unknown scope (claims made before scopes were
	// recorded), or all of them when scope is "".
	Stale(ctx context.Context, scope string) ([]C, error)
	// Process records that Stripe answered key with a payment, stripeID,
	// that has not settled: the claim becomes processing. Calling it
	// again, or after the outcome was applied, is fine; a claim that
	// records another payment returns ErrConflict.
	Process(ctx context.Context, key, stripeID string) error
	// Apply records what Stripe reported about key's payment, from a
	// webhook event or a read of the payment, exactly once and never
	// backwards: see [Update] and [Applied]. A key without a claim returns
	// claim.ErrNotFound and records nothing.
	Apply(ctx context.Context, u Update) (Applied[C], error)
	// Unsettled lists processing claims that have been processing for at
	// least olderThan on the store's clock, oldest first, of scope and of
	// unknown scope, or all of them when scope is "".
	Unsettled(ctx context.Context, scope string, olderThan time.Duration) ([]C, error)
	// PruneEvents deletes the records of the events Apply recorded more
	// than olderThan ago on the store's clock, and returns how many it
	// deleted. An event delivered again after its record is gone is
	// applied again and changes nothing (see Apply), so the records are
	// needed only while Stripe may still send the event. It deletes a
	// batch at a time, each in its own short transaction, so webhook
	// deliveries never wait long behind it; it stops early, with ctx's
	// error, when ctx is done.
	PruneEvents(ctx context.Context, olderThan time.Duration) (int, error)
}

// adapt is set by package claim: it returns the engine of a claim.Store.
var adapt func(store any) any

// Register is called by package claim, once, to give [Of] the engine of
// its stores.
func Register(f func(store any) any) { adapt = f }

// Of returns the engine of store, a claim.Store, or nil if it has none.
// A store that is an Engine itself (a test's wrapper around a real store,
// overriding some of its methods) is its own engine.
func Of[C any](store any) Engine[C] {
	if e, ok := store.(Engine[C]); ok {
		return e
	}
	if adapt != nil {
		if e, ok := adapt(store).(Engine[C]); ok {
			return e
		}
	}
	return nil
}

// A Batcher is an engine that answers many send checks and records many
// successes in one round trip to its database, as claim's Postgres store
// does; billing's runs use it when the engine has it, and make each call
// on its own otherwise.
type Batcher interface {
	// CheckSendSucceed answers many CheckSend questions and records many
	// successes in one round trip. checkErrs[i] is what CheckSend(ctx,
	// checks[i].Key, checks[i].Owner, window) would return, and
	// doneErrs[i] what Succeed(ctx, done[i].Key, done[i].StripeID) would.
	// Each check is made after the call began, exactly as CheckSend makes
	// it: a nil answer allows one send that starts after CheckSendSucceed
	// returns.
	CheckSendSucceed(ctx context.Context, window time.Duration, checks []SendCheck, done []Success) (checkErrs, doneErrs []error)
}

// A Request asks to charge Amount of Currency to Customer for Period under
// Key. Customer, Period and Key are opaque strings of 1 to 255 bytes.
type Request struct {
	Customer string
	Period   string
	Key      string // the idempotency key sent to Stripe
	Amount   int64  // in the currency's smallest unit; > 0
	Currency string // three lowercase letters, as Stripe writes them: "usd"
	// Owner names the runner making the claim and must be unique to it
	// (host, process and run, for example): a claim whose owner matches
	// is resumed, not reported as in progress.
	Owner string

	// Where the key goes, recorded on a new claim and never changed by a
	// resume; each is optional, at most 255 bytes. Scope names
	// the product or kind of charge that derived the key, Attempt the
	// billing attempt it stands for (1 for the first charge, 2 and up for
	// re-bills), Endpoint the API that receives it ("charges",
	// "payment_intents") and Credential a fingerprint of the credential
	// that sends it (never the credential itself). A caller that finds a
	// claim whose Endpoint or Credential differs from its own must not
	// send its key blind: the key's first request may have gone to
	// another key space.
	Scope      string
	Attempt    int
	Endpoint   string
	Credential string

	// For a usage report, its identity at Stripe's meter: the meter's
	// event name and the window the usage was measured in, WindowStart
	// inclusive, WindowEnd exclusive; all empty for any other claim.
	// No two live claims of one customer and meter have overlapping
	// windows unless the windows are the same: a request whose window
	// overlaps another's is a *claim.MismatchError on "window".
	Meter                  string
	WindowStart, WindowEnd time.Time
	// MeterID is the usage report's meter's Stripe id ("mtr_…"), which
	// names the meter on one Stripe account: a meter error report moves
	// the claim only if it is about this meter (see Update.MeterID).
	// Optional, and only with Meter.
	MeterID string

	// Account is the Stripe account the key goes to: a connected
	// account's id ("acct_…"), or "" for the platform's own. It is part of
	// the claim's identity: a request for a claim's key, or for its
	// customer and period, under another account is a
	// *claim.MismatchError on "account".
	Account string

	// RefundOf, for a refund, is the key of the payment's claim it
	// refunds; empty for any other claim. A refund is claimed only while
	// that claim is succeeded, in the request's currency, and its live
	// refunds (pending, processing or succeeded), with this one, add up to
	// no more than its amount, under any concurrency: otherwise nothing is
	// claimed, and the answer is a *claim.MismatchError on "refund".
	RefundOf string

	// Fence, when set, makes the claim conditional on a lease: it is
	// made only if the lease still has the holder the claim is made for.
	// Every request of a ClaimBatch carries the same Fence.
	Fence Fence
}

// A Fence names a lease of package lock by its fencing token: a claim
// statement with a Fence checks, FOR SHARE, that a row of Table still
// carries Token, and claims nothing otherwise (ErrFenced), so that no
// claim lands once another holder has taken the lease over. Table is
// found by the claim store's search_path: the lease must be in the claim
// store's database. The memory store, a single process's, checks
// nothing. The zero Fence is none.
type Fence struct {
	Table string // the lease table, unquoted
	Token int64
}

// Outcome tells the caller of Claim what to do.
type Outcome int

// The outcomes of a claim.
const (
	// Won: a new claim; send the charge with the key.
	Won Outcome = iota + 1
	// Resumed: a pending claim whose lease had expired (or was already the
	// caller's) is now the caller's; send again with the same key and the
	// recorded amount. If Claim.Age nears Stripe's 24-hour window,
	// reconcile with Stripe first.
	Resumed
	// InProgress: another runner holds a live lease; do nothing.
	InProgress
	// Succeeded: already charged; Claim.StripeID names the charge. Do not
	// call Stripe.
	Succeeded
	// Failed: the key failed definitively; billing again takes a new key.
	Failed
	// Mismatch: the request conflicts with an existing claim (only in
	// ClaimBatch results; Claim returns a *claim.MismatchError).
	Mismatch
	// Processing: the payment exists and has not settled yet;
	// Claim.StripeID names it. Do not call Stripe: the outcome arrives by
	// webhook or by reading the payment (see Apply).
	Processing
)

var outcomeNames = [...]string{"Outcome(0)", "Won", "Resumed", "InProgress", "Succeeded", "Failed", "Mismatch", "Processing"}

func (o Outcome) String() string {
	if o >= 0 && int(o) < len(outcomeNames) {
		return outcomeNames[o]
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the answer to a claim: the outcome and the claim as it stands
// after the call.
type Result[C any] struct {
	Outcome Outcome
	Claim   C
	// Conflict is the *claim.MismatchError that says what differs when
	// Outcome is Mismatch (ClaimBatch only); nil otherwise.
	Conflict error
}

// A SendCheck asks CheckSend's question: may Owner send Key now?
type SendCheck struct{ Key, Owner string }

// A Success is a Succeed call: Key was charged as StripeID.
type Success struct{ Key, StripeID string }

// An Update is what Stripe reported about a claim's payment: a webhook
// event, or a read of the payment by a caller that polls.
type Update struct {
	// EventID is Stripe's event id ("evt_…"). An update with an id is
	// applied at most once: the id is recorded in the transaction that
	// applies it, and a redelivery changes nothing. "" for a read of the
	// payment, which is not recorded and may be applied any number of
	// times.
	EventID string
	// EventType is recorded with the event ("charge.succeeded").
	EventType string
	// Key is the claim's key, from the payment's metadata.
	Key string
	// StripeID is the payment: the charge or PaymentIntent id the claim
	// records. An update for another payment changes nothing.
	StripeID string
	// Created is when Stripe created the event (or when the payment was
	// read).
	Created time.Time
	// State is the payment's state, one of claim's: "processing",
	// "succeeded", "failed", or "" for an update that only reports a
	// refund or a dispute.
	State string
	// FailureCode is Stripe's failure code when State is "failed".
	FailureCode string
	// Refunded is the amount refunded so far (Stripe's amount_refunded).
	Refunded int64
	// Amount and Currency are what the object asks for: a payment's
	// amount, an invoice's total (0 included), in the currency's smallest
	// unit; Currency is "" when the update does not say (a dispute, a
	// meter error report).
	// An update that says the claim's money moved or is moving (State
	// succeeded or processing) for another amount than the claim's is not
	// about the claim's own send as billonce made it (another writer
	// changed the object), and changes nothing (Unproven).
	Amount   int64
	Currency string
	// Dispute describes a dispute opened on the payment.
	Dispute string
	// Endpoint is the kind of Stripe object the update is about, as a
	// claim's Endpoint names it: "invoices", "meter_events", "refunds", or "" for a
	// payment (a charge or a PaymentIntent). A key in an object's metadata
	// is whatever its maker wrote, so an update about another kind of
	// object than the claim's changes nothing (OtherPayment); nor does an
	// update for a claim that has recorded no object of its own yet
	// (Unproven).
	Endpoint string
	// Account is the Stripe account the update's object is on: the
	// event's account ("acct_…", or "" for the platform's own), or the
	// account it was read from. An update about another account's object
	// than the claim's changes nothing (OtherPayment): ids and metadata
	// mean nothing across accounts.
	Account string
	// MeterID, SentFrom, SentTo and ReadAt say what an update about a
	// usage report's meter event (a meter error report) is about, since
	// the event's identifier, the claim's key, is whatever its sender
	// chose: the events of one meter, by its Stripe id ("mtr_…", unique
	// to one Stripe account's meter), that Stripe received from SentFrom
	// to SentTo (the report's validation window), on Stripe's clock, which
	// read ReadAt when the update was read. The store measures SentFrom
	// and SentTo as ages against ReadAt, and the claim's times as ages on
	// its own clock, so that the two clocks need not agree. Such an update
	// moves only a claim that recorded that meter id (Request.MeterID)
	// and whose key could be sent within that window.
	MeterID                  string
	SentFrom, SentTo, ReadAt time.Time
}

// ApplyOutcome says what Apply did.
type ApplyOutcome int

const (
	// Changed: the update moved the claim forward or recorded a refund or
	// a dispute.
	Changed ApplyOutcome = iota + 1
	// Unchanged: the claim already knew as much or more (an older event
	// arriving late, a repeated read), or the update contradicts a settled
	// outcome; Applied.Reason says which. A recorded event stays recorded.
	Unchanged
	// Duplicate: the event was applied (or found unchanged) before.
	Duplicate
	// OtherPayment: the claim records another payment than the update's;
	// nothing changed. It deserves a look: one key, two payments.
	OtherPayment
	// Unproven: nothing shows that the update is about the claim's own
	// send, which alone may move it: the claim has recorded no Stripe
	// object of its own yet (its payment, its invoice's draft), or an
	// update about a meter event names no meter or no time, or may be
	// about an earlier send of the key, or is for a usage claim that
	// recorded no meter id. Nothing changed; the claim's own
	// send settles it (a resume gets Stripe's answer to its key again).
	Unproven
	// PaidTwice: the update is the claim's own payment succeeding after
	// the claim failed, while another claim holds the claim's period (a
	// re-bill that paid it, or is processing, or has recorded steps at
	// Stripe; or a claim of another scope or kind): nothing changed, and
	// the period may be paid twice. A person decides what to refund.
	PaidTwice
)

var applyNames = [...]string{"ApplyOutcome(0)", "Changed", "Unchanged", "Duplicate", "OtherPayment", "Unproven", "PaidTwice"}

func (o ApplyOutcome) String() string {
	if o >= 0 && int(o) < len(applyNames) {
		return applyNames[o]
	}
	return fmt.Sprintf("ApplyOutcome(%d)", int(o))
}

// Applied is the answer to Apply.
type Applied[C any] struct {
	Outcome ApplyOutcome
	// Claim is the claim after the update.
	Claim C
	// Before is the claim as it was before the update.
	Before C
	// Reason says why an update changed nothing, or what it changed.
	Reason string
	// Superseded is the re-bill of the claim's period that the update
	// stopped, as it is now (failed), when the update was the claim's own
	// payment succeeding after the claim failed and the re-bill was still
	// pending: the zero C otherwise. The re-bill is failed in the same
	// transaction, so that no send check passes for its key any more; if
	// an earlier attempt of its key reached Stripe, its payment is not
	// recorded.
	Superseded C
}
