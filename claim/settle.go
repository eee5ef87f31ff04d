package claim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/billonce/billonce/internal/claimengine"
	"github.com/jackc/pgx/v5"
)

// validateUpdate reports what is wrong with u, as an error wrapping
// [ErrInvalid].
func validateUpdate(u update) error {
	errs := []error{validateID("key", u.Key), validateID("stripe id", u.StripeID),
		validateText("event type", u.EventType), validateText("failure code", u.FailureCode), validateText("dispute", u.Dispute), validateText("endpoint", u.Endpoint),
		validateText("meter id", u.MeterID)}
	if u.EventID != "" {
		errs = append(errs, validateID("event id", u.EventID))
	}
	switch State(u.State) {
	case "", StateProcessing, StateSucceeded, StateFailed:
	default:
		errs = append(errs, fmt.Errorf("%w: update state %q: use processing, succeeded, failed or none", ErrInvalid, State(u.State)))
	}
	if u.Refunded < 0 {
		errs = append(errs, fmt.Errorf("%w: refunded amount %d is negative", ErrInvalid, u.Refunded))
	}
	if u.Created.IsZero() {
		errs = append(errs, fmt.Errorf("%w: update has no creation time", ErrInvalid))
	}
	if !u.SentFrom.IsZero() && (u.SentTo.Before(u.SentFrom) || u.ReadAt.IsZero()) {
		errs = append(errs, fmt.Errorf("%w: update's window from %s to %s, read at %s: it must end after it starts, and have the time it was read", ErrInvalid,
			u.SentFrom.UTC().Format(time.RFC3339), u.SentTo.UTC().Format(time.RFC3339), u.ReadAt.UTC().Format(time.RFC3339)))
	}
	return errors.Join(errs...)
}

// The Endpoints of claims that are not single payments.
const (
	endpointMeterEvents = "meter_events"
	endpointInvoices    = "invoices"
	endpointRefunds     = "refunds"
)

// objectKind names the kind of Stripe object a claim of endpoint stands
// for: a usage report, an invoice, or a payment (charges, PaymentIntents,
// and claims made before endpoints were recorded).
func objectKind(endpoint string) string {
	switch endpoint {
	case endpointMeterEvents:
		return "a usage report"
	case endpointInvoices:
		return "an invoice"
	case endpointRefunds:
		return "a refund"
	}
	return "a payment"
}

// rank orders the states a payment moves through: an update never moves a
// claim to a lower rank, and the two terminal states do not replace each
// other, but for a failed claim's own payment succeeding (see decide).
func rank(s State) int {
	switch s {
	case StateProcessing:
		return 1
	case StateSucceeded, StateFailed:
		return 2
	}
	return 0
}

// keyWindow is how long after its window opens (Claim.FirstSentAt) a
// claim's key can still reach Stripe: no send check lets a key leave once
// the caller's deadline has passed, and billing's deadline, with an
// attempt's timeout and a margin for clocks, ends before Stripe's 24 hours.
const keyWindow = 24 * time.Hour

// clockSlack is how far apart two readings of one moment may be, on
// Stripe's clock and the database's: the clocks' difference, and the whole
// seconds Stripe gives its times in. A send before the reopening of a
// key's window is further from it: a send that reached Stripe shortly
// before the resend makes Stripe refuse the resend's identifier.
const clockSlack = 5 * time.Minute

