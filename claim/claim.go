package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// MaxIDLen is the longest customer, period, key, owner or Stripe id accepted,
// in bytes.
const MaxIDLen = 255

// A Store records claims. [Postgres] is the durable, cluster-wide store;
// [Memory] is a single-process stand-in for unit tests. All methods
// are safe for concurrent use.
type Store interface {
	// Claim records the intent to charge before anything is sent. See
	// [Outcome] for what the caller does next. A request that conflicts with
	// an existing claim returns a *[MismatchError].
	Claim(ctx context.Context, req Request) (Result, error)
	// ClaimBatch claims many requests at once, with the same outcomes as
	// Claim, in request order. Requests that conflict get Outcome Mismatch
	// with their *MismatchError in Result.Conflict, also joined into the
	// returned error; the other results are still valid.
	ClaimBatch(ctx context.Context, reqs []Request) ([]Result, error)
	// CheckSend is asked before every send of key (a caller may skip it
	// only for the first send of a claim it has just won, while the lease
	// is certainly still its own: no request can have carried the key
	// yet): it returns nil if owner
	// still holds the pending claim and less than window has passed, on the
	// store's clock, since the key's window started (Claim.FirstSentAt). It
	// returns [ErrLeaseLost] if owner no longer holds the claim, and
	// [ErrWindowClosed] once the window is over: the key must not be sent
	// again before a search proves no payment exists for it (see Reopen).
	CheckSend(ctx context.Context, key, owner string, window time.Duration) error
	// Reopen records that a search, made after the key's window was over,
	// found no payment for key: the key starts a new window now, sent to
	// endpoint with credential. Only owner's pending claim can be reopened;
	// otherwise it returns [ErrLeaseLost].
	Reopen(ctx context.Context, key, owner, endpoint, credential string) error
	// Renew extends owner's lease on a pending claim. It returns
	// [ErrLeaseLost] if owner no longer holds the claim.
	Renew(ctx context.Context, key, owner string) error
	// Succeed records the charge. Calling it again with the same stripeID is
	// fine; a different id, or a failed claim, returns [ErrConflict].
	Succeed(ctx context.Context, key, stripeID string) error
	// Fail records a definitive failure: the key will never be charged.
	// Calling it again is fine; a succeeded claim returns [ErrConflict].
	Fail(ctx context.Context, key, reason string) error
	// Release gives up owner's lease when the outcome is unknown: the claim
	// stays pending, lastErr is recorded and the lease expires at once, so
	// the next Claim resumes it with the same key.
	Release(ctx context.Context, key, owner, lastErr string) error
	// Abandon deletes owner's pending claim whose key never executed at
	// Stripe: it was never sent, or every request carrying it was refused
	// before execution (an authentication failure, a rate limit, a refusal
	// of the request itself), so Stripe stored nothing under it. The next
	// Claim starts afresh. Never abandon a claim whose key may have run.
	// It returns [ErrLeaseLost] if owner no longer holds the claim.
	Abandon(ctx context.Context, key, owner string) error
	// Get returns the claim for key, or [ErrNotFound].
	Get(ctx context.Context, key string) (Claim, error)
	// Stale lists pending claims whose lease has expired, oldest first: of
	// scope, and of unknown scope (claims made before scopes were
	// recorded), or all of them when scope is "".
	Stale(ctx context.Context, scope string) ([]Claim, error)

	// Process records that Stripe answered key with a payment, stripeID,
	// that has not settled: the claim becomes processing. Calling it again,
	// or after the outcome was applied, is fine; a claim that records
	// another payment returns [ErrConflict].
	Process(ctx context.Context, key, stripeID string) error
	// Apply records what Stripe reported about key's payment, from a
	// webhook event or a read of the payment, exactly once and never
	// backwards: see [Update] and [Applied]. A key without a claim returns
	// [ErrNotFound] and records nothing.
	Apply(ctx context.Context, u Update) (Applied, error)
	// Unsettled lists processing claims that have been processing for at
	// least olderThan on the store's clock, oldest first, of scope and of
	// unknown scope, or all of them when scope is "".
	Unsettled(ctx context.Context, scope string, olderThan time.Duration) ([]Claim, error)
	// PruneEvents deletes the records of the events Apply recorded more
	// than olderThan ago on the store's clock, and returns how many it
	// deleted. An event delivered again after its record is gone is
	// applied again and changes nothing (see [Store.Apply]), so the
	// records are needed only while Stripe may still send the event: keep
	// them longer than its redeliveries (see the package documentation).
	// It deletes a batch at a time, each in its own short transaction, so
	// webhook deliveries never wait long behind it; it stops early, with
	// ctx's error, when ctx is done.
	PruneEvents(ctx context.Context, olderThan time.Duration) (int, error)
}

