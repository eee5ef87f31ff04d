package billingtest

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"
)

// connectState holds the connected accounts, where each customer lives
// and the balances. Guarded by Server.mu.
type connectState struct {
	accounts  map[string]bool     // connected accounts, by id
	customers map[string]string   // customer → the account it lives on ("" for the platform)
	balances  map[[2]string]int64 // (account, currency) → available balance
}

func newConnectState() connectState {
	return connectState{accounts: make(map[string]bool), customers: make(map[string]string), balances: make(map[[2]string]int64)}
}

// CreateAccount creates a connected account of the platform, as POST
// /v1/accounts does, and returns its id ("acct_…"). Requests that carry
// it in a Stripe-Account header act on that account: their objects live
// there, apart from the platform's and every other account's.
func (s *Server) CreateAccount() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.newAccount(url.Values{}, s.now())["id"].(string)
}

// newAccount stores a connected account and returns it as Stripe
// answers it; mu is held.
func (s *Server) newAccount(form url.Values, now time.Time) map[string]any {
	s.objSeq++
	id := fmt.Sprintf("acct_%014d", s.objSeq)
	s.connect.accounts[id] = true
	s.stats.Created++
	md, _ := parseMetadata(form, func(string) bool { return true })
	return map[string]any{"id": id, "object": "account", "type": orDefault(form.Get("type"), "custom"),
		"country": orDefault(form.Get("country"), "US"), "email": strOrNil(form.Get("email")), "default_currency": "usd",
		"business_type": strOrNil(form.Get("business_type")), "charges_enabled": true, "payouts_enabled": true,
		"details_submitted": true, "created": now.Unix(), "metadata": orEmpty(md)}
}

var accountParams = map[string]bool{"type": true, "country": true, "email": true, "business_type": true}

// createAccount validates POST /v1/accounts and returns how to run it: the
// platform connects a new account, enabled at once.
func (s *Server) createAccount(acct string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	if acct != "" {
		return invalid("", "", "An account is created by the platform: send it without a Stripe-Account header."), nil
	}
	if _, bad := parseMetadata(form, func(k string) bool {
		return accountParams[k] || strings.HasPrefix(k, "capabilities[") || strings.HasPrefix(k, "controller[")
	}); bad != nil {
		return bad, nil
	}
	if _, bad := oneOf(form, "type", "custom", "express", "standard"); bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		a := s.newAccount(form, now)
		res := ok(a)
		res.objectID = a["id"].(string)
		return res, true
	}
}

// accountOf reads the account a request acts on: the Stripe-Account
// header on /v1, the Stripe-Context header on /v2, "" for the platform.
// An account the platform has not connected is refused with 403, as
// Stripe refuses a key access to an account it does not know.
func (s *Server) accountOf(r *http.Request, apiKey string) (string, *apiErr) {
	h := "Stripe-Account"
	if strings.HasPrefix(r.URL.Path, "/v2/") {
		h = "Stripe-Context"
	}
	acct := strings.TrimSpace(r.Header.Get(h))
	if acct == "" {
		return "", nil
	}
	s.mu.Lock()
	known := s.connect.accounts[acct]
	s.mu.Unlock()
	if !known {
		return "", &apiErr{Type: "invalid_request_error", Code: "account_invalid", Message: fmt.Sprintf(
			"The provided key '%s' does not have access to account '%s' (or that account does not exist). Create it with CreateAccount first.", redactKey(apiKey), acct)}
	}
	return acct, nil
}

// bindCustomer makes customer live on acct when it is first named, as
// though it had been created there, and refuses a customer that lives on
// another account: at Stripe a customer id means nothing elsewhere. mu
// is held.
func (s *Server) bindCustomer(acct, customer string) *apiErr {
	if customer == "" {
		return nil
	}
	if bad := s.customerHere(acct, customer); bad != nil {
		return bad
	}
	s.connect.customers[customer] = acct
	return nil
}

// customerHere refuses a customer that lives on another account than
// acct; one never named yet is accepted. mu is held.
func (s *Server) customerHere(acct, customer string) *apiErr {
	if at, ok := s.connect.customers[customer]; ok && at != acct {
		return invalid("customer", "resource_missing", fmt.Sprintf("No such customer: '%s'", customer))
	}
	return nil
}