// ownSend tells whether u is shown to be about c's own send: the one rule
// by which anything from outside a send (a webhook event, a meter error
// report, a read of the payment) may move a claim, whatever its kind. It
// returns 0 if u is, and otherwise the outcome of an update that changes
// nothing, and why.
//
//   - An update about another kind of object than the claim's is about
//     another write: the key in an object's metadata is whatever its
//     writer chose.
//   - A usage report's key is its meter event's identifier, which any
//     writer may send again once Stripe has forgotten it, or at any time
//     to another meter or another Stripe account, so an update about a
//     meter event shows its claim's send by its meter and its time only:
//     the meter the claim recorded when it was made (Claim.MeterID, the
//     meter's Stripe id, which names one meter of one account), equal to
//     the update's (u.MeterID), and a window (u.SentFrom to u.SentTo)
//     that reaches into the time the claim's key can be sent, from its
//     window's opening to keyWindow after, and, once the key's window was
//     reopened after a search, does not begin before that: the send
//     before the reopening, which is not the one that counts, may be what
//     it is about. A claim that recorded no meter id (made before
//     migration 7) cannot be shown to be on the update's account, so no
//     such update moves it. Times are compared as ages, each on its own
//     clock: Stripe's window against Stripe's reading u.ReadAt, the
//     claim's against the store's (Claim.SentAge).
//   - Any other claim's own send is shown by the Stripe object it
//     recorded from the answer to its key (or from a search that found
//     exactly one payment for the key, once Stripe had forgotten it): an
//     update about another object is about another write, and one for a
//     claim that has recorded no object yet (a lost answer, a crashed
//     runner) may be about another write with the claim's metadata. Such
//     a claim is settled by its own send's answer, which a resume with its
//     key gets from Stripe again. An update that says the money moved (or
//     is moving) for another amount or currency than the claim's is about
//     an object another writer changed (an item added to an invoice in
//     the dashboard): it shows nothing billed for the claim's amount, and
//     the claim's own send reports it for a person.
func ownSend(c Claim, u update) (claimengine.ApplyOutcome, string) {
	if have, want := objectKind(c.Endpoint), objectKind(u.Endpoint); have != want {
		return claimengine.OtherPayment, fmt.Sprintf("the claim is of %s, the update is about %s", have, want)
	}
	if c.Endpoint == endpointMeterEvents {
		if u.MeterID == "" || u.SentFrom.IsZero() {
			return claimengine.Unproven, "the update names no meter or no time, so nothing shows it is about the claim's usage event"
		}
		if c.MeterID == "" {
			return claimengine.Unproven, "the claim records no meter id (it was made before migration 7 recorded one), so nothing shows the update is about its meter, on its Stripe account"
		}
		// Ages: how long before now the update's window began and ended,
		// on Stripe's clock, and the claim's window opened and its last
		// reopening was, on the store's.
		fromAge, toAge := u.ReadAt.Sub(u.SentFrom), u.ReadAt.Sub(u.SentTo)
		opened, reopened := c.SentAge, c.SentAge+c.FirstSentAt.Sub(c.ReconciledAt)
		switch {
		case c.MeterID != u.MeterID:
			return claimengine.OtherPayment, fmt.Sprintf("the update is about the events of meter %s, the claim's usage event went to meter %s (%s)", u.MeterID, c.MeterID, c.Meter)
		case !c.ReconciledAt.IsZero() && fromAge > reopened+clockSlack:
			return claimengine.Unproven, "the update may be about the usage event sent before the key's window was reopened, not about the resend that counts"
		case fromAge < opened-keyWindow:
			return claimengine.OtherPayment, fmt.Sprintf("the update is about events received from %v ago, and the claim's key can be sent only until %v after its window opened, %v ago",
				fromAge.Round(time.Second), keyWindow, opened.Round(time.Second))
		case toAge > opened+clockSlack:
			return claimengine.OtherPayment, fmt.Sprintf("the update is about events received until %v ago, before the claim's key was first sent, %v ago",
				toAge.Round(time.Second), opened.Round(time.Second))
		}
		return 0, ""
	}
	if c.StripeID == "" {
		return claimengine.Unproven, "the claim has recorded no " + strings.TrimPrefix(strings.TrimPrefix(objectKind(c.Endpoint), "a "), "an ") +
			" of its own yet: it is settled by its own send's answer, which a resume with its key gets again"
	}
	if c.StripeID != u.StripeID {
		return claimengine.OtherPayment, fmt.Sprintf("the claim records payment %s, the update is about %s", c.StripeID, u.StripeID)
	}
	if moves := u.State == string(StateSucceeded) || u.State == string(StateProcessing); moves && u.Currency != "" &&
		(u.Amount != c.Amount || !strings.EqualFold(u.Currency, c.Currency)) {
		return claimengine.Unproven, fmt.Sprintf("%s is for %d %s, the claim for %d %s: it was changed after it was made, so it does not show the claim's amount billed; the claim's own send reports it",
			u.StripeID, u.Amount, u.Currency, c.Amount, c.Currency)
	}
	return 0, ""
}