// A Request asks to charge Amount of Currency to Customer for Period under
// Key. Customer, Period and Key are opaque strings of 1 to [MaxIDLen] bytes.
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
	// resume; each is optional, at most MaxIDLen bytes. Scope names the
	// product or kind of charge that derived the key, Attempt the billing
	// attempt it stands for (1 for the first charge, 2 and up for re-bills),
	// Endpoint the API that receives it ("charges", "payment_intents") and
	// Credential a fingerprint of the credential that sends it (never the
	// credential itself). A caller that finds a claim whose Endpoint or
	// Credential differs from its own must not send its key blind: the
	// key's first request may have gone to another key space.
	Scope      string
	Attempt    int
	Endpoint   string
	Credential string
}

// Validate reports what is wrong with r, as an error wrapping [ErrInvalid].
func (r Request) Validate() error {
	var problems []string
	for _, f := range [...]struct{ name, v string }{
		{"customer", r.Customer}, {"period", r.Period}, {"key", r.Key}, {"owner", r.Owner},
	} {
		if p := checkID(f.name, f.v); p != "" {
			problems = append(problems, p)
		}
	}
	for _, f := range [...]struct{ name, v string }{
		{"scope", r.Scope}, {"endpoint", r.Endpoint}, {"credential", r.Credential},
	} {
		if f.v != "" {
			if p := checkID(f.name, f.v); p != "" {
				problems = append(problems, p)
			}
		}
	}
	if r.Attempt < 0 {
		problems = append(problems, fmt.Sprintf("attempt %d must not be negative", r.Attempt))
	}
	if r.Amount <= 0 {
		problems = append(problems, fmt.Sprintf("amount %d must be positive (in the currency's smallest unit)", r.Amount))
	}
	if !validCurrency(r.Currency) {
		problems = append(problems, fmt.Sprintf("currency %q must be three lowercase letters, as in \"usd\"", r.Currency))
	}
	if problems != nil {
		return fmt.Errorf("%w: %s", ErrInvalid, strings.Join(problems, "; "))
	}
	return nil
}

func checkID(name, v string) string {
	switch {
	case v == "":
		return name + " is empty"
	case len(v) > MaxIDLen:
		return fmt.Sprintf("%s is %d bytes long, more than %d", name, len(v), MaxIDLen)
	case !utf8.ValidString(v) || strings.ContainsRune(v, 0):
		return name + " must be valid UTF-8 without NUL bytes"
	}
	return ""
}

func validCurrency(c string) bool {
	if len(c) != 3 {
		return false
	}
	for i := range 3 {
		if c[i] < 'a' || c[i] > 'z' {
			return false
		}
	}
	return true
}

// validateID checks a key, owner or Stripe id argument (name says which).
func validateID(name, v string) error {
	if p := checkID(name, v); p != "" {
		return fmt.Errorf("%w: %s", ErrInvalid, p)
	}
	return nil
}

// validateText checks a free-text argument (a reason or an error message).
func validateText(name, v string) error {
	if !utf8.ValidString(v) || strings.ContainsRune(v, 0) {
		return fmt.Errorf("%w: %s must be valid UTF-8 without NUL bytes", ErrInvalid, name)
	}
	return nil
}

// validateBatch validates every request and refuses duplicate keys or
// duplicate (customer, period) pairs within the batch.
func validateBatch(reqs []Request) error {
	keys := make(map[string]int, len(reqs))
	periods := make(map[[2]string]int, len(reqs))
	for i, r := range reqs {
		if err := r.Validate(); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if j, ok := keys[r.Key]; ok {
			return fmt.Errorf("%w: requests %d and %d have the same key %q", ErrInvalid, j, i, r.Key)
		}
		keys[r.Key] = i
		cp := [2]string{r.Customer, r.Period}
		if j, ok := periods[cp]; ok {
			return fmt.Errorf("%w: requests %d and %d are for the same customer %q and period %q", ErrInvalid, j, i, r.Customer, r.Period)
		}
		periods[cp] = i
	}
	return nil
}

// State is where a claim is in its life.
type State string

// The states of a claim. Succeeded and Failed are terminal.
const (
	StatePending State = "pending"
	// StateProcessing: the payment exists at Stripe but has not settled (a
	// bank debit: a charge "pending", a PaymentIntent "processing"). The
	// claim holds its period like a succeeded one and is never sent again;
	// it becomes succeeded or failed when the outcome arrives (see
	// [Store.Apply]).
	StateProcessing State = "processing"
	StateSucceeded  State = "succeeded"
	StateFailed     State = "failed"
)

