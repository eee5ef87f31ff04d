package billingtest

import (
	"fmt"
	"maps"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Invoice is one invoice the server created, as the ledger keeps it.
type Invoice struct {
	ID       string `json:"id"`
	Account  string `json:"account,omitempty"` // the connected account it was made on; "" for the platform
	Customer string `json:"customer"`
	// Status is "draft", "open", "paid", "uncollectible" or "void".
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
	// Lines are the invoice's items, in the order they were added.
	Lines []InvoiceLine `json:"lines"`
	// Finalizations counts the finalizations (one at most: a second is
	// refused), Payments the payments that moved the invoice to paid.
	Finalizations int `json:"finalizations"`
	Payments      int `json:"payments"`
	// Sent reports whether POST /v1/invoices/{id}/send sent it.
	Sent bool `json:"sent,omitempty"`
	// PaidOutOfBand reports whether it was marked paid outside Stripe
	// (POST /v1/invoices/{id}/pay with paid_out_of_band=true), as a person
	// does in the dashboard: no card was charged.
	PaidOutOfBand bool `json:"paid_out_of_band,omitempty"`
}

// InvoiceLine is one line of an [Invoice]: an invoice item.
type InvoiceLine struct {
	ID          string            `json:"id"`   // "il_…"
	Item        string            `json:"item"` // the invoice item, "ii_…"
	Amount      int64             `json:"amount"`
	Currency    string            `json:"currency"`
	Description string            `json:"description,omitempty"`
	Metadata    map[string]string `json:"metadata"`
}

func (inv Invoice) clone() Invoice {
	inv.Metadata = maps.Clone(inv.Metadata)
	inv.Lines = append([]InvoiceLine(nil), inv.Lines...)
	for i := range inv.Lines {
		inv.Lines[i].Metadata = maps.Clone(inv.Lines[i].Metadata)
	}
	return inv
}

// invoice is an invoice with what only the server needs.
type invoice struct {
	Invoice
	created                                        time.Time
	autoAdvance                                    bool
	collection, currency, descr                    string
	daysUntilDue                                   int64
	number                                         string
	amountDue, amountPaid                          int64
	preCredit, postCredit                          int64 // the credit notes' totals, on the open and on the paid invoice
	attempts                                       int
	finalizedAt, paidAt, voidedAt, uncollectibleAt time.Time
	deleted                                        bool
}

// invoiceItem is an invoice item: on a draft invoice, or pending.
type invoiceItem struct {
	id, customer, invoice, currency, description string
	amount                                       int64
	metadata                                     map[string]string
	created                                      time.Time
}

// invoiceState holds the invoices and their items. Guarded by Server.mu.
type invoiceState struct {
	list    []*invoice
	byID    map[string]*invoice
	pending map[string][]*invoiceItem // customer → items on no invoice yet
	number  int
}

func newInvoiceState() invoiceState {
	return invoiceState{byID: make(map[string]*invoice), pending: make(map[string][]*invoiceItem)}
}

// Invoices returns a copy of customer's invoices (everyone's if customer
// is empty) in creation order, deleted drafts excluded.
func (s *Server) Invoices(customer string) []Invoice {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []Invoice
	for _, inv := range s.inv.list {
		if !inv.deleted && (customer == "" || inv.Customer == customer) {
			out = append(out, inv.clone())
		}
	}
	return out
}

// AddPendingItem creates a pending invoice item for customer, on no
// invoice, as POST /v1/invoiceitems without invoice does, and returns its
// id. A draft created with pending_invoice_items_behavior=include sweeps
// it in; the default, exclude, leaves it pending. It panics if currency is
// not one the fake knows.
func (s *Server) AddPendingItem(customer string, amount int64, currency string) string {
	if !currencies[currency] {
		panic(fmt.Sprintf("billingtest: AddPendingItem(%q, %d, %q): unknown currency", customer, amount, currency))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.addItem(&invoiceItem{customer: customer, amount: amount, currency: currency, created: s.now()}, nil)
}

// addItem stores it, on inv or pending when inv is nil, and returns its
// id; mu is held.
func (s *Server) addItem(it *invoiceItem, inv *invoice) string {
	s.objSeq++
	it.id = fmt.Sprintf("ii_%014d", s.objSeq)
	s.stats.Created++
	if inv == nil {
		s.inv.pending[it.customer] = append(s.inv.pending[it.customer], it)
		return it.id
	}
	s.attach(it, inv)
	return it.id
}

// attach puts it on the draft inv as a line; mu is held.
func (s *Server) attach(it *invoiceItem, inv *invoice) {
	it.invoice = inv.ID
	s.objSeq++
	inv.Lines = append(inv.Lines, InvoiceLine{ID: fmt.Sprintf("il_%014d", s.objSeq), Item: it.id, Amount: it.amount,
		Currency: it.currency, Description: it.description, Metadata: it.metadata})
	if inv.currency == "" {
		inv.currency = it.currency
	}
}

var invoiceParams = map[string]bool{
	"customer": true, "auto_advance": true, "collection_method": true, "currency": true, "description": true,
	"days_until_due": true, "pending_invoice_items_behavior": true,
}

// createInvoice validates POST /v1/invoices and returns how to run it.
// pending_invoice_items_behavior defaults to exclude, as stripe-go v79
// documents for API 2024-06-20.
func (s *Server) createInvoice(acct string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	md, bad := parseMetadata(form, func(k string) bool { return invoiceParams[k] })
	if bad != nil {
		return bad, nil
	}
	inv := &invoice{Invoice: Invoice{Customer: form.Get("customer"), Status: "draft", Metadata: md},
		collection: orDefault(form.Get("collection_method"), "charge_automatically"),
		currency:   form.Get("currency"), descr: form.Get("description")}
	if inv.Customer == "" {
		return invalid("customer", "parameter_missing", "Missing required param: customer."), nil
	}
	if inv.autoAdvance, bad = parseBool(form, "auto_advance"); bad != nil {
		return bad, nil
	}
	if inv.currency != "" && !currencies[inv.currency] {
		return invalid("currency", "parameter_invalid_string", "Invalid currency: "+inv.currency), nil
	}
	if raw := form.Get("days_until_due"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 0 {
			return invalid("days_until_due", "parameter_invalid_integer", "Invalid integer: "+raw), nil
		}
		inv.daysUntilDue = n
	}
	switch inv.collection {
	case "charge_automatically":
		if form.Get("days_until_due") != "" {
			return invalid("days_until_due", "", "Invoices with collection_method=charge_automatically cannot have days_until_due."), nil
		}
	case "send_invoice":
		if form.Get("days_until_due") == "" {
			return invalid("days_until_due", "parameter_missing", "Invoices with collection_method=send_invoice must have a due_date or days_until_due."), nil
		}
	default:
		return invalid("collection_method", "parameter_invalid_string", "Invalid collection_method: use charge_automatically or send_invoice."), nil
	}
	include := false
	switch b := form.Get("pending_invoice_items_behavior"); b {
	case "", "exclude":
	case "include":
		include = true
	default:
		return invalid("pending_invoice_items_behavior", "parameter_invalid_string", "Invalid pending_invoice_items_behavior: use exclude or include."), nil
	}
	return nil, func(now time.Time) (result, bool) {
		if bad := s.bindCustomer(acct, inv.Customer); bad != nil {
			return errResult(http.StatusNotFound, *bad), false
		}
		s.objSeq++
		inv.ID = fmt.Sprintf("in_%014d", s.objSeq)
		inv.Account = acct
		inv.created = now
		s.inv.list = append(s.inv.list, inv)
		s.inv.byID[inv.ID] = inv
		s.stats.Created++
		if include {
			var keep []*invoiceItem
			for _, it := range s.inv.pending[inv.Customer] {
				if inv.currency == "" || it.currency == inv.currency {
					s.attach(it, inv)
				} else {
					keep = append(keep, it)
				}
			}
			s.inv.pending[inv.Customer] = keep
		}
		s.emitInvoice("invoice.created", inv, now)
		return s.invoiceResult(inv), true
	}
}

var itemParams = map[string]bool{"customer": true, "invoice": true, "amount": true, "currency": true, "description": true}

// createInvoiceItem validates POST /v1/invoiceitems and returns how to run
// it.
func (s *Server) createInvoiceItem(acct string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	md, bad := parseMetadata(form, func(k string) bool { return itemParams[k] })
	if bad != nil {
		return bad, nil
	}
	it := &invoiceItem{customer: form.Get("customer"), invoice: form.Get("invoice"), currency: form.Get("currency"),
		description: form.Get("description"), metadata: md}
	if it.customer == "" {
		return invalid("customer", "parameter_missing", "Missing required param: customer."), nil
	}
	raw := form.Get("amount")
	if raw == "" {
		return invalid("amount", "parameter_missing", "Missing required param: amount."), nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil || n > maxAmount || n < -maxAmount {
		return invalid("amount", "parameter_invalid_integer", "Invalid integer: "+raw), nil
	}
	it.amount = n
	if it.currency != "" && !currencies[it.currency] {
		return invalid("currency", "parameter_invalid_string", "Invalid currency: "+it.currency), nil
	}
	if it.currency == "" && it.invoice == "" {
		return invalid("currency", "parameter_missing", "Missing required param: currency."), nil
	}
	return nil, func(now time.Time) (result, bool) {
		it.created = now
		if bad := s.bindCustomer(acct, it.customer); bad != nil {
			return errResult(http.StatusNotFound, *bad), false
		}
		var inv *invoice
		if it.invoice != "" {
			inv = s.invoice(acct, it.invoice)
			refuse := func(param, code, msg string) (result, bool) {
				return errResult(http.StatusBadRequest, *invalid(param, code, msg)), false
			}
			switch {
			case inv == nil:
				return refuse("invoice", "resource_missing", fmt.Sprintf("No such invoice: '%s'", it.invoice))
			case inv.Customer != it.customer:
				return refuse("invoice", "", fmt.Sprintf("The invoice %s belongs to customer %s, not %s.", inv.ID, inv.Customer, it.customer))
			case inv.Status != "draft":
				return refuse("invoice", "invoice_not_editable", fmt.Sprintf("You can only add invoice items to draft invoices; invoice %s is %s.", inv.ID, inv.Status))
			case it.currency == "":
				it.currency = orDefault(inv.currency, "usd")
			case inv.currency != "" && it.currency != inv.currency:
				return refuse("currency", "", fmt.Sprintf("The currency %s of the item differs from the invoice's, %s.", it.currency, inv.currency))
			}
		}
		s.addItem(it, inv)
		res := ok(it.render())
		res.objectID = it.id
		return res, true
	}
}

func (it *invoiceItem) render() map[string]any {
	return map[string]any{"id": it.id, "object": "invoiceitem", "amount": it.amount, "currency": it.currency,
		"customer": it.customer, "date": it.created.Unix(), "description": strOrNil(it.description), "discountable": true,
		"invoice": strOrNil(it.invoice), "livemode": false, "metadata": orEmpty(it.metadata),
		"period": map[string]any{"start": it.created.Unix(), "end": it.created.Unix()}, "proration": false, "quantity": 1}
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// invoiceAction validates a POST or DELETE on /v1/invoices/{id} and
// returns how to run it. Stripe's state rules: only a draft is finalized
// or deleted, only an open invoice is paid or voided, only a draft or an
// open invoice has its auto_advance changed; a decline leaves the invoice
// open.
func (s *Server) invoiceAction(acct string, ep endpoint, id string, form url.Values, declined bool, declineCode string) (*apiErr, func(time.Time) (result, bool)) {
	allowed := map[string]bool{}
	switch ep {
	case epFinalizeInvoice, epUpdateInvoice:
		allowed["auto_advance"] = true
	case epPayInvoice:
		for _, k := range []string{"payment_method", "source", "off_session", "paid_out_of_band", "forgive", "mandate"} {
			allowed[k] = true
		}
	}
	if bad := unknownParam(form, allowed); bad != nil {
		return bad, nil
	}
	autoAdvance, bad := parseBool(form, "auto_advance")
	if bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		inv := s.invoice(acct, id)
		if inv == nil {
			return missing("id", "invoice", id), false
		}
		refuse := func(msg string) (result, bool) {
			return errResult(http.StatusBadRequest, apiErr{Type: "invalid_request_error", Message: msg}), false
		}
		switch ep {
		case epFinalizeInvoice:
			if inv.Status != "draft" {
				return refuse("This invoice is already finalized, you can't re-finalize a non-draft invoice.")
			}
			if form.Has("auto_advance") {
				inv.autoAdvance = autoAdvance
			}
			inv.amountDue = 0
			for _, l := range inv.Lines {
				inv.amountDue += l.Amount
			}
			inv.amountDue = max(0, inv.amountDue)
			s.inv.number++
			inv.number = fmt.Sprintf("FAKE-%04d", s.inv.number)
			inv.Status, inv.finalizedAt = "open", now
			inv.Finalizations++
			s.emitInvoice("invoice.finalized", inv, now)
			if inv.amountDue == 0 {
				inv.Status, inv.paidAt = "paid", now
				s.emitInvoice("invoice.paid", inv, now)
			}
		case epPayInvoice:
			switch inv.Status {
			case "paid":
				return refuse("Invoice is already paid")
			case "draft":
				return refuse("This invoice is a draft: finalize it before paying it.")
			case "void":
				return refuse("This invoice is void and can no longer be paid.")
			}
			inv.attempts++
			if declined {
				s.emitInvoice("invoice.payment_failed", inv, now)
				res := errResult(http.StatusPaymentRequired, apiErr{Type: "card_error", Code: "card_declined",
					DeclineCode: declineCode, Message: declineMessage(declineCode)})
				res.objectID = inv.ID
				return res, true
			}
			inv.Status, inv.paidAt, inv.amountPaid = "paid", now, inv.amountDue
			inv.Payments++
			inv.PaidOutOfBand = form.Get("paid_out_of_band") == "true"
			if !inv.PaidOutOfBand {
				s.addBalance(inv.Account, orDefault(inv.currency, "usd"), inv.amountPaid)
			}
			s.emitInvoice("invoice.paid", inv, now)
		case epSendInvoice:
			if inv.collection != "send_invoice" {
				return refuse("You can only send invoices whose collection_method is send_invoice.")
			}
			if inv.Status != "open" && inv.Status != "paid" {
				return refuse(fmt.Sprintf("You can only send an open or paid invoice; this one is %s.", inv.Status))
			}
			inv.Sent = true
			s.emitInvoice("invoice.sent", inv, now)
		case epVoidInvoice:
			if inv.Status != "open" && inv.Status != "uncollectible" {
				return refuse(fmt.Sprintf("You can only void an open or uncollectible invoice; this one is %s.", inv.Status))
			}
			inv.Status, inv.voidedAt = "void", now
			s.emitInvoice("invoice.voided", inv, now)
		case epMarkUncollectible:
			// Stripe collects it no more by itself; it can still be paid
			// (or voided).
			if inv.Status != "open" {
				return refuse(fmt.Sprintf("You can only mark an open invoice as uncollectible; this one is %s.", inv.Status))
			}
			inv.Status, inv.uncollectibleAt, inv.autoAdvance = "uncollectible", now, false
			s.emitInvoice("invoice.marked_uncollectible", inv, now)
		case epUpdateInvoice:
			if inv.Status != "draft" && inv.Status != "open" {
				return refuse(fmt.Sprintf("You can only update the automatic advancement of a draft or open invoice; this one is %s.", inv.Status))
			}
			if form.Has("auto_advance") {
				inv.autoAdvance = autoAdvance
			}
			s.emitInvoice("invoice.updated", inv, now)
		case epDeleteInvoice:
			if inv.Status != "draft" {
				return refuse(fmt.Sprintf("You can only delete draft invoices; this one is %s. Void it instead.", inv.Status))
			}
			inv.deleted = true
			s.emitInvoice("invoice.deleted", inv, now)
			res := ok(map[string]any{"id": inv.ID, "object": "invoice", "deleted": true})
			res.objectID = inv.ID
			return res, true
		}
		return s.invoiceResult(inv), true
	}
}

func (s *Server) invoiceResult(inv *invoice) result {
	res := ok(s.renderInvoice(inv))
	res.objectID = inv.ID
	return res
}

func (s *Server) emitInvoice(typ string, inv *invoice, at time.Time) {
	s.emitObject(inv.Account, typ, inv.ID, s.renderInvoice(inv), at)
}

// invoice returns the invoice id on acct, or nil when acct has none (or
// it was deleted). mu is held.
func (s *Server) invoice(acct, id string) *invoice {
	if inv := s.inv.byID[id]; inv != nil && !inv.deleted && inv.Account == acct {
		return inv
	}
	return nil
}

func unixOrNil(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return t.Unix()
}

func (inv *invoice) total() int64 {
	var t int64
	for _, l := range inv.Lines {
		t += l.Amount
	}
	return t
}

// renderInvoice is inv as Stripe answers it; mu is held.
func (s *Server) renderInvoice(inv *invoice) map[string]any {
	due := inv.amountDue
	if inv.Status == "draft" {
		due = max(0, inv.total())
	}
	var dueDate any
	if inv.collection == "send_invoice" {
		dueDate = inv.created.Add(time.Duration(inv.daysUntilDue) * 24 * time.Hour).Unix()
	}
	lines := make([]listItem, len(inv.Lines))
	for i := range inv.Lines {
		lines[i] = listItem{inv.Lines[i].ID, renderLine(inv, &inv.Lines[i])}
	}
	list := listPage("/v1/invoices/"+inv.ID+"/lines", lines, 10, "")
	return map[string]any{"id": inv.ID, "object": "invoice", "amount_due": due, "amount_paid": inv.amountPaid,
		"amount_remaining": due - inv.amountPaid, "attempt_count": inv.attempts, "attempted": inv.attempts > 0,
		"auto_advance": inv.autoAdvance, "billing_reason": "manual", "collection_method": inv.collection,
		"created": inv.created.Unix(), "currency": orDefault(inv.currency, "usd"), "customer": inv.Customer,
		"description": strOrNil(inv.descr), "due_date": dueDate, "effective_at": unixOrNil(inv.finalizedAt),
		"lines": list, "livemode": false, "metadata": orEmpty(inv.Metadata), "number": strOrNil(inv.number),
		"paid": inv.Status == "paid", "period_start": inv.created.Unix(), "period_end": inv.created.Unix(),
		"pre_payment_credit_notes_amount": inv.preCredit, "post_payment_credit_notes_amount": inv.postCredit,
		"status": inv.Status, "subtotal": inv.total(), "total": inv.total(),
		"status_transitions": map[string]any{"finalized_at": unixOrNil(inv.finalizedAt), "paid_at": unixOrNil(inv.paidAt),
			"voided_at": unixOrNil(inv.voidedAt), "marked_uncollectible_at": unixOrNil(inv.uncollectibleAt)}}
}

func renderLine(inv *invoice, l *InvoiceLine) map[string]any {
	return map[string]any{"id": l.ID, "object": "line_item", "type": "invoiceitem", "invoice_item": l.Item,
		"invoice": inv.ID, "amount": l.Amount, "currency": l.Currency, "description": strOrNil(l.Description),
		"discountable": true, "livemode": false, "metadata": orEmpty(l.Metadata), "proration": false, "quantity": 1,
		"period": map[string]any{"start": inv.created.Unix(), "end": inv.created.Unix()}}
}

// listInvoices serves GET /v1/invoices: the account's invoices, newest
// first, deleted drafts excluded, filtered by customer, status and
// created[…], as Stripe lists them. A list reads what exists now: unlike
// search, it has no indexing delay.
func (s *Server) listInvoices(acct string, form url.Values) result {
	limit, created, bad := listParams(form, "customer", "status")
	if bad != nil {
		return errResult(http.StatusBadRequest, *bad)
	}
	cust, status := form.Get("customer"), form.Get("status")
	switch status {
	case "", "draft", "open", "paid", "uncollectible", "void":
	default:
		return errResult(http.StatusBadRequest, *invalid("status", "parameter_invalid_string", "Invalid status: must be one of draft, open, paid, uncollectible, or void"))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if bad := s.customerHere(acct, cust); bad != nil {
		return errResult(http.StatusNotFound, *bad)
	}
	var items []listItem
	for i := len(s.inv.list) - 1; i >= 0; i-- {
		inv := s.inv.list[i]
		if inv.deleted || inv.Account != acct || cust != "" && inv.Customer != cust || status != "" && inv.Status != status || !created(inv.created) {
			continue
		}
		items = append(items, listItem{inv.ID, s.renderInvoice(inv)})
	}
	return listResult("/v1/invoices", items, limit, form.Get("starting_after"))
}

// readInvoices serves GET of an invoice, of its lines, and invoice search.
func (s *Server) readInvoices(acct string, ep endpoint, id string, form url.Values) result {
	limit, bad := parseLimit(form)
	if bad != nil {
		return errResult(http.StatusBadRequest, *bad)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if ep == epSearchInvoices {
		q, bad := parseQuery(form.Get("query"))
		if bad != nil {
			return errResult(http.StatusBadRequest, *bad)
		}
		now := s.now()
		var items []any
		for i := len(s.inv.list) - 1; i >= 0; i-- {
			inv := s.inv.list[i]
			if inv.deleted || inv.Account != acct || now.Sub(inv.created) < s.search {
				continue
			}
			if q.matches(func(field, key string) string {
				switch field {
				case "metadata":
					return inv.Metadata[key]
				case "customer":
					return inv.Customer
				case "status":
					return inv.Status
				case "currency":
					return orDefault(inv.currency, "usd")
				case "amount":
					return strconv.FormatInt(inv.total(), 10)
				}
				return ""
			}) {
				items = append(items, s.renderInvoice(inv))
			}
		}
		return searchResult("/v1/invoices/search", items, limit, form.Get("page"))
	}
	inv := s.invoice(acct, id)
	if inv == nil {
		return missing("id", "invoice", id)
	}
	if ep == epGetInvoice {
		return s.invoiceResult(inv)
	}
	lines := make([]listItem, len(inv.Lines))
	for i := range inv.Lines {
		lines[i] = listItem{inv.Lines[i].ID, renderLine(inv, &inv.Lines[i])}
	}
	return listResult("/v1/invoices/"+inv.ID+"/lines", lines, limit, form.Get("starting_after"))
}

// collectAfter is how long after an invoice is finalized Stripe's
// automatic collection makes its first payment attempt, when the invoice
// is charged automatically and its auto_advance is on.
const collectAfter = time.Hour

// collectDue attempts the payment of each open invoice that Stripe's
// automatic collection is due to charge: charged automatically, with
// auto_advance on, finalized at least collectAfter ago, and never
// attempted. A declined attempt leaves it open; mu is held.
func (s *Server) collectDue() {
	now := s.now()
	for _, inv := range s.inv.list {
		if inv.deleted || inv.Status != "open" || !inv.autoAdvance || inv.collection == "send_invoice" ||
			inv.attempts > 0 || now.Before(inv.finalizedAt.Add(collectAfter)) {
			continue
		}
		inv.attempts++
		if _, declined := s.declines[inv.Customer]; declined {
			s.emitInvoice("invoice.payment_failed", inv, now)
			continue
		}
		inv.Status, inv.paidAt, inv.amountPaid = "paid", now, inv.amountDue
		inv.Payments++
		s.addBalance(inv.Account, orDefault(inv.currency, "usd"), inv.amountPaid)
		s.emitInvoice("invoice.paid", inv, now)
	}
}

// DeleteInvoiceItem deletes the invoice item id from the draft it is on,
// as DELETE /v1/invoiceitems/{id} does (a person on Stripe's dashboard
// removing a line): the draft's lines no longer show it, and a replay of
// the request that made it still answers with the item. An item on an
// invoice that is no longer a draft is refused, as Stripe refuses it.
func (s *Server) DeleteInvoiceItem(id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, inv := range s.inv.list {
		for i, l := range inv.Lines {
			if l.Item != id {
				continue
			}
			if inv.Status != "draft" || inv.deleted {
				return fmt.Errorf("billingtest: invoice item %s is on invoice %s, which is %s: only a draft's items can be deleted", id, inv.ID, inv.Status)
			}
			inv.Lines = append(inv.Lines[:i:i], inv.Lines[i+1:]...)
			return nil
		}
	}
	return fmt.Errorf("billingtest: no invoice item %s on an invoice", id)
}