// change is what an update does to a claim: decide's answer.
type change struct {
	outcome    claimengine.ApplyOutcome
	reason     string
	next       Claim // the claim's fields after the update (times set by the store)
	processing bool  // the claim starts processing now
	settled    bool  // a processing claim's outcome arrives now
	// revived is set when a failed claim succeeds: it takes its period
	// back from the claim that holds it, if any (see supersede).
	revived bool
	// stopped is that claim, as supersede left it, to be written with
	// the update; its Key is "" if there is none.
	stopped Claim
}

// decide applies u to c: the one state machine of every store. The state
// only moves forward (pending, processing, then succeeded or failed), so
// the order in which events arrive does not matter; refunds only grow, and
// the dispute of the latest event (by Stripe's creation time) wins.
func decide(c Claim, u update) change {
	if outcome, why := ownSend(c, u); outcome != 0 {
		return change{outcome: outcome, next: c, reason: why}
	}
	n := c
	var ch change
	var did []string
	switch {
	case State(u.State) == "":
	case rank(State(u.State)) > rank(c.State):
		n.State, n.StripeID = State(u.State), u.StripeID
		ch.processing = State(u.State) == StateProcessing
		ch.settled = c.State == StateProcessing
		if State(u.State) == StateFailed {
			code := u.FailureCode
			if code == "" {
				code = "unknown"
			}
			n.FailureCode = code
			n.LastError = "payment " + u.StripeID + " failed: " + code
			if c.State == StateProcessing || !c.ProcessingAt.IsZero() {
				n.LastError = "payment " + u.StripeID + " failed after processing: " + code
			}
		}
		did = append(did, string(c.State)+" → "+string(u.State))
	case State(u.State) == StateFailed && c.State == StateSucceeded && (c.Endpoint == endpointMeterEvents || c.Endpoint == endpointRefunds):
		// Stripe accepts a meter event, then validates it as it
		// aggregates, and reports a rejected one later (a meter error
		// report): the usage was never counted. A refund Stripe reported
		// succeeded fails later when its customer's bank returns it: the
		// money is back in the account. Either way the claim fails.
		code := cmp.Or(u.FailureCode, "unknown")
		n.State, n.FailureCode = StateFailed, code
		n.LastError = "usage event " + u.StripeID + " rejected by Stripe after it was accepted: " + code
		did = append(did, "succeeded → failed (rejected after acceptance)")
		if c.Endpoint == endpointRefunds {
			n.LastError = "refund " + u.StripeID + " failed after it succeeded: " + code
			did[len(did)-1] = "succeeded → failed (failed after it succeeded)"
		}
	case State(u.State) == StateSucceeded && c.State == StateFailed && objectKind(c.Endpoint) == objectKind("") && !u.Created.Before(c.EventAt):
		// The claim's own payment (ownSend has shown the update is about
		// the object the claim recorded) succeeded after it failed: Stripe's
		// recovery of a decline, such as a PaymentIntent declined off
		// session that its customer completes on session. The period is
		// paid: billing it again would charge twice. A success older than
		// the latest event applied is not after the failure: it leaves the
		// claim failed, as events only move a claim forward.
		n.State, n.FailureCode = StateSucceeded, ""
		n.LastError = "payment " + u.StripeID + " succeeded after it failed (" + c.LastError + ")"
		ch.revived = true
		did = append(did, "failed → succeeded (its own payment succeeded after the failure)")
	case State(u.State) == c.State:
		ch.reason = "the claim is already " + string(c.State)
	case rank(State(u.State)) == rank(c.State):
		ch.reason = fmt.Sprintf("the claim is %s and stays so; the update says %s", c.State, State(u.State))
	default:
		ch.reason = fmt.Sprintf("the claim is %s, later than the update's %s", c.State, State(u.State))
	}
	if u.Refunded > c.Refunded {
		n.Refunded = u.Refunded
		did = append(did, fmt.Sprintf("refunded %d", u.Refunded))
	}
	if u.Dispute != "" && u.Dispute != c.Dispute && newerDispute(c, u) {
		n.Dispute, n.DisputeAt = u.Dispute, u.Created
		did = append(did, "dispute "+u.Dispute)
	}
	if did == nil {
		ch.outcome, ch.next = claimengine.Unchanged, c
		if ch.reason == "" {
			ch.reason = "nothing new"
		}
		return ch
	}
	if u.Created.After(n.EventAt) {
		n.EventAt = u.Created
	}
	ch.outcome, ch.next = claimengine.Changed, n
	ch.reason = fmt.Sprint(did)
	return ch
}