// missing is the 404 of an object that does not exist on the account.
func missing(param, object, id string) result {
	return errResult(http.StatusNotFound, *invalid(param, "resource_missing", fmt.Sprintf("No such %s: '%s'", object, id)))
}

// How a payout moves on, on the server's clock: a standard payout is
// submitted to the bank (in_transit) an hour after it is made and paid on
// its arrival date two days after; an instant one is submitted at once
// and arrives within half an hour.
const (
	payoutSubmitAfter  = time.Hour
	payoutArrival      = 48 * time.Hour
	instantArrival     = 30 * time.Minute
	defaultPayoutError = "could_not_process"
)

// SetBalance sets the available balance of account ("" for the
// platform) in currency. Payments that succeed add to it at once (the
// fake has no pending balance and no fees), refunds take from it, and
// transfers and payouts need it. It panics if account is not the
// platform or a connected account, or currency is unknown.
func (s *Server) SetBalance(account, currency string, amount int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if account != "" && !s.connect.accounts[account] {
		panic(fmt.Sprintf("billingtest: SetBalance(%q): no connected account with this id; use CreateAccount", account))
	}
	if !currencies[currency] {
		panic(fmt.Sprintf("billingtest: SetBalance(%q, %q): unknown currency", account, currency))
	}
	s.connect.balances[[2]string{account, currency}] = amount
}

// Balance returns the available balance of account ("" for the platform)
// in currency, after moving on what is due.
func (s *Server) Balance(account, currency string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	return s.connect.balances[[2]string{account, currency}]
}

// addBalance moves acct's balance in currency by delta; mu is held.
func (s *Server) addBalance(acct, currency string, delta int64) {
	s.connect.balances[[2]string{acct, currency}] += delta
}

// readBalance serves GET /v1/balance: acct's available balance in each
// currency it has.
func (s *Server) readBalance(acct string) result {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.settleDue()
	var curs []string
	for k := range s.connect.balances {
		if k[0] == acct {
			curs = append(curs, k[1])
		}
	}
	if len(curs) == 0 {
		curs = []string{"usd"}
	}
	sort.Strings(curs)
	var available, pending []any
	for _, c := range curs {
		n := s.connect.balances[[2]string{acct, c}]
		available = append(available, map[string]any{"amount": n, "currency": c, "source_types": map[string]any{"card": n}})
		pending = append(pending, map[string]any{"amount": 0, "currency": c, "source_types": map[string]any{"card": 0}})
	}
	return ok(map[string]any{"object": "balance", "available": available, "pending": pending, "livemode": false})
}

// insufficient is Stripe's refusal of a transfer or payout larger than
// the available balance.
func insufficient(what string, acct, currency string, have, want int64) result {
	return errResult(http.StatusBadRequest, *invalid("amount", "balance_insufficient", fmt.Sprintf(
		"You have insufficient available funds in your Stripe account for this %s: the %s balance of %s is %d, and the %s needs %d.",
		what, currency, orDefault(acct, "the platform"), have, what, want)))
}

var transferParams = map[string]bool{
	"amount": true, "currency": true, "destination": true, "transfer_group": true, "description": true, "source_type": true,
}

// createTransfer validates POST /v1/transfers and returns how to run it:
// the platform moves amount of its available balance to a connected
// account's.
func (s *Server) createTransfer(acct string, form url.Values, key string) (*apiErr, func(time.Time) (result, bool)) {
	if acct != "" {
		return invalid("", "", "A transfer is made by the platform: send it without a Stripe-Account header."), nil
	}
	md, bad := parseMetadata(form, func(k string) bool { return transferParams[k] })
	if bad != nil {
		return bad, nil
	}
	amount, currency, bad := amountAndCurrency(form)
	if bad != nil {
		return bad, nil
	}
	dest := form.Get("destination")
	if dest == "" {
		return invalid("destination", "parameter_missing", "Missing required param: destination."), nil
	}
	if _, bad := oneOf(form, "source_type", "card", "bank_account", "fpx"); bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		if !s.connect.accounts[dest] {
			return errResult(http.StatusBadRequest, *invalid("destination", "resource_missing", fmt.Sprintf("No such destination: '%s'", dest))), false
		}
		if have := s.connect.balances[[2]string{"", currency}]; have < amount {
			return insufficient("transfer", "", currency, have, amount), false
		}
		m := s.newMove("transfer", "", key, md, now)
		m.Amount, m.Currency, m.Destination, m.TransferGroup = amount, currency, dest, form.Get("transfer_group")
		s.objSeq++
		m.detail = map[string]any{"description": strOrNil(form.Get("description")), "destination_payment": fmt.Sprintf("py_%014d", s.objSeq)}
		s.addBalance("", currency, -amount)
		s.addBalance(dest, currency, amount)
		s.emitMove("transfer.created", m, now)
		return s.moveResult(m), true
	}
}

