package claim

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/billonce/billonce/internal/claimengine"
)

// maxIDLen is the longest customer, period, key, owner or Stripe id accepted,
// in bytes.
const maxIDLen = 255

// A Store holds claims: [Postgres] is the durable, cluster-wide store;
// [NewMemory] is a single-process stand-in for unit tests. Pass one to
// billing.Config.Claims; look a claim up with Get.
//
// Store is implemented by this package only, and it may gain methods.
// What billing does with a store (claim, lease, send checks, succeed,
// fail, settle, reconcile) is the store's engine, kept inside billonce so
// that it can change with billing: the methods listed here are the whole
// contract with users. All methods are safe for concurrent use.
type Store interface {
	// Get returns the claim for key, or [ErrNotFound].
	Get(ctx context.Context, key string) (Claim, error)

	// engine returns the store's claimengine.Engine[Claim].
	engine() any
}

// validateRequest reports what is wrong with r, as an error wrapping
// [ErrInvalid].
func validateRequest(r request) error {
	var problems []string
	for _, f := range [...]struct{ name, v string }{
		{"customer", r.Customer}, {"period", r.Period}, {"key", r.Key}, {"owner", r.Owner},
	} {
		if p := checkID(f.name, f.v); p != "" {
			problems = append(problems, p)
		}
	}
	for _, f := range [...]struct{ name, v string }{
		{"scope", r.Scope}, {"endpoint", r.Endpoint}, {"credential", r.Credential}, {"account", r.Account},
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
	if r.MeterID != "" {
		if p := checkID("meter id", r.MeterID); p != "" {
			problems = append(problems, p)
		}
		if r.Meter == "" {
			problems = append(problems, "a meter id needs its meter's event name and the usage window")
		}
	}
	if r.Meter != "" || !r.WindowStart.IsZero() || !r.WindowEnd.IsZero() {
		if p := checkID("meter", r.Meter); p != "" {
			problems = append(problems, p)
		}
		switch {
		case r.WindowStart.IsZero() || r.WindowEnd.IsZero():
			problems = append(problems, "a usage window needs both a start and an end")
		case !r.WindowEnd.After(r.WindowStart):
			problems = append(problems, fmt.Sprintf("window end %s must be after its start %s", r.WindowEnd.UTC().Format(time.RFC3339), r.WindowStart.UTC().Format(time.RFC3339)))
		}
	}
	if r.RefundOf != "" {
		if p := checkID("refund of", r.RefundOf); p != "" {
			problems = append(problems, p)
		}
		if r.RefundOf == r.Key {
			problems = append(problems, "a refund's key must not be the key of the payment it refunds")
		}
		if r.Meter != "" || r.Currency == "" {
			problems = append(problems, "a refund needs its payment's currency, and no meter")
		}
	}
	if r.Currency != "" && !validCurrency(r.Currency) {
		problems = append(problems, fmt.Sprintf("currency %q must be three lowercase letters, as in \"usd\" (or empty, for a usage report)", r.Currency))
	}
	if f := r.Fence; f != (claimengine.Fence{}) && (!identRE.MatchString(f.Table) || len(f.Table) > 63 || f.Token <= 0) {
		problems = append(problems, fmt.Sprintf("fence: lease table %q must be an identifier of at most 63 characters, and token %d positive", f.Table, f.Token))
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
	case len(v) > maxIDLen:
		return fmt.Sprintf("%s is %d bytes long, more than %d", name, len(v), maxIDLen)
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

// validateOptionalID checks a Stripe id argument that may be empty.
func validateOptionalID(name, v string) error {
	if v == "" {
		return nil
	}
	return validateID(name, v)
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
func validateBatch(reqs []request) error {
	keys := make(map[string]int, len(reqs))
	periods := make(map[[2]string]int, len(reqs))
	for i, r := range reqs {
		if err := validateRequest(r); err != nil {
			return fmt.Errorf("request %d: %w", i, err)
		}
		if r.Fence != reqs[0].Fence {
			return fmt.Errorf("%w: requests 0 and %d have different fences; a batch is claimed under one lease", ErrInvalid, i)
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

// State is where a claim is in its life. The zero State (empty) is no
// claim: the State of a Claim that was not found.
type State string

// The states of a claim. Succeeded is terminal, but for a usage report
// rejected after it was accepted and a refund that failed after it
// succeeded, which fail. Failed is terminal for its key: only the claim's
// own recorded payment succeeding after all moves it on, to Succeeded (see
// the package documentation's States).
const (
	StatePending State = "pending"
	// StateProcessing: the payment exists at Stripe but has not settled (a
	// bank debit: a charge "pending", a PaymentIntent "processing"). The
	// claim holds its period like a succeeded one and is never sent again;
	// it becomes succeeded or failed when the outcome arrives, by webhook
	// or by a read of the payment.
	StateProcessing State = "processing"
	StateSucceeded  State = "succeeded"
	StateFailed     State = "failed"
)

// FailureSuperseded is the FailureCode of a re-bill stopped before it was
// sent again, because an earlier attempt of its period was paid after all:
// that attempt's own payment succeeded after it had failed.
const FailureSuperseded = "superseded"

// A Claim is a row of the claim table.
type Claim struct {
	Customer   string
	Period     string
	Key        string
	Amount     int64
	Currency   string
	State      State
	StripeID   string    // set when State is StateSucceeded, and on a failed claim whose failure named its object (see also Step)
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

	// Meter, WindowStart and WindowEnd are a usage report's identity at
	// Stripe's meter: the meter's event name and the window the usage
	// was measured in, start inclusive, end exclusive; empty for any
	// other claim. No two live claims of one customer and meter have
	// overlapping windows unless the windows are the same. A usage claim
	// made before migration 6 recorded them has no WindowEnd, and takes
	// no part in that rule.
	Meter                  string
	WindowStart, WindowEnd time.Time
	// MeterID is the Stripe id of a usage report's meter ("mtr_…"),
	// recorded when the report is claimed: it names the meter on one
	// Stripe account, where Meter, an event name, may name a meter on
	// each. A meter error report moves the claim only if it is about
	// this meter. "" for other claims, and for usage claims made before
	// migration 7 recorded it, which no meter error report moves.
	MeterID string
	// Unsent is set on a pending claim whose key is known never to have
	// executed at Stripe although Stripe refused it as one it has seen: a
	// usage report whose meter event identifier another writer took. A
	// resume of it does not take that refusal for its own event. A
	// lookup that reopens the key's window clears it.
	Unsent bool

	// Account is the Stripe account the claim's key goes to: a connected
	// account's id, or "" for the platform's own (every claim made before
	// migration 12).
	Account string

	// RefundOf is, on a refund's claim, the key of the payment claim it
	// refunds; "" on every other claim. The live refunds of a payment
	// never add up to more than its amount.
	RefundOf string

	// Step is a recovery point of a claim made in steps (an invoice:
	// "line 3", the last line found at Stripe after a step's window had
	// passed; "draft" and "finalized" on claims of earlier versions): ""
	// for none, and for payments and usage reports, which are one request
	// each. An invoice records no step on its way: what exists is found
	// again at Stripe. While such a claim is pending, StripeID names the
	// object its steps build on (the invoice), once a call that gave up
	// part way or a recovery point recorded it.
	Step string
}

var (
	// ErrInvalid is returned, wrapped, when an argument is bad; the error
	// says what to fix, and nothing was written.
	ErrInvalid = errors.New("claim: invalid argument")
	// ErrNotFound is returned by Get when no claim has the key.
	ErrNotFound = errors.New("claim: no claim with this key")
)

// MismatchError reports a request that conflicts with an existing claim: the
// key is held for another customer or period, the customer and period are
// held under another key, the amount or currency differs, or a usage
// report's window overlaps the window of another live claim of the same
// customer and meter (Field "window"), or the customer and period has a
// failed claim of another scope (Field "scope": Have is that scope, Want
// the request's), which only that scope re-bills, or a refund is more than
// is left of its payment, or its payment's claim is not succeeded (Field
// "refund": Existing is the payment's claim, Have the amount left to
// refund, Want the refund's amount).
// Nothing is charged twice: the caller must investigate.
type MismatchError struct {
	Field    string // "key", "customer", "period", "amount", "currency", "account", "window", "scope" or "refund"
	Have     string // the value recorded in Existing
	Want     string // the value requested
	Existing Claim  // the conflicting claim
}

func (e *MismatchError) Error() string {
	switch e.Field {
	case "window":
		c := e.Existing
		return fmt.Sprintf("claim: window %s of customer %q on meter %q overlaps window %s, already claimed by %q (period %q, %s); "+
			"the meter would count the overlap twice, so windows of one customer and meter never overlap: report each stretch of time in one window "+
			"(windows that meet, one ending where the next starts, do not overlap)",
			e.Want, c.Customer, c.Meter, e.Have, c.Key, c.Period, c.State)
	case "account":
		c := e.Existing
		return fmt.Sprintf("claim: customer %q, period %q is claimed (claim %q, %s) on Stripe account %s, the request is for account %s; "+
			"a claim's account is never switched, since its key and objects live on the account it went to: bill the period on account %s, "+
			"or settle that claim first; nothing was claimed, so nothing is sent",
			c.Customer, c.Period, c.Key, c.State, accountName(e.Have), accountName(e.Want), accountName(e.Have))
	case "refund":
		c := e.Existing
		if c.State != StateSucceeded {
			return fmt.Sprintf("claim: payment claim %q of customer %q, period %q is %s: only a succeeded payment is refunded; nothing was claimed, so nothing is sent",
				c.Key, c.Customer, c.Period, c.State)
		}
		return fmt.Sprintf("claim: a refund of %s %s is more than the %s %s left to refund of payment %s (claim %q of customer %q, period %q, %d %s, less its live refunds); nothing was claimed, so nothing is sent",
			e.Want, c.Currency, e.Have, c.Currency, c.StripeID, c.Key, c.Customer, c.Period, c.Amount, c.Currency)
	case "scope":
		c := e.Existing
		if c.Meter != "" {
			return fmt.Sprintf("claim: customer %q, usage %q failed under scope %q (claim %q, attempt %d); a report of scope %q does not send it again, "+
				"since only the scope that claimed a rejected report reports it again: if it is to be counted, report it again from the Biller of scope %q "+
				"(billing.ReportUsage with Usage.Attempt one more than the failed claim's, Config.Scope = %q); nothing was claimed, so nothing is sent",
				c.Customer, c.Period, e.Have, c.Key, c.Attempt, e.Want, e.Have, e.Have)
		}
		return fmt.Sprintf("claim: customer %q, period %q failed under scope %q (claim %q, attempt %d); a claim of scope %q does not bill it again, "+
			"since only the scope that claimed a declined period re-bills it: if it is to be billed again, re-bill it from the Biller of scope %q "+
			"(billing.Rebill with Config.Scope = %q); nothing was claimed, so nothing is sent",
			c.Customer, c.Period, e.Have, c.Key, c.Attempt, e.Want, e.Have, e.Have)
	}
	return fmt.Sprintf("claim: mismatch on %s: claim %q for customer %q, period %q has %s %q, request has %q; "+
		"a claim is only ever resent with its own key, amount and currency, so fix the request or re-bill under a new key once the claim has failed",
		e.Field, e.Existing.Key, e.Existing.Customer, e.Existing.Period, e.Field, e.Have, e.Want)
}

// windowText is how a MismatchError writes a usage window.
func windowText(start, end time.Time) string {
	return start.UTC().Format(time.RFC3339) + " to " + end.UTC().Format(time.RFC3339)
}

// overlap returns the *MismatchError of a request whose window overlaps
// the window of c, a live claim of the same customer and meter.
func overlap(req request, c Claim) *MismatchError {
	return &MismatchError{Field: "window", Have: windowText(c.WindowStart, c.WindowEnd), Want: windowText(req.WindowStart, req.WindowEnd), Existing: c}
}

// compare returns the *MismatchError between a request and the existing
// claim it collided with, or nil if they agree.
func compare(req request, c Claim) *MismatchError {
	for _, f := range [...]struct{ name, have, want string }{
		{"account", c.Account, req.Account}, // first: another account's key differs too
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