// supersede decides what ch, the revival of claim c by its own payment,
// does to other, the live claim that holds c's period now. A re-bill of c that is
// still pending (of c's scope, a later attempt, with no step done at
// Stripe) is stopped: it is returned failed, to be written in the
// transaction that revives c, so that no send check passes for its key
// again, and c takes its period back. Whether the re-bill's key reached
// Stripe before cannot be known here: the runner sending it learns it has
// lost its claim at its next send check, and a payment of it that exists
// is not recorded, which the caller reports. Anything else holding the
// period (a re-bill that paid it or is processing, a claim of another
// scope or kind) keeps it, and c stays failed: the answer is PaidTwice, for
// a person.
func supersede(ch change, c, other Claim) change {
	if other.State != StatePending || other.Scope != c.Scope || other.Attempt <= c.Attempt || other.Step != "" ||
		objectKind(other.Endpoint) != objectKind(c.Endpoint) {
		return change{outcome: claimengine.PaidTwice, next: c,
			reason: fmt.Sprintf("the claim's own payment %s succeeded after it failed, and claim %q (attempt %d, %s %s) holds the period: it may be paid twice",
				c.StripeID, other.Key, other.Attempt, other.State, other.StripeID)}
	}
	s := other
	s.State, s.FailureCode, s.Owner = StateFailed, FailureSuperseded, ""
	s.LastError = fmt.Sprintf("stopped: attempt %d's own payment %s succeeded after it failed, and pays the period; if this key reached Stripe before, its payment is not recorded: look it up by the key", c.Attempt, c.StripeID)
	ch.stopped = s
	ch.reason += "; stopped the re-bill " + other.Key
	return ch
}

// newerDispute tells whether u's dispute replaces c's: the one Stripe
// created later wins, whatever other events arrived in between. Stripe's
// times are whole seconds, so of two disputes created in the same second
// the greater id wins: the same one in every order of delivery, and again
// when either is delivered after its record was pruned.
func newerDispute(c Claim, u update) bool {
	if c.Dispute == "" {
		return true
	}
	at := c.DisputeAt
	if at.IsZero() {
		at = c.EventAt // recorded before DisputeAt was kept: as late as it can be
	}
	return u.Created.After(at) || u.Created.Equal(at) && u.Dispute > c.Dispute
}

func validateAge(d time.Duration) error {
	if d < 0 {
		return fmt.Errorf("%w: age %v must not be negative", ErrInvalid, d)
	}
	return nil
}

