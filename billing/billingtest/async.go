package billingtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"time"
)

// APIVersion is the api_version the fake's events carry.
const APIVersion = "2024-06-20"

// Async makes a customer's payments settle later, as bank debits (ACH,
// SEPA, BACS) do: a charge is created "pending" and a confirmed payment
// intent "processing", neither counted in the ledger yet; once After has
// passed on the server's clock the payment succeeds (and is counted) or,
// when FailureCode is set, fails with that code (and never is). Refunds
// of the customer's payments settle the same way: pending, then succeeded
// or failed with FailureCode as their failure_reason.
type Async struct {
	After       time.Duration
	FailureCode string // "" to succeed; Stripe's codes: "insufficient_funds", "account_closed", …
}

// Event is one event the server emitted, as Stripe would deliver it.
type Event struct {
	ID       string    `json:"id"`
	Type     string    `json:"type"`
	ObjectID string    `json:"object_id"`
	Account  string    `json:"account,omitempty"` // the connected account it happened on; "" for the platform
	Created  time.Time `json:"created"`           // on the server's clock
	// Body is the event as Stripe sends it to a webhook endpoint.
	Body []byte `json:"-"`
}

// SettleLater makes customer's later payments and refunds settle
// asynchronously (see [Async]), and so a PaymentIntent of theirs confirmed
// again on session: it is processing until it settles. Payments and
// refunds already created are unaffected otherwise.
func (s *Server) SettleLater(customer string, a Async) {
	if a.After < 0 {
		panic(fmt.Sprintf("billingtest: SettleLater(%q): After %v is negative", customer, a.After))
	}
	s.mu.Lock()
	s.async[customer] = a
	s.mu.Unlock()
}

// SettleNow settles every payment whose time has come on the server's
// clock, and moves on every pending refund and payout that is due;
// Advance and every read do it too. It returns how many settled or moved.
func (s *Server) SettleNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.settleDue()
}

// settleDue settles the due payments, oldest first, then moves on the
// refunds and payouts whose time has come; mu is held.
func (s *Server) settleDue() int {
	now := s.now()
	n := 0
	for _, p := range s.payments {
		if p.settleAt.IsZero() || now.Before(p.settleAt) {
			continue
		}
		p.settleAt = time.Time{}
		n++
		if p.FailureCode != "" {
			if p.Object == "payment_intent" {
				p.Status = "requires_payment_method"
				s.emit("payment_intent.payment_failed", p, now)
			} else {
				p.Status = "failed"
				s.emit("charge.failed", p, now)
			}
			continue
		}
		p.Status, p.Paid = "succeeded", true
		s.count(p)
		if p.Object == "payment_intent" {
			s.emit("payment_intent.succeeded", p, now)
		} else {
			s.emit("charge.succeeded", p, now)
		}
	}
	return n + s.settleMoves(now)
}

// count enters a payment that moved money in the ledger, and in its
// account's balance; mu is held.
func (s *Server) count(p *Payment) {
	s.addBalance(p.Account, p.Currency, p.Amount)
	s.stats.Paid++
	s.perCust[p.Customer]++
	if p.Period != "" {
		s.perPer[[2]string{p.Customer, p.Period}]++
	}
}

// created emits the events of a payment just created; mu is held.
func (s *Server) created(p *Payment) {
	switch {
	case p.Object == "payment_intent" && p.Status == "processing":
		s.emit("payment_intent.processing", p, p.Created)
	case p.Object == "payment_intent" && p.Status == "succeeded":
		s.emit("payment_intent.succeeded", p, p.Created)
	case p.Object == "payment_intent" && p.DeclineCode != "":
		s.emit("payment_intent.payment_failed", p, p.Created)
	case p.Object == "charge" && p.Status == "pending":
		s.emit("charge.pending", p, p.Created)
	case p.Object == "charge" && p.Status == "succeeded":
		s.emit("charge.succeeded", p, p.Created)
	case p.Object == "charge" && p.Status == "failed":
		s.emit("charge.failed", p, p.Created)
	}
}

