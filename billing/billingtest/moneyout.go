package billingtest

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Movement is one refund, credit note, transfer or payout the server
// created: money given back to a customer or moved out of a balance. The
// ledger keeps every one, failed and canceled ones included.
type Movement struct {
	ID      string `json:"id"`
	Object  string `json:"object"`            // "refund", "credit_note", "transfer", "transfer_reversal" or "payout"
	Account string `json:"account,omitempty"` // the connected account it lives on; "" for the platform
	// Customer is the customer of what a refund or credit note is about.
	Customer string `json:"customer,omitempty"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	// Status is a refund's pending, succeeded, failed or canceled, a
	// credit note's issued, a payout's pending, in_transit, paid, failed or
	// canceled; a transfer has none, as at Stripe.
	Status string `json:"status,omitempty"`
	// Of is what a refund refunds (a charge or a payment intent, or the
	// invoice of a credit note), the invoice a credit note credits and
	// the transfer a reversal reverses.
	Of string `json:"of,omitempty"`
	// Destination is the connected account a transfer pays, or a
	// reversal takes back from.
	Destination   string `json:"destination,omitempty"`
	TransferGroup string `json:"transfer_group,omitempty"`
	Reason        string `json:"reason,omitempty"`
	// RefundAmount, CreditAmount and OutOfBandAmount say where a paid
	// invoice's credit note sends its total; Refund is the refund it made.
	RefundAmount    int64  `json:"refund_amount,omitempty"`
	CreditAmount    int64  `json:"credit_amount,omitempty"`
	OutOfBandAmount int64  `json:"out_of_band_amount,omitempty"`
	Refund          string `json:"refund,omitempty"`
	// FailureCode is why a refund or payout failed: its failure_reason or
	// failure_code.
	FailureCode    string            `json:"failure_code,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	Period         string            `json:"period,omitempty"` // Metadata[Config.PeriodKey]
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Created        time.Time         `json:"created"` // on the server's clock
}

// move is a Movement with what only the server needs.
type move struct {
	Movement
	settleAt time.Time // when a pending refund or payout moves on; zero when nothing is due
	failWith string    // the failure code it settles with; "" to succeed
	detail   map[string]any
}

// moveState holds the movements. Guarded by Server.mu.
type moveState struct {
	list []*move
	byID map[string]*move
}

// moveKinds are the movements' endpoints: POST to create one, GET to
// list them, GET /{id} for one. A transfer's reversals are under its own
// path.
var moveKinds = []struct{ path, object, prefix string }{
	{"/v1/refunds", "refund", "re"},
	{"/v1/credit_notes", "credit_note", "cn"},
	{"/v1/transfers", "transfer", "tr"},
	{"/v1/payouts", "payout", "po"},
	{"", "transfer_reversal", "trr"},
}

// Movements returns a copy of every movement of object ("refund",
// "credit_note", "transfer", "transfer_reversal" or "payout"; "" for
// all) in creation order.
// Counting them, for the payment, invoice, destination or metadata a test
// is about, is the exactly-once oracle of money going out.
func (s *Server) Movements(object string) []Movement {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	var out []Movement
	for _, m := range s.moves.list {
		if object == "" || m.Object == object {
			c := m.Movement
			c.Metadata = maps.Clone(c.Metadata)
			out = append(out, c)
		}
	}
	return out
}

// newMove stores a movement of object on acct, with its id; mu is held.
func (s *Server) newMove(object, acct, key string, md map[string]string, now time.Time) *move {
	prefix := ""
	for _, k := range moveKinds {
		if k.object == object {
			prefix = k.prefix
		}
	}
	s.objSeq++
	m := &move{Movement: Movement{ID: fmt.Sprintf("%s_%014d", prefix, s.objSeq), Object: object, Account: acct,
		Metadata: md, Period: md[s.periodKey], IdempotencyKey: key, Created: now}}
	s.moves.list = append(s.moves.list, m)
	s.moves.byID[m.ID] = m
	s.stats.Created++
	return m
}

// Settle moves a pending refund or payout on now, as its bank would:
// a refund to "succeeded", "failed" or "canceled" (failed and canceled
// give its amount back to the payment and the balance), or "failed" once
// succeeded (its customer's bank returned it); a payout to
// "in_transit" or "paid", or "failed" (even once paid: a bank may return
// a payout days later) or "canceled" (while pending), its amount back in
// the balance. failureCode is a failure's code (Stripe's failure_reason
// of a refund, failure_code of a payout); empty, it defaults to
// "unknown" for a refund and "could_not_process" for a payout. Each
// change emits its event. Any other change is an error that says why.
func (s *Server) Settle(id, status, failureCode string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	m := s.moves.byID[id]
	if m == nil || (m.Object != "refund" && m.Object != "payout") {
		return fmt.Errorf("billingtest: Settle(%q): no refund or payout with this id", id)
	}
	if err := s.settleMove(m, status, failureCode, s.now()); err != nil {
		return fmt.Errorf("billingtest: Settle(%q, %q): %w", id, status, err)
	}
	return nil
}