// Process records that key's payment stripeID is processing. See [Store].
func (p *pgEngine) Process(ctx context.Context, key, stripeID string) error {
	if err := errors.Join(validateID("key", key), validateID("stripe id", stripeID)); err != nil {
		return err
	}
	tag, err := p.db.Exec(ctx, "UPDATE "+p.names.table+` SET state = 'processing', stripe_id = $2,
		processing_at = now(), updated_at = now() WHERE key = $1 AND state = 'pending'`, key, stripeID)
	if err != nil {
		return fmt.Errorf("claim: recording %q as processing: %w", key, err)
	}
	if tag.RowsAffected() == 1 {
		return nil
	}
	c, err := p.Get(ctx, key)
	if err != nil {
		return err
	}
	return processConflict(c, stripeID)
}

// processConflict explains why Process found no pending claim: none if the
// claim already records the same payment (an event got there first).
func processConflict(c Claim, stripeID string) error {
	if c.StripeID == stripeID {
		return nil
	}
	return fmt.Errorf("%w: claim %q is %s as %q; it cannot be processing as %q", claimengine.ErrConflict, c.Key, c.State, c.StripeID, stripeID)
}

// Apply records u in one transaction: the event's id (INSERT … ON CONFLICT
// DO NOTHING: a duplicate stops here), then the claim's row, locked, moved
// forward by the one state machine of every store. See [Store].
func (p *pgEngine) Apply(ctx context.Context, u update) (applied, error) {
	if err := validateUpdate(u); err != nil {
		return applied{}, err
	}
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return applied{}, fmt.Errorf("claim: applying %s to %q: %w", u.EventID, u.Key, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if u.EventID != "" {
		tag, err := tx.Exec(ctx, "INSERT INTO "+p.names.events+` (id, type, key, stripe_id, created)
			VALUES ($1, $2, $3, $4, $5) ON CONFLICT DO NOTHING`, u.EventID, u.EventType, u.Key, u.StripeID, u.Created)
		if err != nil {
			return applied{}, fmt.Errorf("claim: recording event %s: %w", u.EventID, err)
		}
		if tag.RowsAffected() == 0 {
			tx.Rollback(ctx)
			result := "its record was pruned meanwhile"
			p.db.QueryRow(ctx, "SELECT result FROM "+p.names.events+" WHERE id = $1", u.EventID).Scan(&result)
			c, err := p.Get(ctx, u.Key)
			if err != nil && !errors.Is(err, ErrNotFound) {
				return applied{}, err
			}
			return applied{Outcome: claimengine.Duplicate, Claim: c, Before: c, Reason: "event applied before: " + result}, nil
		}
	}
	c, err := scanClaim(tx.QueryRow(ctx, p.selectSQL+" WHERE key = $1 FOR UPDATE", u.Key))
	if errors.Is(err, pgx.ErrNoRows) {
		return applied{}, fmt.Errorf("%w: %q", ErrNotFound, u.Key)
	}
	if err != nil {
		return applied{}, fmt.Errorf("claim: reading %q: %w", u.Key, err)
	}
	ch := decide(c, u)
	if ch.revived {
		// The claim takes its period back: lock the claim that holds it.
		// One made meanwhile (after this statement's snapshot) makes the
		// update below break the unique index of live claims, and the
		// store's caller (a webhook) tries again.
		other, err := scanClaim(tx.QueryRow(ctx, p.selectSQL+" WHERE customer = $1 AND period = $2 AND key <> $3 AND state <> 'failed' FOR UPDATE",
			c.Customer, c.Period, c.Key))
		switch {
		case errors.Is(err, pgx.ErrNoRows):
		case err != nil:
			return applied{}, fmt.Errorf("claim: reading the claim that holds the period of %q: %w", u.Key, err)
		default:
			ch = supersede(ch, c, other)
		}
	}
	return p.finishApply(ctx, tx, u, c, ch)
}

// finishApply writes ch to the claim and the event's result, and commits.
func (p *pgEngine) finishApply(ctx context.Context, tx pgx.Tx, u update, c Claim, ch change) (applied, error) {
	out := applied{Outcome: ch.outcome, Claim: c, Before: c, Reason: ch.reason}
	if s := ch.stopped; s.Key != "" {
		row := tx.QueryRow(ctx, "UPDATE "+p.names.table+` t SET state = $2, failure_code = $3, last_error = $4, owner = '', lease_until = now(), updated_at = now()
			WHERE key = $1 RETURNING `+colsOf("t"), s.Key, string(s.State), s.FailureCode, s.LastError)
		var err error
		if out.Superseded, err = scanClaim(row); err != nil {
			return applied{}, fmt.Errorf("claim: stopping %q, whose period %q takes back: %w", s.Key, u.Key, err)
		}
	}
	if ch.outcome == claimengine.Changed {
		n := ch.next
		row := tx.QueryRow(ctx, "UPDATE "+p.names.table+` t SET state = $2, stripe_id = $3, failure_code = $4, last_error = $5,
			refunded = $6, dispute = $7, event_at = $8, dispute_at = $11, updated_at = now(),
			processing_at = CASE WHEN $9 THEN coalesce(processing_at, now()) ELSE processing_at END,
			settled_at = CASE WHEN $10 THEN now() ELSE settled_at END
			WHERE key = $1 RETURNING `+colsOf("t"),
			u.Key, string(n.State), n.StripeID, n.FailureCode, n.LastError, n.Refunded, n.Dispute, n.EventAt,
			ch.processing, ch.settled, nullTime(n.DisputeAt))
		var err error
		if out.Claim, err = scanClaim(row); err != nil {
			return applied{}, fmt.Errorf("claim: applying %s to %q: %w", u.EventType, u.Key, err)
		}
	}
	if u.EventID != "" {
		if _, err := tx.Exec(ctx, "UPDATE "+p.names.events+" SET result = $2 WHERE id = $1", u.EventID, out.Outcome.String()+": "+out.Reason); err != nil {
			return applied{}, fmt.Errorf("claim: recording event %s: %w", u.EventID, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return applied{}, fmt.Errorf("claim: applying %s to %q: %w", u.EventType, u.Key, err)
	}
	return out, nil
}

// Unsettled lists processing claims older than olderThan. See [Store].
func (p *pgEngine) Unsettled(ctx context.Context, scope string, olderThan time.Duration) ([]Claim, error) {
	if err := validateAge(olderThan); err != nil {
		return nil, err
	}
	return p.list(ctx, ` WHERE state = 'processing' AND processing_at <= now() - $2 * interval '1 microsecond'
		AND ($1 = '' OR scope IN ($1, '')) ORDER BY processing_at, key`, scope, olderThan.Microseconds())
}

// Process records that key's payment stripeID is processing. See [Store].
func (m *memEngine) Process(ctx context.Context, key, stripeID string) error {
	if err := errors.Join(validateID("key", key), validateID("stripe id", stripeID)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if c.State != StatePending {
			return processConflict(*c, stripeID)
		}
		c.State, c.StripeID, c.ProcessingAt = StateProcessing, stripeID, now
		return nil
	})
}

// Apply records u exactly once and never backwards. See [Store].
func (m *memEngine) Apply(ctx context.Context, u update) (applied, error) {
	if err := validateUpdate(u); err != nil {
		return applied{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	c, ok := m.byKey[u.Key]
	if rec, seen := m.events[u.EventID]; u.EventID != "" && seen {
		var snap Claim
		if ok {
			snap = m.snapshot(c, now)
		}
		return applied{Outcome: claimengine.Duplicate, Claim: snap, Before: snap, Reason: "event applied before: " + rec.result}, nil
	}
	if !ok {
		return applied{}, fmt.Errorf("%w: %q", ErrNotFound, u.Key)
	}
	ch := decide(m.snapshot(c, now), u)
	period := [2]string{c.Customer, c.Period}
	var other *Claim
	if k, held := m.live[period]; ch.revived && held && k != c.Key {
		other = m.byKey[k]
		ch = supersede(ch, *c, m.snapshot(other, now))
	}
	out := applied{Outcome: ch.outcome, Before: m.snapshot(c, now), Reason: ch.reason}
	if s := ch.stopped; s.Key != "" {
		other.State, other.FailureCode, other.LastError, other.Owner = s.State, s.FailureCode, s.LastError, ""
		other.LeaseUntil, other.UpdatedAt = now, now
		out.Superseded = m.snapshot(other, now)
	}
	if ch.revived && ch.outcome == claimengine.Changed {
		m.live[period] = c.Key
	}
	if ch.outcome == claimengine.Changed {
		n := ch.next
		if ch.processing && n.ProcessingAt.IsZero() {
			n.ProcessingAt = now
		}
		if ch.settled {
			n.SettledAt = now
		}
		n.UpdatedAt = now
		if n.State == StateFailed && c.State != StateFailed {
			delete(m.live, [2]string{c.Customer, c.Period})
		}
		*c = n
	}
	if u.EventID != "" {
		if m.events == nil {
			m.events = make(map[string]memEvent)
		}
		m.events[u.EventID] = memEvent{result: out.Outcome.String() + ": " + out.Reason, received: now}
	}
	out.Claim = m.snapshot(c, now)
	return out, nil
}

// Unsettled lists processing claims older than olderThan. See [Store].
func (m *memEngine) Unsettled(ctx context.Context, scope string, olderThan time.Duration) ([]Claim, error) {
	if err := validateAge(olderThan); err != nil {
		return nil, err
	}
	return m.listState(StateProcessing, func(c *Claim, now time.Time) bool {
		return now.Sub(c.ProcessingAt) >= olderThan && (scope == "" || c.Scope == scope || c.Scope == "")
	}, func(c Claim) time.Time { return c.ProcessingAt }), nil
}

// pruneBatch is how many event records one statement of PruneEvents
// deletes: a few milliseconds of work, so that an Apply recording an event
// again never waits long for the rows it conflicts with.
const pruneBatch = 1000

// PruneEvents deletes the records of events applied more than olderThan
// ago, a batch at a time. See [Store].
func (p *Postgres) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := validateAge(olderThan); err != nil {
		return 0, err
	}
	// SKIP LOCKED: two pruners at once (Reconcile of two scopes) take
	// different rows instead of waiting for each other.
	sql := "WITH doomed AS (SELECT id FROM " + p.names.events + ` WHERE received_at <= now() - $1::bigint * interval '1 microsecond'
		ORDER BY received_at LIMIT $2 FOR UPDATE SKIP LOCKED)
		DELETE FROM ` + p.names.events + " e USING doomed WHERE e.id = doomed.id"
	total := 0
	for {
		if err := ctx.Err(); err != nil {
			return total, err
		}
		tag, err := p.db.Exec(ctx, sql, olderThan.Microseconds(), pruneBatch)
		if err != nil {
			return total, fmt.Errorf("claim: pruning event records older than %v (%d deleted so far): %w", olderThan, total, err)
		}
		total += int(tag.RowsAffected())
		if tag.RowsAffected() < pruneBatch {
			return total, nil
		}
	}
}

// PruneEvents deletes the records of events applied more than olderThan
// ago. See [Store].
func (m *memEngine) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	if err := validateAge(olderThan); err != nil {
		return 0, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cutoff := time.Now().Add(-olderThan)
	n := 0
	for id, rec := range m.events {
		if !rec.received.After(cutoff) {
			delete(m.events, id)
			n++
		}
	}
	return n, nil
}

// nullTime is t, or NULL for the zero time.
func nullTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
