package billingtest

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

var refundParams = map[string]bool{
	"charge": true, "payment_intent": true, "amount": true, "reason": true,
	"instructions_email": true, "refund_application_fee": true, "reverse_transfer": true,
}

// createRefund validates POST /v1/refunds and returns how to run it. key
// is the request's idempotency key, "" for none.
func (s *Server) createRefund(acct string, form url.Values, key string) (*apiErr, func(time.Time) (result, bool)) {
	for _, k := range []string{"customer", "currency", "origin"} {
		if form.Has(k) {
			return invalid(k, "parameter_unknown", "This fake refunds a charge or a payment intent; refunds of a customer balance ("+k+") are not modelled."), nil
		}
	}
	md, bad := parseMetadata(form, func(k string) bool { return refundParams[k] })
	if bad != nil {
		return bad, nil
	}
	object, id := "charge", form.Get("charge")
	switch pi := form.Get("payment_intent"); {
	case id != "" && pi != "":
		return invalid("payment_intent", "", "Pass charge or payment_intent, not both."), nil
	case pi != "":
		object, id = "payment_intent", pi
	case id == "":
		return invalid("charge", "parameter_missing", "Must provide either charge or payment_intent."), nil
	}
	amount, bad := parseAmount(form, "amount", 1, false)
	if bad != nil {
		return bad, nil
	}
	reason, bad := oneOf(form, "reason", "duplicate", "fraudulent", "requested_by_customer")
	if bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		p := s.payment(acct, id, object)
		if p == nil {
			return missing(object, object, id), false
		}
		m, bad := s.refund(p, amount, reason, md, key, now)
		if bad != nil {
			return errResult(http.StatusBadRequest, *bad), false
		}
		return s.moveResult(m), true
	}
}

// refund refunds amount of p (what is left when 0): every refund of a
// payment, by the API or by [Server.Refund], is made here. A refund is
// succeeded at once, or pending when p's customer settles later (see
// [Async]); either way its amount counts as refunded on p, and leaves p's
// account's balance, until it fails. It emits charge.refunded, as Stripe
// does for API 2024-06-20. mu is held.
func (s *Server) refund(p *Payment, amount int64, reason string, md map[string]string, key string, now time.Time) (*move, *apiErr) {
	param := p.Object
	if !p.Paid {
		return nil, invalid(param, "", fmt.Sprintf("%s %s is %s: only a succeeded payment can be refunded.", p.Object, p.ID, p.Status))
	}
	left := p.Amount - p.AmountRefunded
	if left == 0 {
		return nil, invalid(param, "charge_already_refunded", fmt.Sprintf("Charge %s has already been refunded.", p.ID))
	}
	if amount == 0 {
		amount = left
	}
	if amount > left {
		return nil, invalid("amount", "amount_too_large", fmt.Sprintf(
			"Refund amount (%d %s) is greater than unrefunded amount on %s (%d %s).", amount, p.Currency, p.ID, left, p.Currency))
	}
	m := s.newMove("refund", p.Account, key, md, now)
	m.Customer, m.Of, m.Amount, m.Currency, m.Reason, m.Status = p.Customer, p.ID, amount, p.Currency, reason, "succeeded"
	if a, later := s.async[p.Customer]; later {
		m.Status, m.settleAt, m.failWith = "pending", now.Add(a.After), a.FailureCode
	}
	p.AmountRefunded += amount
	s.emit("charge.refunded", p, now)
	return m, nil
}

// settleRefund moves a pending refund to status and emits
// charge.refund.updated, the refund's event for API 2024-06-20 (Stripe
// sent refund.updated and refund.failed for refunds of a charge only from
// 2024-10-28). A failed or canceled refund gives its amount back. mu is
// held.
func (s *Server) settleRefund(m *move, status, code string, now time.Time) error {
	if m.Status != "pending" {
		return fmt.Errorf("the refund is %s; only a pending refund settles", m.Status)
	}
	switch status {
	case "succeeded":
	case "failed", "canceled":
		if status == "failed" {
			m.FailureCode = orDefault(code, "unknown")
		}
		if p := s.byID[m.Of]; p != nil {
			p.AmountRefunded -= m.Amount
		}
	default:
		return fmt.Errorf("a refund settles succeeded, failed or canceled, not %q", status)
	}
	m.Status, m.settleAt = status, time.Time{}
	s.emitMove("charge.refund.updated", m, now)
	return nil
}

func renderRefund(m *move) map[string]any {
	var charge, intent any
	switch {
	case strings.HasPrefix(m.Of, "ch_"):
		charge = m.Of
	case strings.HasPrefix(m.Of, "pi_"):
		intent = m.Of
	}
	r := map[string]any{"id": m.ID, "object": "refund", "amount": m.Amount, "balance_transaction": nil, "charge": charge,
		"created": m.Created.Unix(), "currency": m.Currency, "metadata": orEmpty(m.Metadata), "payment_intent": intent,
		"reason": strOrNil(m.Reason), "receipt_number": nil, "source_transfer_reversal": nil, "status": m.Status,
		"transfer_reversal": nil}
	if m.Status == "failed" {
		r["failure_reason"] = m.FailureCode
	}
	return r
}

// Refund refunds amount of a succeeded charge or payment intent (all that
// is left when amount is 0), as a person does in the Dashboard: the same
// refund as POST /v1/refunds makes, with no idempotency key. The ledger
// keeps counting the payment: it was made.
func (s *Server) Refund(id string, amount int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.byID[id]
	if p == nil || !p.Paid {
		return fmt.Errorf("billingtest: Refund(%q): no succeeded payment with this id", id)
	}
	if amount < 0 {
		return fmt.Errorf("billingtest: Refund(%q, %d): the amount is negative", id, amount)
	}
	if _, bad := s.refund(p, amount, "", nil, "", s.now()); bad != nil {
		return fmt.Errorf("billingtest: Refund(%q, %d): %s", id, amount, bad.Message)
	}
	return nil
}