// A Claim is a row of the claim table.
type Claim struct {
	Customer   string
	Period     string
	Key        string
	Amount     int64
	Currency   string
	State      State
	StripeID   string    // set when State is StateSucceeded
	Leases     int       // how many times the claim was won or resumed
	Owner      string    // the runner holding the lease; "" after Release
	LeaseUntil time.Time // the lease ends at this time on the store's clock
	LastError  string    // the reason for a failure, or the last unknown outcome
	CreatedAt  time.Time
	UpdatedAt  time.Time
	Age        time.Duration // time since CreatedAt on the store's clock

	// Where the key goes (see Request); "" and 0 when unknown, as on
	// claims made before they were recorded.
	Scope      string
	Attempt    int
	Endpoint   string
	Credential string
	// FirstSentAt starts the key's current window: the earliest time the
	// key may have reached Stripe. It is set when the claim is made, before
	// anything is sent, and moved by Reopen. SentAge is the time since then
	// on the store's clock.
	FirstSentAt time.Time
	SentAge     time.Duration
	// ReconciledAt is when a search last found no payment for the key
	// after its window was over; zero if none did.
	ReconciledAt time.Time

	// For payments that settle later: ProcessingAt is when the payment
	// was first known to be processing (zero if it never was), SettledAt
	// when a processing payment's outcome was recorded, and FailureCode
	// Stripe's failure code when it failed after processing. A failed
	// claim with a ProcessingAt failed after settlement, not at the card.
	ProcessingAt time.Time
	SettledAt    time.Time
	FailureCode  string
	// Refunded is the amount refunded so far and Dispute the latest
	// dispute ("dp_… (reason)"). Neither changes State: a refunded or
	// disputed payment was billed, and billing again is a person's
	// decision (a re-bill under a new attempt), never billonce's.
	Refunded int64
	Dispute  string
	// EventAt is Stripe's creation time of the latest event, or read of
	// the payment, applied to the claim; zero if none was.
	EventAt time.Time
	// DisputeAt is Stripe's creation time of the event of Dispute; zero
	// if there is none, or it was recorded before billonce kept this time.
	DisputeAt time.Time
}

// Outcome tells the caller of Claim what to do.
type Outcome int

// The outcomes of a claim.
const (
	// Won: a new claim; send the charge with the key.
	Won Outcome = iota + 1
	// Resumed: a pending claim whose lease had expired (or was already the
	// caller's) is now the caller's; send again with the same key and the
	// recorded amount. If Claim.Age nears Stripe's 24-hour window, reconcile
	// with Stripe first.
	Resumed
	// InProgress: another runner holds a live lease; do nothing.
	InProgress
	// Succeeded: already charged; Claim.StripeID names the charge. Do not
	// call Stripe.
	Succeeded
	// Failed: the key failed definitively; billing again takes a new key.
	Failed
	// Mismatch: the request conflicts with an existing claim (only in
	// ClaimBatch results; Claim returns a *MismatchError).
	Mismatch
	// Processing: the payment exists and has not settled yet;
	// Claim.StripeID names it. Do not call Stripe: the outcome arrives by
	// webhook or by reading the payment (see [Store.Apply]).
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
type Result struct {
	Outcome Outcome
	Claim   Claim
	// Conflict says what differs when Outcome is Mismatch (ClaimBatch
	// only); nil otherwise.
	Conflict *MismatchError
}

var (
	// ErrInvalid wraps every error about bad arguments; nothing was written.
	ErrInvalid = errors.New("claim: invalid argument")
	// ErrNotFound means no claim has the key.
	ErrNotFound = errors.New("claim: no claim with this key")
	// ErrLeaseLost means the caller no longer holds the claim: its lease
	// expired and another runner resumed it, or it is no longer pending.
	// Stop working on it.
	ErrLeaseLost = errors.New("claim: lease lost: another runner holds this claim or it is no longer pending")
	// ErrWindowClosed means the key's window is over: Stripe may have
	// forgotten the key, so sending it again could charge a second time.
	// Search for the key's payment first; if none exists, Reopen the claim.
	ErrWindowClosed = errors.New("claim: the key's window is over; search for its payment before sending it again")
	// ErrConflict means an outcome contradicts the recorded one (a second,
	// different charge id, or success after failure).
	ErrConflict = errors.New("claim: conflicting outcome")
)

// MismatchError reports a request that conflicts with an existing claim: the
// key is held for another customer or period, the customer and period are
// held under another key, or the amount or currency differs.
// Nothing is charged twice: the caller must investigate.
type MismatchError struct {
	Field    string // "key", "customer", "period", "amount" or "currency"
	Have     string // the value recorded in Existing
	Want     string // the value requested
	Existing Claim  // the conflicting claim
}

func (e *MismatchError) Error() string {
	return fmt.Sprintf("claim: mismatch on %s: claim %q for customer %q, period %q has %s %q, request has %q; "+
		"a claim is only ever resent with its own key, amount and currency, so fix the request or re-bill under a new key once the claim has failed",
		e.Field, e.Existing.Key, e.Existing.Customer, e.Existing.Period, e.Field, e.Have, e.Want)
}

// compare returns the *MismatchError between a request and the existing
// claim it collided with, or nil if they agree.
func compare(req Request, c Claim) *MismatchError {
	for _, f := range [...]struct{ name, have, want string }{
		{"key", c.Key, req.Key},
		{"customer", c.Customer, req.Customer},
		{"period", c.Period, req.Period},
		{"amount", fmt.Sprint(c.Amount), fmt.Sprint(req.Amount)},
		{"currency", c.Currency, req.Currency},
	} {
		if f.have != f.want {
			return &MismatchError{Field: f.name, Have: f.have, Want: f.want, Existing: c}
		}
	}
	return nil
}
