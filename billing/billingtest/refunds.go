package billingtest

import (
	"fmt"
	"net/http"
	"net/url"
	"sort"
	"strconv"
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
	if p.disputed {
		return nil, invalid(param, "charge_disputed", fmt.Sprintf("Charge %s has been charged back; cannot issue a refund.", p.ID))
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
	s.addBalance(p.Account, p.Currency, -amount)
	s.emit("charge.refunded", p, now)
	return m, nil
}

// settleRefund moves a pending refund to status, or a succeeded one to
// failed (Stripe reports a refund succeeded and, rarely, failed later: the
// customer's bank returned it), and emits charge.refund.updated, the
// refund's event for API 2024-06-20 (Stripe sent refund.updated and
// refund.failed for refunds of a charge only from 2024-10-28). A failed or
// canceled refund gives its amount back. mu is held.
func (s *Server) settleRefund(m *move, status, code string, now time.Time) error {
	if m.Status != "pending" && (m.Status != "succeeded" || status != "failed") {
		return fmt.Errorf("the refund is %s; only a pending refund settles, and a succeeded one only fails", m.Status)
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
		s.addBalance(m.Account, m.Currency, m.Amount)
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

var creditNoteParams = map[string]bool{
	"invoice": true, "amount": true, "refund_amount": true, "credit_amount": true, "out_of_band_amount": true,
	"memo": true, "reason": true, "email_type": true,
}

// creditLine is one line of a credit note being made.
type creditLine struct {
	typ, invoiceLine, description string
	amount                        int64 // 0 for the whole invoice line
	quantity, unitAmount          int64
}

// parseCreditLines reads lines[N][...], in the order of N.
func parseCreditLines(form url.Values) ([]creditLine, *apiErr) {
	fields := map[int]map[string]string{}
	for k := range form {
		rest, ok := strings.CutPrefix(k, "lines[")
		if !ok {
			continue
		}
		n, field, ok := strings.Cut(rest, "][")
		i, err := strconv.Atoi(n)
		if !ok || err != nil || i < 0 || !strings.HasSuffix(field, "]") {
			return nil, invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
		if fields[i] == nil {
			fields[i] = map[string]string{}
		}
		fields[i][strings.TrimSuffix(field, "]")] = form.Get(k)
	}
	idx := make([]int, 0, len(fields))
	for i := range fields {
		idx = append(idx, i)
	}
	sort.Ints(idx)
	var lines []creditLine
	for _, i := range idx {
		f, p := fields[i], fmt.Sprintf("lines[%d]", i)
		l := creditLine{typ: f["type"], invoiceLine: f["invoice_line_item"], description: f["description"], quantity: 1}
		sub := url.Values{}
		for k, v := range f {
			switch k {
			case "type", "invoice_line_item", "description", "amount", "quantity", "unit_amount":
				sub.Set(p+"["+k+"]", v)
			default:
				return nil, invalid(p+"["+k+"]", "parameter_unknown", "Received unknown parameter: "+p+"["+k+"]")
			}
		}
		var bad *apiErr
		if l.amount, bad = parseAmount(sub, p+"[amount]", 1, false); bad != nil {
			return nil, bad
		}
		if f["quantity"] != "" {
			if l.quantity, bad = parseAmount(sub, p+"[quantity]", 1, false); bad != nil {
				return nil, bad
			}
		}
		switch l.typ {
		case "invoice_line_item":
			if l.invoiceLine == "" {
				return nil, invalid(p+"[invoice_line_item]", "parameter_missing", "Missing required param: "+p+"[invoice_line_item].")
			}
			if l.amount == 0 && l.quantity != 1 {
				return nil, invalid(p+"[quantity]", "", "The fake's invoice lines have a quantity of 1: credit a line whole, or pass its amount.")
			}
		case "custom_line_item":
			if l.unitAmount, bad = parseAmount(sub, p+"[unit_amount]", 1, true); bad != nil {
				return nil, bad
			}
			l.amount = l.unitAmount * l.quantity
		default:
			return nil, invalid(p+"[type]", "parameter_invalid_string", "Invalid "+p+"[type]: use invoice_line_item or custom_line_item.")
		}
		lines = append(lines, l)
	}
	return lines, nil
}

// createCreditNote validates POST /v1/credit_notes and returns how to
// run it. A credit note adjusts a finalized invoice: on an open one it
// reduces the amount due (a pre_payment note; the invoice is paid when
// nothing is left due); on a paid one (post_payment) its total goes to a
// refund of the invoice's payment, a credit of the customer's balance or
// a credit made outside Stripe, and those must add up to the total. The
// credit notes of an invoice never add up to more than its total.
func (s *Server) createCreditNote(acct string, form url.Values, key string) (*apiErr, func(time.Time) (result, bool)) {
	md, bad := parseMetadata(form, func(k string) bool { return creditNoteParams[k] || strings.HasPrefix(k, "lines[") })
	if bad != nil {
		return bad, nil
	}
	invID := form.Get("invoice")
	if invID == "" {
		return invalid("invoice", "parameter_missing", "Missing required param: invoice."), nil
	}
	amount, bad := parseAmount(form, "amount", 1, false)
	if bad != nil {
		return bad, nil
	}
	var split [3]int64 // refund, credit, out of band
	for i, k := range []string{"refund_amount", "credit_amount", "out_of_band_amount"} {
		if split[i], bad = parseAmount(form, k, 0, false); bad != nil {
			return bad, nil
		}
	}
	reason, bad := oneOf(form, "reason", "duplicate", "fraudulent", "order_change", "product_unsatisfactory")
	if bad != nil {
		return bad, nil
	}
	if _, bad := oneOf(form, "email_type", "credit_note", "none"); bad != nil {
		return bad, nil
	}
	lines, bad := parseCreditLines(form)
	if bad != nil {
		return bad, nil
	}
	switch {
	case amount > 0 && len(lines) > 0:
		return invalid("amount", "", "Pass amount or lines, not both."), nil
	case amount == 0 && len(lines) == 0:
		return invalid("amount", "parameter_missing", "Pass amount or lines: what the credit note credits."), nil
	}
	return nil, func(now time.Time) (result, bool) {
		refuse := func(param, code, msg string) (result, bool) {
			return errResult(http.StatusBadRequest, *invalid(param, code, msg)), false
		}
		inv := s.invoice(acct, invID)
		if inv == nil {
			return missing("invoice", "invoice", invID), false
		}
		if inv.Status != "open" && inv.Status != "paid" {
			return refuse("invoice", "", fmt.Sprintf("Invoice %s is %s: only a finalized (open or paid) invoice takes a credit note.", inv.ID, inv.Status))
		}
		total := amount
		rendered := make([]any, 0, len(lines))
		for i, l := range lines {
			if l.typ == "invoice_line_item" {
				var il *InvoiceLine
				for j := range inv.Lines {
					if inv.Lines[j].ID == l.invoiceLine {
						il = &inv.Lines[j]
					}
				}
				if il == nil {
					return refuse(fmt.Sprintf("lines[%d][invoice_line_item]", i), "resource_missing",
						fmt.Sprintf("Invoice %s has no line item %s.", inv.ID, l.invoiceLine))
				}
				if l.amount == 0 {
					l.amount = il.Amount
				}
				l.description = orDefault(l.description, il.Description)
			}
			total += l.amount
			s.objSeq++
			rendered = append(rendered, renderCreditLine(fmt.Sprintf("cnli_%014d", s.objSeq), l))
		}
		credited := int64(0)
		notes := 0
		for _, m := range s.moves.list {
			if m.Object == "credit_note" && m.Of == inv.ID {
				credited += m.Amount
				notes++
			}
		}
		if credited+total > inv.total() {
			return refuse("amount", "", fmt.Sprintf("The credit note's total (%d) is more than is left to credit on invoice %s (%d of its %d).",
				total, inv.ID, inv.total()-credited, inv.total()))
		}
		typ := "post_payment"
		if inv.Status == "open" {
			typ = "pre_payment"
			if split != [3]int64{} {
				return refuse("refund_amount", "", "refund_amount, credit_amount and out_of_band_amount are for a paid invoice; a credit note of an open invoice reduces its amount due.")
			}
			if left := inv.amountDue - inv.amountPaid; total > left {
				return refuse("amount", "", fmt.Sprintf("The credit note's total (%d) is more than invoice %s has due (%d).", total, inv.ID, left))
			}
		} else {
			if sum := split[0] + split[1] + split[2]; sum != total {
				return refuse("refund_amount", "", fmt.Sprintf(
					"For a paid invoice, refund_amount, credit_amount and out_of_band_amount must add up to the credit note's total (%d), not %d.", total, sum))
			}
			if split[0] > 0 && inv.PaidOutOfBand {
				return refuse("refund_amount", "", fmt.Sprintf("Invoice %s was paid outside Stripe: there is no payment to refund; use out_of_band_amount.", inv.ID))
			}
			refunded := int64(0)
			for _, m := range s.moves.list {
				if m.Object == "refund" && m.Of == inv.ID {
					refunded += m.Amount
				}
			}
			if split[0] > inv.amountPaid-refunded {
				return refuse("refund_amount", "amount_too_large", fmt.Sprintf("refund_amount (%d) is more than is left to refund of invoice %s's payment (%d).",
					split[0], inv.ID, inv.amountPaid-refunded))
			}
		}
		currency := orDefault(inv.currency, "usd")
		var refund *move
		if split[0] > 0 {
			// The fake's invoice payments have no charge: the refund names none.
			refund = s.newMove("refund", acct, "", nil, now)
			refund.Customer, refund.Of, refund.Amount, refund.Currency, refund.Status = inv.Customer, inv.ID, split[0], currency, "succeeded"
			s.addBalance(acct, currency, -split[0])
		}
		m := s.newMove("credit_note", acct, key, md, now)
		m.Customer, m.Of, m.Amount, m.Currency, m.Status, m.Reason = inv.Customer, inv.ID, total, currency, "issued", reason
		m.RefundAmount, m.CreditAmount, m.OutOfBandAmount = split[0], split[1], split[2]
		if refund != nil {
			m.Refund = refund.ID
		}
		if len(rendered) == 0 {
			s.objSeq++
			rendered = append(rendered, renderCreditLine(fmt.Sprintf("cnli_%014d", s.objSeq), creditLine{typ: "custom_line_item",
				amount: total, quantity: 1, unitAmount: total, description: "Credit"}))
		}
		m.detail = map[string]any{"type": typ, "memo": strOrNil(form.Get("memo")), "lines": rendered,
			"number": fmt.Sprintf("%s-CN-%02d", orDefault(inv.number, inv.ID), notes+1)}
		if typ == "pre_payment" {
			inv.amountDue -= total
			inv.preCredit += total
		} else {
			inv.postCredit += total
		}
		s.emitMove("credit_note.created", m, now)
		if inv.Status == "open" && inv.amountDue == inv.amountPaid {
			inv.Status, inv.paidAt = "paid", now
			s.emitInvoice("invoice.paid", inv, now)
		}
		return s.moveResult(m), true
	}
}

func renderCreditLine(id string, l creditLine) map[string]any {
	var invLine, unit, unitDecimal any
	if l.typ == "invoice_line_item" {
		invLine = l.invoiceLine
	} else {
		unit, unitDecimal = l.unitAmount, strconv.FormatInt(l.unitAmount, 10)
	}
	return map[string]any{"id": id, "object": "credit_note_line_item", "amount": l.amount, "description": strOrNil(l.description),
		"discount_amount": 0, "discount_amounts": []any{}, "invoice_line_item": invLine, "livemode": false, "quantity": l.quantity,
		"tax_rates": []any{}, "type": l.typ, "unit_amount": unit, "unit_amount_decimal": unitDecimal}
}

func (s *Server) renderCreditNote(m *move) map[string]any {
	var oob, refund any
	if m.OutOfBandAmount > 0 {
		oob = m.OutOfBandAmount
	}
	if m.Refund != "" {
		refund = m.Refund
	}
	lines := make([]listItem, 0)
	for _, l := range m.detail["lines"].([]any) {
		lines = append(lines, listItem{l.(map[string]any)["id"].(string), l})
	}
	return map[string]any{"id": m.ID, "object": "credit_note", "amount": m.Amount, "amount_shipping": 0, "created": m.Created.Unix(),
		"currency": m.Currency, "customer": m.Customer, "customer_balance_transaction": nil, "discount_amount": 0,
		"discount_amounts": []any{}, "effective_at": m.Created.Unix(), "invoice": m.Of,
		"lines": listPage("/v1/credit_notes/"+m.ID+"/lines", lines, 10, ""), "livemode": false, "memo": m.detail["memo"],
		"metadata": orEmpty(m.Metadata), "number": m.detail["number"], "out_of_band_amount": oob,
		"pdf": "https://files.stripe.invalid/credit_notes/" + m.ID + "/pdf", "reason": strOrNil(m.Reason), "refund": refund,
		"shipping_cost": nil, "status": m.Status, "subtotal": m.Amount, "subtotal_excluding_tax": m.Amount, "total": m.Amount,
		"total_excluding_tax": m.Amount, "type": m.detail["type"], "voided_at": nil}
}