// ConfirmIntent confirms a payment intent again, on-session, as its
// customer does on Stripe's hosted page after an off-session confirmation
// was declined (authentication_required: the customer completes 3-D
// Secure; or a new card): a payment intent that requires a payment method
// or a confirmation succeeds, is counted in the ledger, and emits
// payment_intent.succeeded. Its idempotency key's stored answer (the
// decline) is unchanged, as at Stripe. Any other payment is an error.
func (s *Server) ConfirmIntent(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[id]
	switch {
	case p == nil || p.Object != "payment_intent":
		return fmt.Errorf("billingtest: ConfirmIntent(%q): no payment intent with this id", id)
	case p.Status != "requires_payment_method" && p.Status != "requires_confirmation":
		return fmt.Errorf("billingtest: ConfirmIntent(%q): the payment intent is %s; only one that requires a payment method or a confirmation can be confirmed", id, p.Status)
	}
	p.Status, p.Paid, p.DeclineCode, p.FailureCode, p.settleAt = "succeeded", true, "", "", time.Time{}
	s.count(p)
	s.emit("payment_intent.succeeded", p, s.now())
	return nil
}

// UpdateIntentAmount changes the amount of a payment intent that requires
// a payment method or a confirmation, as the dashboard or other code
// holding the key does (POST /v1/payment_intents/:id with amount): after
// an off-session decline, a person may lower or raise what its customer
// then pays on session. Its idempotency key's stored answer is unchanged,
// as at Stripe. Any other payment is an error.
func (s *Server) UpdateIntentAmount(id string, amount int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[id]
	switch {
	case p == nil || p.Object != "payment_intent":
		return fmt.Errorf("billingtest: UpdateIntentAmount(%q): no payment intent with this id", id)
	case p.Status != "requires_payment_method" && p.Status != "requires_confirmation":
		return fmt.Errorf("billingtest: UpdateIntentAmount(%q): the payment intent is %s; only one that requires a payment method or a confirmation can change its amount", id, p.Status)
	case amount <= 0:
		return fmt.Errorf("billingtest: UpdateIntentAmount(%q): amount %d must be positive", id, amount)
	}
	p.Amount = amount
	return nil
}

// CaptureIntentPartly completes a payment intent that requires a payment
// method or a confirmation as other code holding the key may: it sets
// capture_method manual, its customer confirms it on session, and it
// captures only received of its amount (amount_to_capture). The payment
// intent succeeds with amount_received received, is counted in the
// ledger, and emits payment_intent.succeeded. Any other payment is an
// error.
func (s *Server) CaptureIntentPartly(id string, received int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[id]
	switch {
	case p == nil || p.Object != "payment_intent":
		return fmt.Errorf("billingtest: CaptureIntentPartly(%q): no payment intent with this id", id)
	case p.Status != "requires_payment_method" && p.Status != "requires_confirmation":
		return fmt.Errorf("billingtest: CaptureIntentPartly(%q): the payment intent is %s; only one that requires a payment method or a confirmation can be completed", id, p.Status)
	case received <= 0 || received > p.Amount:
		return fmt.Errorf("billingtest: CaptureIntentPartly(%q): received %d must be positive and at most the amount %d", id, received, p.Amount)
	}
	p.Status, p.Paid, p.DeclineCode, p.FailureCode, p.settleAt, p.received = "succeeded", true, "", "", time.Time{}, received
	s.count(p)
	s.emit("payment_intent.succeeded", p, s.now())
	return nil
}

// Dispute opens a dispute on a succeeded payment and emits
// charge.dispute.created; from then on a refund of the payment is refused
// with 400 charge_disputed, as Stripe refuses to refund a charge that was
// charged back. It returns the dispute's id.
func (s *Server) Dispute(id, reason string) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[id]
	if p == nil || !p.Paid {
		return "", fmt.Errorf("billingtest: Dispute(%q): no succeeded payment with this id", id)
	}
	p.disputed = true
	s.objSeq++
	dp := fmt.Sprintf("dp_%014d", s.objSeq)
	d := map[string]any{"id": dp, "object": "dispute", "amount": p.Amount, "currency": p.Currency,
		"reason": reason, "status": "needs_response", "created": s.now().Unix(), "metadata": map[string]string{},
		"charge": nil, "payment_intent": nil}
	if p.Object == "payment_intent" {
		d["payment_intent"] = p.ID
	} else {
		d["charge"] = p.ID
	}
	s.emitObject(p.Account, "charge.dispute.created", p.ID, d, s.now())
	return dp, nil
}