func (s *Server) renderTransfer(m *move) map[string]any {
	revs, reversed := s.reversals(m)
	return map[string]any{"id": m.ID, "object": "transfer", "amount": m.Amount, "amount_reversed": reversed, "balance_transaction": nil,
		"created": m.Created.Unix(), "currency": m.Currency, "description": m.detail["description"], "destination": m.Destination,
		"destination_payment": m.detail["destination_payment"], "livemode": false, "metadata": orEmpty(m.Metadata),
		"reversals": listPage("/v1/transfers/"+m.ID+"/reversals", revs, 10, ""), "reversed": reversed == m.Amount,
		"source_transaction": nil, "source_type": "card", "transfer_group": strOrNil(m.TransferGroup)}
}

// reversals returns the reversals of transfer tr, newest first, and
// their total; mu is held.
func (s *Server) reversals(tr *move) ([]listItem, int64) {
	var items []listItem
	var total int64
	for i := len(s.moves.list) - 1; i >= 0; i-- {
		if m := s.moves.list[i]; m.Object == "transfer_reversal" && m.Of == tr.ID {
			items = append(items, listItem{m.ID, renderReversal(m)})
			total += m.Amount
		}
	}
	return items, total
}

// createReversal validates POST /v1/transfers/{id}/reversals and returns
// how to run it: amount of the transfer (what is left by default) goes
// back from the destination's balance to the platform's, and emits
// transfer.reversed. A destination whose balance is short is refused
// with balance_insufficient.
func (s *Server) createReversal(acct, transfer string, form url.Values, key string) (*apiErr, func(time.Time) (result, bool)) {
	md, bad := parseMetadata(form, func(k string) bool { return k == "amount" || k == "description" || k == "refund_application_fee" })
	if bad != nil {
		return bad, nil
	}
	amount, bad := parseAmount(form, "amount", 1, false)
	if bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		tr := s.moves.byID[transfer]
		if tr == nil || tr.Object != "transfer" || tr.Account != acct {
			return missing("id", "transfer", transfer), false
		}
		_, reversed := s.reversals(tr)
		left := tr.Amount - reversed
		if amount == 0 {
			amount = left
		}
		if amount > left || left == 0 {
			return errResult(http.StatusBadRequest, *invalid("amount", "amount_too_large", fmt.Sprintf(
				"Reversal amount (%d %s) is greater than the unreversed amount of transfer %s (%d %s).", amount, tr.Currency, tr.ID, left, tr.Currency))), false
		}
		if have := s.connect.balances[[2]string{tr.Destination, tr.Currency}]; have < amount {
			return insufficient("reversal", tr.Destination, tr.Currency, have, amount), false
		}
		m := s.newMove("transfer_reversal", acct, key, md, now)
		m.Of, m.Amount, m.Currency, m.Destination, m.TransferGroup = tr.ID, amount, tr.Currency, tr.Destination, tr.TransferGroup
		s.addBalance(tr.Destination, tr.Currency, -amount)
		s.addBalance(acct, tr.Currency, amount)
		s.emitMove("transfer.reversed", tr, now)
		return s.moveResult(m), true
	}
}

func renderReversal(m *move) map[string]any {
	return map[string]any{"id": m.ID, "object": "transfer_reversal", "amount": m.Amount, "balance_transaction": nil,
		"created": m.Created.Unix(), "currency": m.Currency, "destination_payment_refund": nil, "metadata": orEmpty(m.Metadata),
		"source_refund": nil, "transfer": m.Of}
}

var payoutParams = map[string]bool{
	"amount": true, "currency": true, "description": true, "statement_descriptor": true, "method": true, "destination": true,
	"source_type": true,
}