// settleMove moves m to status; mu is held.
func (s *Server) settleMove(m *move, status, code string, now time.Time) error {
	if m.Object == "refund" {
		return s.settleRefund(m, status, code, now)
	}
	return s.settlePayout(m, status, code, now)
}

// settleMoves moves on the movements whose time has come; mu is held.
func (s *Server) settleMoves(now time.Time) int {
	n := 0
	for _, m := range s.moves.list {
		for !m.settleAt.IsZero() && !now.Before(m.settleAt) {
			at := m.settleAt
			m.settleAt = time.Time{}
			if err := s.settleMove(m, m.next(), m.failWith, at); err != nil {
				panic("billingtest: " + err.Error()) // the schedule only makes allowed steps
			}
			n++
		}
	}
	return n
}

// next is the status a scheduled movement moves to when its time comes.
func (m *move) next() string {
	switch {
	case m.Object == "payout" && m.Status == "pending":
		return "in_transit"
	case m.failWith != "":
		return "failed"
	case m.Object == "payout":
		return "paid"
	}
	return "succeeded"
}

// moveResult is the answer to a request that made or read m.
func (s *Server) moveResult(m *move) result {
	res := ok(s.renderMove(m))
	res.objectID = m.ID
	return res
}

func (s *Server) renderMove(m *move) map[string]any {
	switch m.Object {
	case "refund":
		return renderRefund(m)
	case "credit_note":
		return s.renderCreditNote(m)
	case "transfer":
		return s.renderTransfer(m)
	case "transfer_reversal":
		return renderReversal(m)
	}
	return renderPayout(m)
}

// emitMove records an event about m as it is now; mu is held.
func (s *Server) emitMove(typ string, m *move, at time.Time) {
	s.emitObject(m.Account, typ, m.ID, s.renderMove(m), at)
}

// listFilters are the filters each movement's list takes, beyond
// created, limit and starting_after.
var listFilters = map[string][]string{
	"refund":      {"charge", "payment_intent"},
	"credit_note": {"invoice", "customer"},
	"transfer":    {"destination", "transfer_group"},
	"payout":      {"status"},
}

// readMoves serves GET of the movement of object id, or, with no id,
// the list of object's (for transfer reversals, id is the transfer whose
// reversals are listed): newest first, current at once, as Stripe's lists
// are.
func (s *Server) readMoves(acct, object, id string, form url.Values) result {
	transfer := ""
	if object == "transfer_reversal" {
		transfer, id = id, "" // the transfer whose reversals are listed
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	if id != "" {
		if m := s.moves.byID[id]; m != nil && m.Object == object && m.Account == acct {
			return s.moveResult(m)
		}
		return missing("id", strings.ReplaceAll(object, "_", " "), id)
	}
	limit, created, bad := listParams(form, listFilters[object]...)
	if bad != nil {
		return errResult(http.StatusBadRequest, *bad)
	}
	match := func(m *move) bool { return true }
	switch object {
	case "refund":
		for _, f := range []string{"charge", "payment_intent"} {
			if v := form.Get(f); v != "" {
				if s.payment(acct, v, f) == nil {
					return missing(f, f, v)
				}
				match = func(m *move) bool { return m.Of == v }
			}
		}
	case "credit_note":
		inv, cust := form.Get("invoice"), form.Get("customer")
		if inv != "" && s.invoice(acct, inv) == nil {
			return missing("invoice", "invoice", inv)
		}
		if bad := s.customerHere(acct, cust); bad != nil {
			return errResult(http.StatusNotFound, *bad)
		}
		match = func(m *move) bool { return (inv == "" || m.Of == inv) && (cust == "" || m.Customer == cust) }
	case "transfer":
		dest, group := form.Get("destination"), form.Get("transfer_group")
		match = func(m *move) bool {
			return (dest == "" || m.Destination == dest) && (group == "" || m.TransferGroup == group)
		}
	case "payout":
		st := form.Get("status")
		match = func(m *move) bool { return st == "" || m.Status == st }
	case "transfer_reversal":
		tr := s.moves.byID[transfer]
		if tr == nil || tr.Object != "transfer" || tr.Account != acct {
			return missing("id", "transfer", transfer)
		}
		match = func(m *move) bool { return m.Of == transfer }
	}
	var items []listItem
	for i := len(s.moves.list) - 1; i >= 0; i-- {
		m := s.moves.list[i]
		if m.Object == object && m.Account == acct && created(m.Created) && match(m) {
			items = append(items, listItem{m.ID, s.renderMove(m)})
		}
	}
	path := movePath(object)
	if transfer != "" {
		path = "/v1/transfers/" + transfer + "/reversals"
	}
	return listResult(path, items, limit, form.Get("starting_after"))
}

// moveObject is the movement whose endpoints path is under, or "".
func moveObject(path string) string {
	for _, k := range moveKinds {
		if k.path != "" && (path == k.path || strings.HasPrefix(path, k.path+"/")) {
			return k.object
		}
	}
	return ""
}

func movePath(object string) string {
	for _, k := range moveKinds {
		if k.object == object {
			return k.path
		}
	}
	return ""
}