// emit records an event about p as it is now; mu is held.
func (s *Server) emit(typ string, p *Payment, at time.Time) {
	obj := render(p)
	if typ == "charge.refunded" && p.Object == "payment_intent" {
		// A payment intent is refunded through its charge, which the fake
		// does not model apart: the event carries a charge naming it.
		obj = map[string]any{"id": "ch_of_" + p.ID, "object": "charge", "amount": p.Amount, "amount_refunded": p.AmountRefunded,
			"refunded": p.AmountRefunded == p.Amount, "status": "succeeded", "payment_intent": p.ID, "metadata": map[string]string{},
			"currency": p.Currency, "created": p.Created.Unix(), "paid": true}
	}
	s.emitObject(p.Account, typ, p.ID, obj, at)
}

// emitObject records an event about obj, which lives on acct; an event
// of a connected account names it in its account field, as Stripe's
// Connect events do. mu is held.
func (s *Server) emitObject(acct, typ, objectID string, obj any, at time.Time) {
	s.evSeq++
	id := fmt.Sprintf("evt_%014d", s.evSeq)
	ev := map[string]any{
		"id": id, "object": "event", "api_version": APIVersion, "created": at.Unix(), "type": typ,
		"livemode": false, "pending_webhooks": 1, "data": map[string]any{"object": obj},
		"request": map[string]any{"id": nil, "idempotency_key": nil},
	}
	if acct != "" {
		ev["account"] = acct
	}
	body, err := json.Marshal(ev)
	if err != nil {
		panic(err)
	}
	s.events = append(s.events, Event{ID: id, Type: typ, ObjectID: objectID, Account: acct, Created: at, Body: body})
}

// eventRetention is how long GET /v1/events lists an event, as Stripe's
// does: 30 days.
const eventRetention = 30 * 24 * time.Hour

// listEvents serves GET /v1/events: the account's events of the last 30
// days on the server's clock, newest first, filtered by type (exact) and
// created[…].
func (s *Server) listEvents(acct string, form url.Values) result {
	limit, created, bad := listParams(form, "type")
	if bad != nil {
		return errResult(http.StatusBadRequest, *bad)
	}
	typ := form.Get("type")
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	var items []listItem
	for i := len(s.events) - 1; i >= 0; i-- {
		ev := s.events[i]
		if ev.Account != acct || typ != "" && ev.Type != typ || !created(ev.Created) || now.Sub(ev.Created) > eventRetention {
			continue
		}
		items = append(items, listItem{ev.ID, json.RawMessage(ev.Body)})
	}
	return listResult("/v1/events", items, limit, form.Get("starting_after"))
}

// Events returns the events emitted so far, in order, after settling the
// payments that are due and processing the meter events that are due.
func (s *Server) Events() []Event {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	s.processMeterEvents(false)
	return append([]Event(nil), s.events...)
}

// Final returns, for every payment, its final status as the server knows
// it now: "succeeded", "failed", "processing" (payment intents) or
// "pending" (charges), after settling what is due. Keys are payment ids.
func (s *Server) Final() map[string]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	out := make(map[string]string, len(s.payments))
	for _, p := range s.payments {
		out[p.ID] = p.Status
	}
	return out
}

// NextSettlement returns when the next asynchronous payment settles, or
// the next pending refund or payout moves on, on the server's clock, and
// false if none is waiting.
func (s *Server) NextSettlement() (time.Time, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var at []time.Time
	for _, p := range s.payments {
		if !p.settleAt.IsZero() {
			at = append(at, p.settleAt)
		}
	}
	for _, m := range s.moves.list {
		if !m.settleAt.IsZero() {
			at = append(at, m.settleAt)
		}
	}
	if len(at) == 0 {
		return time.Time{}, false
	}
	sort.Slice(at, func(i, j int) bool { return at[i].Before(at[j]) })
	return at[0], true
}