// createPayout validates POST /v1/payouts and returns how to run it: acct
// (the platform or a connected account) pays amount of its available
// balance out to its bank account.
func (s *Server) createPayout(acct string, form url.Values, key string) (*apiErr, func(time.Time) (result, bool)) {
	md, bad := parseMetadata(form, func(k string) bool { return payoutParams[k] })
	if bad != nil {
		return bad, nil
	}
	amount, currency, bad := amountAndCurrency(form)
	if bad != nil {
		return bad, nil
	}
	method, bad := oneOf(form, "method", "standard", "instant")
	if bad != nil {
		return bad, nil
	}
	if _, bad := oneOf(form, "source_type", "card", "bank_account", "fpx"); bad != nil {
		return bad, nil
	}
	method = orDefault(method, "standard")
	return nil, func(now time.Time) (result, bool) {
		if have := s.connect.balances[[2]string{acct, currency}]; have < amount {
			return insufficient("payout", acct, currency, have, amount), false
		}
		m := s.newMove("payout", acct, key, md, now)
		m.Amount, m.Currency, m.Status = amount, currency, "pending"
		submit, arrival := payoutSubmitAfter, payoutArrival
		if method == "instant" {
			submit, arrival = 0, instantArrival
		}
		m.settleAt = now.Add(submit)
		m.detail = map[string]any{"method": method, "arrival": now.Add(arrival), "description": strOrNil(form.Get("description")),
			"statement_descriptor": strOrNil(form.Get("statement_descriptor"))}
		s.addBalance(acct, currency, -amount)
		s.emitMove("payout.created", m, now)
		return s.moveResult(m), true
	}
}

// settlePayout moves a payout to status and emits its event: in_transit
// (payout.updated) once submitted, paid (payout.paid) on arrival, failed
// (payout.failed) before or after it was paid, canceled (payout.canceled)
// while pending; a failed or canceled payout's amount is back in the
// balance. mu is held.
func (s *Server) settlePayout(m *move, status, code string, now time.Time) error {
	from := m.Status
	allowed := map[string][]string{"in_transit": {"pending"}, "paid": {"pending", "in_transit"},
		"failed": {"pending", "in_transit", "paid"}, "canceled": {"pending"}}[status]
	if !slices.Contains(allowed, from) {
		if allowed == nil {
			return fmt.Errorf("a payout moves to in_transit, paid, failed or canceled, not %q", status)
		}
		return fmt.Errorf("the payout is %s; only one that is %s moves to %s", from, strings.Join(allowed, " or "), status)
	}
	m.Status, m.settleAt = status, time.Time{}
	typ := "payout." + status
	switch status {
	case "in_transit":
		m.settleAt, typ = m.detail["arrival"].(time.Time), "payout.updated"
	case "failed", "canceled":
		if status == "failed" {
			m.FailureCode = orDefault(code, defaultPayoutError)
		}
		s.addBalance(m.Account, m.Currency, m.Amount)
	}
	s.emitMove(typ, m, now)
	return nil
}

func renderPayout(m *move) map[string]any {
	var code, msg any
	if m.FailureCode != "" {
		code, msg = m.FailureCode, "The payout failed: "+m.FailureCode+"."
	}
	recon := "in_progress"
	if m.Status == "paid" {
		recon = "completed"
	}
	return map[string]any{"id": m.ID, "object": "payout", "amount": m.Amount, "application_fee": nil, "application_fee_amount": nil,
		"arrival_date": m.detail["arrival"].(time.Time).Unix(), "automatic": false, "balance_transaction": nil,
		"created": m.Created.Unix(), "currency": m.Currency, "description": m.detail["description"], "destination": nil,
		"failure_balance_transaction": nil, "failure_code": code, "failure_message": msg, "livemode": false,
		"metadata": orEmpty(m.Metadata), "method": m.detail["method"], "original_payout": nil, "reconciliation_status": recon,
		"reversed_by": nil, "source_type": "card", "statement_descriptor": m.detail["statement_descriptor"], "status": m.Status,
		"type": "bank_account"}
}

// amountAndCurrency reads a required positive amount and a known
// currency.
func amountAndCurrency(form url.Values) (int64, string, *apiErr) {
	amount, bad := parseAmount(form, "amount", 1, true)
	if bad != nil {
		return 0, "", bad
	}
	c := form.Get("currency")
	if c == "" {
		return 0, "", invalid("currency", "parameter_missing", "Missing required param: currency.")
	}
	if !currencies[c] {
		return 0, "", invalid("currency", "parameter_invalid_string", fmt.Sprintf("Invalid currency: %s. Use a lowercase three-letter ISO code such as usd or eur.", c))
	}
	return amount, c, nil
}
