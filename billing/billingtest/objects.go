package billingtest

import (
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"
)

// apiErr is the body of a Stripe error: {"error": {...}}.
type apiErr struct {
	Type          string      `json:"type"`
	Code          string      `json:"code,omitempty"`
	DeclineCode   string      `json:"decline_code,omitempty"`
	Message       string      `json:"message"`
	Param         string      `json:"param,omitempty"`
	Charge        string      `json:"charge,omitempty"`
	PaymentIntent *intentJSON `json:"payment_intent,omitempty"`
}

func errResult(status int, e apiErr) result {
	return result{status: status, body: mustJSON(struct {
		Error apiErr `json:"error"`
	}{e})}
}

func invalid(param, code, msg string) *apiErr {
	return &apiErr{Type: "invalid_request_error", Param: param, Code: code, Message: msg}
}

type chargeJSON struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`
	Amount         int64             `json:"amount"`
	AmountCaptured int64             `json:"amount_captured"`
	AmountRefunded int64             `json:"amount_refunded"`
	Captured       bool              `json:"captured"`
	Created        int64             `json:"created"`
	Currency       string            `json:"currency"`
	Customer       *string           `json:"customer"`
	Description    *string           `json:"description"`
	FailureCode    *string           `json:"failure_code"`
	FailureMessage *string           `json:"failure_message"`
	Livemode       bool              `json:"livemode"`
	Metadata       map[string]string `json:"metadata"`
	Paid           bool              `json:"paid"`
	Refunded       bool              `json:"refunded"`
	Status         string            `json:"status"`
}

type intentJSON struct {
	ID                 string            `json:"id"`
	Object             string            `json:"object"`
	Amount             int64             `json:"amount"`
	AmountReceived     int64             `json:"amount_received"`
	CaptureMethod      string            `json:"capture_method"`
	ConfirmationMethod string            `json:"confirmation_method"`
	Created            int64             `json:"created"`
	Currency           string            `json:"currency"`
	Customer           *string           `json:"customer"`
	Description        *string           `json:"description"`
	LastPaymentError   *apiErr           `json:"last_payment_error"`
	Livemode           bool              `json:"livemode"`
	Metadata           map[string]string `json:"metadata"`
	PaymentMethod      *string           `json:"payment_method"`
	Status             string            `json:"status"`
}

func strOrNil(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func render(p *Payment) any {
	if p.Object == "payment_intent" {
		var last *apiErr
		if p.DeclineCode != "" {
			e := declineErr(p)
			last = &e
		}
		if p.Status == "requires_payment_method" && p.FailureCode != "" {
			last = &apiErr{Type: "card_error", Code: p.FailureCode, Message: "The payment failed when it settled: " + p.FailureCode + "."}
		}
		return renderIntent(p, last)
	}
	c := &chargeJSON{ID: p.ID, Object: "charge", Amount: p.Amount, Created: p.Created.Unix(), Currency: p.Currency,
		Customer: strOrNil(p.Customer), Description: strOrNil(p.Description), Metadata: p.Metadata,
		Paid: p.Paid, Captured: p.Paid, Status: p.Status, AmountRefunded: p.AmountRefunded, Refunded: p.AmountRefunded > 0 && p.AmountRefunded == p.Amount}
	if p.Paid {
		c.AmountCaptured = p.Amount
	}
	if p.DeclineCode != "" {
		c.FailureCode, c.FailureMessage = strOrNil("card_declined"), strOrNil(declineMessage(p.DeclineCode))
	}
	if p.Status == "failed" && p.FailureCode != "" {
		c.FailureCode, c.FailureMessage = strOrNil(p.FailureCode), strOrNil("The payment failed when it settled.")
	}
	return c
}

func renderIntent(p *Payment, last *apiErr) *intentJSON {
	pi := &intentJSON{ID: p.ID, Object: "payment_intent", Amount: p.Amount, CaptureMethod: "automatic",
		ConfirmationMethod: "automatic", Created: p.Created.Unix(), Currency: p.Currency,
		Customer: strOrNil(p.Customer), Description: strOrNil(p.Description), Metadata: p.Metadata,
		PaymentMethod: strOrNil(p.PaymentMethod), Status: p.Status}
	if p.Paid {
		pi.AmountReceived = p.Amount
		if p.received > 0 {
			pi.AmountReceived = p.received
		}
	}
	if last != nil {
		l := *last
		l.PaymentIntent = nil
		pi.LastPaymentError = &l
	}
	return pi
}

// createParams is a validated create request.
type createParams struct {
	Payment
	confirm bool
}

var chargeParams = map[string]bool{
	"amount": true, "currency": true, "customer": true, "description": true, "source": true,
	"capture": true, "receipt_email": true, "statement_descriptor": true,
	"statement_descriptor_suffix": true, "transfer_group": true,
}

var intentParams = map[string]bool{
	"amount": true, "currency": true, "customer": true, "description": true, "payment_method": true,
	"confirm": true, "off_session": true, "capture_method": true, "confirmation_method": true,
	"receipt_email": true, "statement_descriptor": true, "statement_descriptor_suffix": true,
	"setup_future_usage": true, "error_on_requires_action": true, "return_url": true,
	"transfer_group": true, "use_stripe_sdk": true,
}

// maxAmount is Stripe's largest amount (eight digits).
const maxAmount = 99_999_999

// parseCreate validates a create request the way Stripe does, naming the
// offending parameter.
func parseCreate(form url.Values, intent bool) (createParams, *apiErr) {
	var p createParams
	allowed := chargeParams
	if intent {
		allowed = intentParams
	}
	var bad *apiErr
	if p.Metadata, bad = parseMetadata(form, func(k string) bool {
		return allowed[k] || (intent && (strings.HasPrefix(k, "payment_method_types[") || strings.HasPrefix(k, "automatic_payment_methods[")))
	}); bad != nil {
		return p, bad
	}

	raw := form.Get("amount")
	if raw == "" {
		return p, invalid("amount", "parameter_missing", "Missing required param: amount.")
	}
	amount, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return p, invalid("amount", "parameter_invalid_integer", "Invalid integer: "+raw)
	}
	if amount < 1 {
		return p, invalid("amount", "parameter_invalid_integer", "This value must be greater than or equal to 1.")
	}
	if amount > maxAmount {
		return p, invalid("amount", "amount_too_large", fmt.Sprintf("Amount must be no more than %d.", maxAmount))
	}
	p.Amount = amount

	p.Currency = form.Get("currency")
	if p.Currency == "" {
		return p, invalid("currency", "parameter_missing", "Missing required param: currency.")
	}
	if !currencies[p.Currency] {
		return p, invalid("currency", "parameter_invalid_string", fmt.Sprintf("Invalid currency: %s. Use a lowercase three-letter ISO code such as usd or eur.", p.Currency))
	}
	p.Customer = form.Get("customer")
	p.Description = form.Get("description")

	if !intent {
		if p.Customer == "" && form.Get("source") == "" {
			return p, invalid("customer", "parameter_missing", "Must provide source or customer.")
		}
		return p, nil
	}
	p.PaymentMethod = form.Get("payment_method")
	if p.confirm, bad = parseBool(form, "confirm"); bad != nil {
		return p, bad
	}
	offSession, bad := parseBool(form, "off_session")
	if bad != nil {
		return p, bad
	}
	if offSession && !p.confirm {
		return p, invalid("off_session", "parameter_invalid_string", "off_session can only be used when confirm=true.")
	}
	if p.confirm && p.PaymentMethod == "" {
		return p, invalid("payment_method", "payment_intent_unexpected_state", "You cannot confirm this PaymentIntent because it's missing a payment method. Pass payment_method.")
	}
	return p, nil
}

// parseMetadata reads the metadata[…] parameters as Stripe validates
// them, and refuses any other parameter that allowed does not accept
// (expand aside). It returns nil when there is no metadata.
func parseMetadata(form url.Values, accept func(param string) bool) (map[string]string, *apiErr) {
	var md map[string]string
	for k := range form {
		if mk, ok := strings.CutPrefix(k, "metadata["); ok {
			mk = strings.TrimSuffix(mk, "]")
			if mk == "" || len(mk) > 40 || strings.ContainsAny(mk, "[]") {
				return nil, invalid(k, "parameter_invalid_string", fmt.Sprintf("Invalid metadata key %q: keys are 1 to 40 characters without square brackets.", mk))
			}
			v := form.Get(k)
			if len(v) > 500 {
				return nil, invalid(k, "parameter_invalid_string", fmt.Sprintf("Metadata value for %q is %d characters; the limit is 500.", mk, len(v)))
			}
			if v == "" {
				continue // Stripe treats an empty value as unset
			}
			if md == nil {
				md = make(map[string]string)
			}
			md[mk] = v
			continue
		}
		if strings.HasPrefix(k, "expand[") || k == "expand" {
			continue
		}
		if !accept(k) {
			return nil, invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
	}
	if len(md) > 50 {
		return nil, invalid("metadata", "parameter_invalid_string", fmt.Sprintf("Metadata has %d keys; the limit is 50.", len(md)))
	}
	return md, nil
}

func parseBool(form url.Values, k string) (bool, *apiErr) {
	switch v := form.Get(k); v {
	case "", "false":
		return false, nil
	case "true":
		return true, nil
	default:
		return false, invalid(k, "parameter_invalid_boolean", "Invalid boolean: "+v)
	}
}

// currencies Stripe settles in; the fake accepts lowercase codes only.
var currencies = func() map[string]bool {
	m := make(map[string]bool)
	for _, c := range strings.Fields(`usd eur gbp jpy cad aud nzd chf sek nok dkk pln czk huf ron bgn
		isk try ils aed sar inr cny hkd sgd krw twd thb myr idr php vnd mxn brl ars clp cop pen uyu
		zar ngn kes egp mad`) {
		m[c] = true
	}
	return m
}()

// read serves the GET endpoints.
func (s *Server) read(ep endpoint, id, acct string, r *http.Request) result {
	object, url := "charge", "/v1/charges"
	if ep == epListIntents || ep == epSearchIntents || ep == epGetIntent {
		object, url = "payment_intent", "/v1/payment_intents"
	}
	if ep == epGetCharge || ep == epGetIntent {
		s.mu.Lock()
		s.settleDue()
		var body []byte
		if p := s.payment(acct, id, object); p != nil {
			body = mustJSON(render(p))
		}
		s.mu.Unlock()
		if body == nil {
			return errResult(http.StatusNotFound, *invalid("id", "resource_missing", fmt.Sprintf("No such %s: '%s'", object, id)))
		}
		return result{status: http.StatusOK, body: body, objectID: id}
	}

	limit := int64(10)
	if raw := r.Form.Get("limit"); raw != "" {
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil || n < 1 || n > 100 {
			return errResult(http.StatusBadRequest, *invalid("limit", "parameter_invalid_integer", "limit must be an integer between 1 and 100."))
		}
		limit = n
	}

	var match func(*Payment) bool
	search := ep == epSearchCharges || ep == epSearchIntents
	offset := 0
	if search {
		q, err := parseQuery(r.Form.Get("query"))
		if err != nil {
			return errResult(http.StatusBadRequest, *err)
		}
		match = func(p *Payment) bool { return p.Account == acct && p.searchable(s.now(), s.search) && q.match(p) }
		if pg := r.Form.Get("page"); pg != "" {
			n, err := strconv.Atoi(strings.TrimPrefix(pg, "page_"))
			if err != nil || n < 0 {
				return errResult(http.StatusBadRequest, *invalid("page", "parameter_invalid_string", "Invalid page: "+pg))
			}
			offset = n
		}
	} else {
		cust := r.Form.Get("customer")
		match = func(p *Payment) bool { return p.Account == acct && (cust == "" || p.Customer == cust) }
	}
	after := r.Form.Get("starting_after")

	// Newest first, as Stripe lists and searches.
	var data []any
	hasMore := false
	s.mu.Lock()
	s.settleDue()
	if bad := s.customerHere(acct, r.Form.Get("customer")); bad != nil && !search {
		s.mu.Unlock()
		return errResult(http.StatusNotFound, *bad)
	}
	skipping := after != ""
	seen := 0
	for i := len(s.payments) - 1; i >= 0; i-- {
		p := s.payments[i]
		if p.Object != object || !match(p) {
			continue
		}
		if skipping {
			skipping = p.ID != after
			continue
		}
		if seen < offset {
			seen++
			continue
		}
		if int64(len(data)) == limit {
			hasMore = true
			break
		}
		data = append(data, render(p))
	}
	s.mu.Unlock()
	if data == nil {
		data = []any{}
	}
	if search {
		var next *string
		if hasMore {
			n := fmt.Sprintf("page_%d", offset+len(data))
			next = &n
		}
		return result{status: http.StatusOK, body: mustJSON(map[string]any{
			"object": "search_result", "data": data, "has_more": hasMore, "next_page": next, "url": url + "/search"})}
	}
	return result{status: http.StatusOK, body: mustJSON(map[string]any{
		"object": "list", "data": data, "has_more": hasMore, "url": url})}
}

// query is a parsed search query: clauses joined by AND.
type query []clause

type clause struct{ field, key, value string }

func (q query) match(p *Payment) bool {
	return q.matches(func(field, key string) string {
		switch field {
		case "metadata":
			return p.Metadata[key]
		case "customer":
			return p.Customer
		case "status":
			return p.Status
		case "currency":
			return p.Currency
		case "amount":
			return strconv.FormatInt(p.Amount, 10)
		}
		return ""
	})
}

// matches reports whether every clause holds for the object whose fields
// field returns.
func (q query) matches(field func(name, key string) string) bool {
	for _, c := range q {
		if field(c.field, c.key) != c.value {
			return false
		}
	}
	return true
}

// searchable reports whether p has reached the search index: delay after
// its creation on the server's clock.
func (p *Payment) searchable(now time.Time, delay time.Duration) bool {
	return now.Sub(p.Created) >= delay
}

// searchResult pages a search's matches, in the order given, from page
// ("page_N": the offset N).
func searchResult(url string, items []any, limit int, page string) result {
	offset := 0
	if page != "" {
		n, err := strconv.Atoi(strings.TrimPrefix(page, "page_"))
		if err != nil || n < 0 {
			return errResult(http.StatusBadRequest, *invalid("page", "parameter_invalid_string", "Invalid page: "+page))
		}
		offset = n
	}
	data := []any{}
	if offset < len(items) {
		data = items[offset:min(len(items), offset+limit)]
	}
	hasMore := offset+len(data) < len(items)
	var next *string
	if hasMore {
		n := fmt.Sprintf("page_%d", offset+len(data))
		next = &n
	}
	return ok(map[string]any{"object": "search_result", "data": data, "has_more": hasMore, "next_page": next, "url": url})
}

// parseQuery reads Stripe's search syntax, restricted to exact matches on
// metadata['k'], customer, status, currency and amount joined by AND.
func parseQuery(q string) (query, *apiErr) {
	bad := func(msg string) *apiErr { return invalid("query", "parameter_invalid_string", msg) }
	if strings.TrimSpace(q) == "" {
		return nil, invalid("query", "parameter_missing", "Missing required param: query.")
	}
	var out query
	for _, part := range strings.Split(q, " AND ") {
		part = strings.TrimSpace(part)
		var c clause
		if rest, ok := strings.CutPrefix(part, "metadata["); ok {
			i := strings.Index(rest, "]:")
			if i < 0 {
				return nil, bad(fmt.Sprintf("Cannot parse clause %q: want metadata['key']:'value'.", part))
			}
			k, ok1 := unquote(rest[:i])
			v, ok2 := unquote(rest[i+2:])
			if !ok1 || !ok2 {
				return nil, bad(fmt.Sprintf("Cannot parse clause %q: quote the key and the value.", part))
			}
			c = clause{"metadata", k, v}
		} else {
			f, raw, ok := strings.Cut(part, ":")
			if !ok {
				return nil, bad(fmt.Sprintf("Cannot parse clause %q: want field:'value'.", part))
			}
			switch f {
			case "customer", "status", "currency":
				v, ok := unquote(raw)
				if !ok {
					return nil, bad(fmt.Sprintf("Cannot parse clause %q: quote the value.", part))
				}
				c = clause{field: f, value: v}
			case "amount":
				if _, err := strconv.ParseInt(raw, 10, 64); err != nil {
					return nil, bad(fmt.Sprintf("Cannot parse clause %q: amount takes an integer.", part))
				}
				c = clause{field: f, value: raw}
			default:
				return nil, bad(fmt.Sprintf("Field %q is not searchable in this fake; use metadata['key'], customer, status, currency or amount, joined by AND.", f))
			}
		}
		out = append(out, c)
	}
	return out, nil
}

func unquote(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if len(s) < 2 || (s[0] != '\'' && s[0] != '"') || s[len(s)-1] != s[0] {
		return "", false
	}
	q := string(s[0])
	return strings.ReplaceAll(s[1:len(s)-1], `\`+q, q), true
}

// listParams reads a list's parameters: limit, starting_after and
// created[…], which every list takes, and the filters named, refusing any
// other (expand aside).
func listParams(form url.Values, filters ...string) (limit int, created func(time.Time) bool, bad *apiErr) {
	for k := range form {
		if !slices.Contains(filters, k) && k != "limit" && k != "starting_after" && k != "created" && !strings.HasPrefix(k, "created[") &&
			k != "expand" && !strings.HasPrefix(k, "expand[") {
			return 0, nil, invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
	}
	if limit, bad = parseLimit(form); bad != nil {
		return 0, nil, bad
	}
	created, bad = parseCreated(form)
	return limit, created, bad
}

// parseCreated reads a list's created filter: created=N, or any of
// created[gt], [gte], [lt] and [lte], in Unix seconds.
func parseCreated(form url.Values) (func(time.Time) bool, *apiErr) {
	type bound struct {
		op string
		at int64
	}
	var bounds []bound
	for _, op := range []string{"", "gt", "gte", "lt", "lte"} {
		k := "created"
		if op != "" {
			k += "[" + op + "]"
		}
		raw := form.Get(k)
		if raw == "" {
			continue
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return nil, invalid(k, "parameter_invalid_integer", "Invalid integer: "+raw)
		}
		bounds = append(bounds, bound{op, n})
	}
	return func(t time.Time) bool {
		at := t.Unix()
		for _, b := range bounds {
			if !map[string]bool{"": at == b.at, "gt": at > b.at, "gte": at >= b.at, "lt": at < b.at, "lte": at <= b.at}[b.op] {
				return false
			}
		}
		return true
	}, nil
}

// parseAmount reads an integer amount from least to Stripe's largest;
// absent, it is 0 (and must be given when required).
func parseAmount(form url.Values, k string, least int64, required bool) (int64, *apiErr) {
	raw := form.Get(k)
	if raw == "" {
		if required {
			return 0, invalid(k, "parameter_missing", "Missing required param: "+k+".")
		}
		return 0, nil
	}
	n, err := strconv.ParseInt(raw, 10, 64)
	if err != nil {
		return 0, invalid(k, "parameter_invalid_integer", "Invalid integer: "+raw)
	}
	if n < least {
		return 0, invalid(k, "parameter_invalid_integer", fmt.Sprintf("This value must be greater than or equal to %d.", least))
	}
	if n > maxAmount {
		return 0, invalid(k, "amount_too_large", fmt.Sprintf("Amount must be no more than %d.", maxAmount))
	}
	return n, nil
}

// oneOf reads an optional parameter that takes one of values.
func oneOf(form url.Values, k string, values ...string) (string, *apiErr) {
	v := form.Get(k)
	if v == "" {
		return "", nil
	}
	for _, ok := range values {
		if v == ok {
			return v, nil
		}
	}
	return "", invalid(k, "parameter_invalid_string", fmt.Sprintf("Invalid %s %q: use one of %s.", k, v, strings.Join(values, ", ")))
}
