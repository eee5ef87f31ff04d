package billingtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"time"
)

// idemEntry is the state of one (API key, idempotency key) pair.
type idemEntry struct {
	attempts int
	state    uint8 // stateNone, stateExecuting or stateDone
	endpoint string
	sig      string
	created  time.Time
	resp     result
}

const (
	stateNone uint8 = iota
	stateExecuting
	stateDone
)

// result is a response the server writes, and the stored result of a key.
type result struct {
	status      int
	body        []byte
	shouldRetry string // Stripe-Should-Retry, "" for none
	objectID    string
	requestID   string // of the request that produced it
	replayed    bool
}

type endpoint uint8

const (
	epNone endpoint = iota
	epCreateCharge
	epCreateIntent
	epListCharges
	epListIntents
	epSearchCharges
	epSearchIntents
	epGetCharge
	epGetIntent

	epCreateMeter
	epListMeters
	epGetMeter
	epMeterSummaries
	epCreateMeterEvent
	epGetV2Event

	epConfirmIntent
	epCancelIntent

	epListInvoices
	epCreateInvoice
	epCreateInvoiceItem
	epGetInvoice
	epInvoiceLines
	epSearchInvoices
	epFinalizeInvoice
	epPayInvoice
	epSendInvoice
	epVoidInvoice
	epDeleteInvoice
	epUpdateInvoice
	epMarkUncollectible

	epCreateRefund
	epCreateCreditNote
	epCreateTransfer
	epCreatePayout
	epGetBalance
	epCreateAccount
	epCreateReversal
	epListReversals
	epListMoves // refunds, credit notes, transfers or payouts, by path
	epGetMove
	epListEvents
)

// invoiceEndpoint reports whether ep names an invoice by id in its path.
func (ep endpoint) invoiceEndpoint() bool {
	return ep >= epGetInvoice && ep <= epUpdateInvoice && ep != epSearchInvoices
}

// writes reports whether ep changes the server's state, under the
// idempotency layer.
func (ep endpoint) writes() bool {
	switch ep {
	case epCreateCharge, epCreateIntent, epConfirmIntent, epCancelIntent, epCreateMeter, epCreateMeterEvent, epCreateInvoice, epCreateInvoiceItem,
		epFinalizeInvoice, epPayInvoice, epSendInvoice, epVoidInvoice, epDeleteInvoice, epUpdateInvoice, epMarkUncollectible,
		epCreateRefund, epCreateCreditNote, epCreateTransfer, epCreatePayout, epCreateAccount, epCreateReversal:
		return true
	}
	return false
}

// pathID returns the id in path after prefix, with an optional suffix
// after it ("" for none), and whether path has that shape.
func pathID(path, prefix, suffix string) (string, bool) {
	rest, ok := strings.CutPrefix(path, prefix)
	if !ok {
		return "", false
	}
	if suffix != "" {
		if rest, ok = strings.CutSuffix(rest, suffix); !ok {
			return "", false
		}
	}
	return rest, rest != "" && !strings.Contains(rest, "/")
}

func route(method, path string) (endpoint, string) {
	switch method {
	case http.MethodPost:
		switch path {
		case "/v1/charges":
			return epCreateCharge, ""
		case "/v1/payment_intents":
			return epCreateIntent, ""
		case "/v1/billing/meters":
			return epCreateMeter, ""
		case "/v1/billing/meter_events":
			return epCreateMeterEvent, ""
		case "/v1/invoices":
			return epCreateInvoice, ""
		case "/v1/invoiceitems":
			return epCreateInvoiceItem, ""
		case "/v1/refunds":
			return epCreateRefund, ""
		case "/v1/credit_notes":
			return epCreateCreditNote, ""
		case "/v1/transfers":
			return epCreateTransfer, ""
		case "/v1/payouts":
			return epCreatePayout, ""
		case "/v1/accounts":
			return epCreateAccount, ""
		}
		if id, ok := pathID(path, "/v1/payment_intents/", "/confirm"); ok {
			return epConfirmIntent, id
		}
		if id, ok := pathID(path, "/v1/transfers/", "/reversals"); ok {
			return epCreateReversal, id
		}
		if id, ok := pathID(path, "/v1/payment_intents/", "/cancel"); ok {
			return epCancelIntent, id
		}
		for _, a := range []struct {
			suffix string
			ep     endpoint
		}{{"/finalize", epFinalizeInvoice}, {"/pay", epPayInvoice}, {"/send", epSendInvoice}, {"/void", epVoidInvoice}, {"/mark_uncollectible", epMarkUncollectible}} {
			if id, ok := pathID(path, "/v1/invoices/", a.suffix); ok {
				return a.ep, id
			}
		}
		if id, ok := pathID(path, "/v1/invoices/", ""); ok && id != "search" {
			return epUpdateInvoice, id
		}
	case http.MethodDelete:
		if id, ok := pathID(path, "/v1/invoices/", ""); ok && id != "search" {
			return epDeleteInvoice, id
		}
	case http.MethodGet:
		switch path {
		case "/v1/charges":
			return epListCharges, ""
		case "/v1/payment_intents":
			return epListIntents, ""
		case "/v1/charges/search":
			return epSearchCharges, ""
		case "/v1/payment_intents/search":
			return epSearchIntents, ""
		case "/v1/billing/meters":
			return epListMeters, ""
		case "/v1/invoices/search":
			return epSearchInvoices, ""
		case "/v1/invoices":
			return epListInvoices, ""
		case "/v1/balance":
			return epGetBalance, ""
		case "/v1/events":
			return epListEvents, ""
		}
		if id, ok := pathID(path, "/v1/transfers/", "/reversals"); ok {
			return epListReversals, id
		}
		for _, k := range moveKinds {
			if k.path == "" {
				continue
			}
			if path == k.path {
				return epListMoves, ""
			}
			if id, ok := pathID(path, k.path+"/", ""); ok {
				return epGetMove, id
			}
		}
		if id, ok := pathID(path, "/v1/charges/", ""); ok {
			return epGetCharge, id
		}
		if id, ok := pathID(path, "/v1/payment_intents/", ""); ok {
			return epGetIntent, id
		}
		if id, ok := pathID(path, "/v1/billing/meters/", ""); ok {
			return epGetMeter, id
		}
		if id, ok := pathID(path, "/v1/billing/meters/", "/event_summaries"); ok {
			return epMeterSummaries, id
		}
		if id, ok := pathID(path, "/v2/core/events/", ""); ok {
			return epGetV2Event, id
		}
		if id, ok := pathID(path, "/v1/invoices/", ""); ok {
			return epGetInvoice, id
		}
		if id, ok := pathID(path, "/v1/invoices/", "/lines"); ok {
			return epInvoiceLines, id
		}
	}
	return epNone, ""
}

func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.inflight.Add(1)
	defer s.inflight.Done()
	rid := fmt.Sprintf("req_%014d", s.reqSeq.Add(1))
	h := w.Header()
	h.Set("Request-Id", rid)
	key := strings.TrimSpace(r.Header.Get("Idempotency-Key"))
	if key != "" {
		h.Set("Idempotency-Key", key)
	}
	e := Entry{RequestID: rid, Method: r.Method, Path: r.URL.Path, IdempotencyKey: key}

	apiKey, authErr := s.authenticate(r)
	if authErr != nil {
		s.finish(w, &e, errResult(http.StatusUnauthorized, *authErr), Fault{})
		return
	}
	if err := r.ParseForm(); errors.Is(err, io.ErrUnexpectedEOF) {
		// The client went away while it sent the body (a process killed
		// mid-write): no request arrived, and no one is left to answer.
		s.mu.Lock()
		e.Time = s.now()
		s.log = append(s.log, e)
		s.mu.Unlock()
		return
	} else if err != nil {
		s.finish(w, &e, errResult(http.StatusBadRequest, apiErr{Type: "invalid_request_error", Message: "Could not parse the request body as application/x-www-form-urlencoded: " + err.Error()}), Fault{})
		return
	}
	ep, id := route(r.Method, r.URL.Path)
	if ep == epNone {
		s.finish(w, &e, errResult(http.StatusNotFound, apiErr{Type: "invalid_request_error",
			Message: fmt.Sprintf("Unrecognized request URL (%s: %s). This fake Stripe serves charges, payment intents, invoices, invoice items, billing meters, meter events, refunds, credit notes, transfers, payouts, the balance and connected accounts (see the package documentation).", r.Method, r.URL.Path)}), Fault{})
		return
	}
	acct, acctErr := s.accountOf(r, apiKey)
	if acctErr != nil {
		s.finish(w, &e, errResult(http.StatusForbidden, *acctErr), Fault{})
		return
	}
	e.Account = acct
	e.Customer = r.Form.Get("customer")
	idem := r.Method == http.MethodPost && key != ""
	// Keys are scoped per API key and per account: the same key on
	// another account is another key.
	scoped := apiKey + "\x00" + key
	if acct != "" {
		scoped += "\x00" + acct
	}

	// The rate limiter runs before anything else and stores nothing.
	s.mu.Lock()
	s.stats.Requests++
	if e.Customer == "" {
		e.Customer = s.customerOf(acct, ep, id, r.Form)
	}
	if !s.bucket.allow(time.Now()) {
		s.mu.Unlock()
		s.finish(w, &e, rateLimited(), Fault{})
		return
	}
	req := Request{Method: r.Method, Path: r.URL.Path, IdempotencyKey: key, Customer: e.Customer, Account: acct}
	drawID := r.Method + " " + r.URL.Path
	if idem {
		ent := s.keys[scoped]
		if ent == nil {
			ent = &idemEntry{}
			s.keys[scoped] = ent
		}
		ent.attempts++
		req.Attempt = ent.attempts
		drawID = scoped
	} else {
		s.seqs[drawID]++
		req.Attempt = s.seqs[drawID]
	}
	req.drawID = &drawID
	var fault Fault
	for i, q := range s.queue {
		if q.match.matches(&req) {
			fault = q.fault
			s.queue = append(s.queue[:i:i], s.queue[i+1:]...)
			break
		}
	}
	script := s.script
	declineCode, declined := s.declines[e.Customer]
	s.mu.Unlock()

	if fault.Kind == faultNone && script != nil {
		fault = script(req)
		if !fault.Kind.valid() {
			fault = Fault{}
		}
	}
	if fault.Kind == FaultDecline {
		declined, declineCode = true, orDefault(fault.DeclineCode, defaultDeclineCode)
	} else if declined && fault.Kind == faultNone && ep.pays() {
		fault.Kind = FaultDecline
	}
	if ep == epPayInvoice && r.Form.Get("paid_out_of_band") == "true" {
		// Paid outside Stripe: no card is charged, so none declines.
		declined = false
		if fault.Kind == FaultDecline {
			fault = Fault{}
		}
	}

	switch fault.Kind {
	case FaultRateLimit:
		s.finish(w, &e, rateLimited(), fault)
		return
	case FaultLockTimeout:
		res := errResult(http.StatusTooManyRequests, apiErr{Type: "invalid_request_error", Code: "lock_timeout",
			Message: "This object cannot be accessed right now because another API request or Stripe process is currently accessing it. Please retry this request later."})
		res.shouldRetry = "true"
		s.finish(w, &e, res, fault)
		return
	case FaultInFlight:
		s.finish(w, &e, inUse(key), fault)
		return
	case FaultRefuse:
		status := fault.Status
		if status == 0 {
			status = http.StatusBadRequest
		}
		s.finish(w, &e, errResult(status, fault.Refusal.apiErr()), fault)
		return
	case FaultErrorBefore:
		res := errResult(http.StatusInternalServerError, apiErr{Type: "api_error", Message: "An unknown error occurred while processing the request (injected before execution; nothing was stored)."})
		res.shouldRetry = "true"
		s.finish(w, &e, res, fault)
		return
	}

	var res result
	if ep.writes() {
		if fault.Kind == FaultDecline && !ep.pays() {
			fault = Fault{} // nothing to decline
		}
		var executed bool
		res, executed = s.write(ep, id, acct, r, rid, idem, scoped, key, declined, declineCode, fault)
		if !executed {
			// Faults of execution have no effect on a replay or a rejection.
			if fault.Kind == FaultDecline || fault.Kind == FaultErrorAfter {
				fault = Fault{}
			}
			if fault.Kind == FaultSlow {
				s.hold(fault)
			}
		}
	} else {
		if fault.Kind == FaultDecline {
			fault = Fault{}
		}
		res = s.get(ep, id, acct, r)
		if fault.Kind == FaultErrorAfter {
			res = errResult(http.StatusInternalServerError, apiErr{Type: "api_error", Message: "An unknown error occurred while processing the request."})
			res.shouldRetry = "true"
		}
		if fault.Kind == FaultSlow {
			s.hold(fault)
		}
	}
	s.finish(w, &e, res, fault)
}

// create runs a POST that creates a charge or a payment intent.
func (s *Server) create(ep endpoint, acct string, r *http.Request, rid string, idem bool, scoped, key string, declined bool, declineCode string, fault Fault) (result, bool) {
	intent := ep == epCreateIntent
	p, verr := parseCreate(r.Form, intent)
	return s.idempotent(r, rid, idem, scoped, key, fault, verr, func(now time.Time) (result, bool) {
		if bad := s.bindCustomer(acct, p.Customer); bad != nil {
			return errResult(http.StatusNotFound, *bad), false
		}
		s.objSeq++
		p.Created = now
		p.Account = acct
		p.Period = p.Metadata[s.periodKey]
		if idem {
			p.IdempotencyKey = key
		}
		async, isAsync := s.async[p.Customer]
		isAsync = isAsync && !declined
		if isAsync {
			p.settleAt, p.FailureCode = now.Add(async.After), async.FailureCode
		}
		if intent {
			p.ID = fmt.Sprintf("pi_%014d", s.objSeq)
			p.Object = "payment_intent"
			switch {
			case isAsync && p.confirm:
				p.Status = "processing"
			case declined && p.confirm:
				p.Status, p.DeclineCode = "requires_payment_method", declineCode
			case p.confirm:
				p.Status, p.Paid = "succeeded", true
			case p.PaymentMethod != "":
				p.Status = "requires_confirmation"
			default:
				p.Status = "requires_payment_method"
			}
		} else {
			p.ID = fmt.Sprintf("ch_%014d", s.objSeq)
			p.Object = "charge"
			if isAsync {
				p.Status = "pending"
			} else if declined {
				p.Status, p.DeclineCode = "failed", declineCode
			} else {
				p.Status, p.Paid = "succeeded", true
			}
		}
		stored := p.Payment
		s.payments = append(s.payments, &stored)
		s.byID[stored.ID] = &stored
		if intent && !p.confirm {
			stored.settleAt = time.Time{} // settles only once confirmed, which the fake does not do later
		}
		s.stats.Created++
		if stored.Paid {
			s.count(&stored)
		}
		s.created(&stored)
		res := paymentResult(&stored)
		res.objectID = stored.ID
		return res, true
	})
}

// paymentResult is the answer to a request that made or confirmed p: p,
// or the 402 of its decline.
func paymentResult(p *Payment) result {
	if p.DeclineCode == "" {
		return ok(render(p))
	}
	e := declineErr(p)
	if p.Object == "payment_intent" {
		e.PaymentIntent = renderIntent(p, &e)
	} else {
		e.Charge = p.ID
	}
	return errResult(http.StatusPaymentRequired, e)
}

// declineErr is the card error of p's decline. A PaymentIntent that needs
// its customer to authenticate fails with code authentication_required.
func declineErr(p *Payment) apiErr {
	code := "card_declined"
	if p.Object == "payment_intent" && p.DeclineCode == authenticationRequired {
		code = authenticationRequired
	}
	return apiErr{Type: "card_error", Code: code, DeclineCode: p.DeclineCode, Message: declineMessage(p.DeclineCode)}
}

// authenticationRequired is the decline of a card whose bank wants its
// holder to authenticate the payment (3-D Secure): off-session it fails;
// on session the customer authenticates and it goes through.
const authenticationRequired = "authentication_required"

var confirmParams = map[string]bool{
	"payment_method": true, "off_session": true, "return_url": true, "use_stripe_sdk": true,
	"error_on_requires_action": true, "receipt_email": true, "setup_future_usage": true,
}

// confirmIntent validates POST /v1/payment_intents/{id}/confirm and
// returns how to run it. A PaymentIntent that needs a payment method or a
// confirmation (one declined earlier) is attempted again: on session (no
// off_session=true) its customer authenticates, so an
// authentication_required decline goes through; any other decline of the
// customer declines it again. A customer whose payments settle later
// ([Server.SettleLater]) leaves it processing.
func (s *Server) confirmIntent(acct, id string, form url.Values, declined bool, declineCode string) (*apiErr, func(time.Time) (result, bool)) {
	if bad := unknownParam(form, confirmParams); bad != nil {
		return bad, nil
	}
	offSession, bad := parseBool(form, "off_session")
	if bad != nil {
		return bad, nil
	}
	return nil, func(now time.Time) (result, bool) {
		p := s.payment(acct, id, "payment_intent")
		if p == nil {
			return errResult(http.StatusNotFound, *invalid("intent", "resource_missing", fmt.Sprintf("No such payment_intent: '%s'", id))), false
		}
		switch p.Status {
		case "requires_payment_method", "requires_confirmation", "requires_action":
		default:
			return errResult(http.StatusBadRequest, *invalid("", "payment_intent_unexpected_state",
				fmt.Sprintf("You cannot confirm this PaymentIntent because it has a status of %s.", p.Status))), false
		}
		if pm := form.Get("payment_method"); pm != "" {
			p.PaymentMethod = pm
		}
		if p.PaymentMethod == "" {
			return errResult(http.StatusBadRequest, *invalid("payment_method", "payment_intent_unexpected_state",
				"You cannot confirm this PaymentIntent because it's missing a payment method. Pass payment_method.")), false
		}
		if a, later := s.async[p.Customer]; later && !declined {
			p.Status, p.DeclineCode, p.FailureCode, p.settleAt = "processing", "", a.FailureCode, now.Add(a.After)
			s.emit("payment_intent.processing", p, now)
		} else if declined && (declineCode != authenticationRequired || offSession) {
			p.Status, p.DeclineCode = "requires_payment_method", declineCode
			s.emit("payment_intent.payment_failed", p, now)
		} else {
			p.Status, p.DeclineCode, p.FailureCode, p.Paid = "succeeded", "", "", true
			s.count(p)
			s.emit("payment_intent.succeeded", p, now)
		}
		res := paymentResult(p)
		res.objectID = p.ID
		return res, true
	}
}

// idempotent runs a write under Stripe's idempotency rules, the same for
// every endpoint. A request whose key already has a result gets that
// result back (replayed), or 400 idempotency_error when its endpoint or
// parameters differ, or 409 while the first request is still executing.
// Otherwise verr, the request's validation error, refuses it; then run
// executes it with mu held at the server's time now and returns its
// answer, or executed false for a refusal that depends on the server's
// state (an invoice that is no longer a draft, an identifier already
// used). Refusals store nothing, as Stripe stores nothing for a request
// it rejects before executing it. Once run has executed, the answer is
// stored under the key, FaultErrorAfter's 500 instead of it, and
// FaultSlow holds it before it is stored.
//
// idem is false for a request without a key, and for DELETE: such a
// request executes every time.
func (s *Server) idempotent(r *http.Request, rid string, idem bool, scoped, key string, fault Fault, verr *apiErr, run func(now time.Time) (result, bool)) (res result, executed bool) {
	epName := r.URL.Path // only POSTs carry keys
	sig := signature(r.Form)

	s.mu.Lock()
	now := s.now()
	var ent *idemEntry
	if idem {
		ent = s.keys[scoped]
		if ent.state == stateDone && now.Sub(ent.created) >= s.ttl {
			*ent = idemEntry{attempts: ent.attempts}
		}
		switch ent.state {
		case stateExecuting:
			s.stats.InUse++
			s.mu.Unlock()
			return inUse(key), false
		case stateDone:
			if ent.endpoint != epName {
				s.stats.IdempotencyErrors++
				s.mu.Unlock()
				return errResult(http.StatusBadRequest, apiErr{Type: "idempotency_error", Message: fmt.Sprintf(
					"Keys for idempotent requests can only be used for the same endpoint they were first used for ('%s' vs '%s'). Try using a key other than '%s' if you meant to execute a different request.", ent.endpoint, epName, key)}), false
			}
			if ent.sig != sig {
				s.stats.IdempotencyErrors++
				s.mu.Unlock()
				return errResult(http.StatusBadRequest, apiErr{Type: "idempotency_error", Message: fmt.Sprintf(
					"Keys for idempotent requests can only be used with the same parameters they were first used with. Try using a key other than '%s' if you meant to execute a different request.", key)}), false
			}
			s.stats.Replays++
			res := ent.resp
			res.replayed = true
			s.mu.Unlock()
			return res, false
		}
	}
	if verr != nil {
		s.mu.Unlock()
		return errResult(http.StatusBadRequest, *verr), false
	}
	// Execute: from here on the effect exists whatever the client sees.
	res, executed = run(now)
	if !executed {
		s.mu.Unlock()
		return res, false
	}
	if idem {
		*ent = idemEntry{attempts: ent.attempts, state: stateExecuting, endpoint: epName, sig: sig, created: now}
	}
	s.mu.Unlock()

	if fault.Kind == FaultErrorAfter {
		id := res.objectID
		res = errResult(http.StatusInternalServerError, apiErr{Type: "api_error", Message: "An unknown error occurred while processing the request."})
		res.shouldRetry = "false"
		res.objectID = id
	}
	res.requestID = rid
	if fault.Kind == FaultSlow {
		s.hold(fault)
	}
	if idem {
		s.mu.Lock()
		ent.state, ent.resp = stateDone, res
		s.mu.Unlock()
	}
	return res, true
}

// pays reports whether ep takes a payment that a decline refuses.
func (ep endpoint) pays() bool {
	return ep == epCreateCharge || ep == epCreateIntent || ep == epConfirmIntent || ep == epPayInvoice
}

// write serves the endpoints that change state.
func (s *Server) write(ep endpoint, id, acct string, r *http.Request, rid string, idem bool, scoped, key string, declined bool, declineCode string, fault Fault) (result, bool) {
	var verr *apiErr
	var run func(time.Time) (result, bool)
	ikey := "" // the key a created object records
	if idem {
		ikey = key
	}
	switch ep {
	case epCreateCharge, epCreateIntent:
		return s.create(ep, acct, r, rid, idem, scoped, key, declined, declineCode, fault)
	case epConfirmIntent:
		verr, run = s.confirmIntent(acct, id, r.Form, declined, declineCode)
	case epCancelIntent:
		verr, run = s.cancelIntent(acct, id, r.Form)
	case epCreateMeter:
		verr, run = s.createMeter(acct, r.Form)
	case epCreateMeterEvent:
		verr, run = s.createMeterEvent(acct, r.Form)
	case epCreateInvoice:
		verr, run = s.createInvoice(acct, r.Form)
	case epCreateInvoiceItem:
		verr, run = s.createInvoiceItem(acct, r.Form)
	case epCreateRefund:
		verr, run = s.createRefund(acct, r.Form, ikey)
	case epCreateCreditNote:
		verr, run = s.createCreditNote(acct, r.Form, ikey)
	case epCreateTransfer:
		verr, run = s.createTransfer(acct, r.Form, ikey)
	case epCreatePayout:
		verr, run = s.createPayout(acct, r.Form, ikey)
	case epCreateAccount:
		verr, run = s.createAccount(acct, r.Form)
	case epCreateReversal:
		verr, run = s.createReversal(acct, id, r.Form, ikey)
	default:
		verr, run = s.invoiceAction(acct, ep, id, r.Form, declined, declineCode)
	}
	return s.idempotent(r, rid, idem, scoped, key, fault, verr, run)
}

// get serves the endpoints that read.
func (s *Server) get(ep endpoint, id, acct string, r *http.Request) result {
	switch ep {
	case epListMeters, epGetMeter, epMeterSummaries:
		return s.readMeters(acct, ep, id, r.Form)
	case epGetV2Event:
		return s.readV2Event(acct, id)
	case epGetInvoice, epInvoiceLines, epSearchInvoices:
		return s.readInvoices(acct, ep, id, r.Form)
	case epListInvoices:
		return s.listInvoices(acct, r.Form)
	case epListMoves, epGetMove:
		return s.readMoves(acct, moveObject(r.URL.Path), id, r.Form)
	case epGetBalance:
		return s.readBalance(acct)
	case epListEvents:
		return s.listEvents(acct, r.Form)
	case epListReversals:
		return s.readMoves(acct, "transfer_reversal", id, r.Form)
	}
	return s.read(ep, id, acct, r)
}

// customerOf returns the customer a request is about when its form does
// not name one: the invoice's, or a meter event's payload customer, so
// that the log and [Match] see it. mu is held.
func (s *Server) customerOf(acct string, ep endpoint, id string, form url.Values) string {
	switch {
	case ep == epConfirmIntent || ep == epCancelIntent:
		if p := s.byID[id]; p != nil {
			return p.Customer
		}
	case ep.invoiceEndpoint():
		if inv := s.inv.byID[id]; inv != nil {
			return inv.Customer
		}
	case ep == epCreateMeterEvent:
		return form.Get("payload[" + s.customerKey(acct, form.Get("event_name")) + "]")
	case ep == epCreateCreditNote:
		if inv := s.invoice(acct, form.Get("invoice")); inv != nil {
			return inv.Customer
		}
	case ep == epCreateRefund:
		for _, k := range []string{"charge", "payment_intent"} {
			if p := s.payment(acct, form.Get(k), k); p != nil {
				return p.Customer
			}
		}
	}
	return ""
}

// payment returns the charge or payment intent (object) id on acct, or
// nil when acct has none with that id. mu is held.
func (s *Server) payment(acct, id, object string) *Payment {
	if p := s.byID[id]; p != nil && p.Account == acct && p.Object == object {
		return p
	}
	return nil
}

func ok(v any) result { return result{status: http.StatusOK, body: mustJSON(v)} }

// hold blocks for a FaultSlow: until Release is closed, or for Delay, or
// until the server closes.
func (s *Server) hold(f Fault) {
	if f.Release != nil {
		select {
		case <-f.Release:
		case <-s.closing:
		}
		return
	}
	d := f.Delay
	if d <= 0 {
		d = DefaultSlowDelay
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-s.closing:
	}
}

// finish logs the request, then writes res (or drops the connection): a
// client that has seen the answer, or the cut, finds the request in the log
// and the stats.
func (s *Server) finish(w http.ResponseWriter, e *Entry, res result, fault Fault) {
	h := w.Header()
	if res.shouldRetry != "" {
		h.Set("Stripe-Should-Retry", res.shouldRetry)
	}
	if res.replayed {
		h.Set("Idempotent-Replayed", "true")
		h.Set("Original-Request", res.requestID)
	}
	h.Set("Content-Type", "application/json")
	e.Status, e.Replayed, e.ObjectID, e.Fault = res.status, res.replayed, res.objectID, fault.Kind

	if fault.Kind == FaultDrop || fault.Kind == FaultCut {
		e.Status = 0
	}
	s.mu.Lock()
	e.Time = s.now()
	h.Set("Date", e.Time.UTC().Format(http.TimeFormat)) // Stripe's clock, as Stripe's answers show it
	s.log = append(s.log, *e)
	if fault.Kind != faultNone {
		s.stats.Faults[fault.Kind]++
	}
	if res.status == http.StatusTooManyRequests && fault.Kind != FaultLockTimeout {
		s.stats.RateLimited++
	}
	if fault.Kind == FaultInFlight {
		s.stats.InUse++
	}
	s.mu.Unlock()

	switch fault.Kind {
	case FaultDrop, FaultCut:
		if conn, buf, err := http.NewResponseController(w).Hijack(); err == nil {
			if fault.Kind == FaultCut {
				fmt.Fprintf(buf, "HTTP/1.1 %d %s\r\n", res.status, http.StatusText(res.status))
				h.Set("Content-Length", strconv.Itoa(len(res.body)))
				h.Write(buf)
				buf.WriteString("\r\n")
				buf.Write(res.body[:len(res.body)/2])
				buf.Flush()
			}
			conn.Close()
		}
	default:
		h.Set("Content-Length", strconv.Itoa(len(res.body)))
		w.WriteHeader(res.status)
		w.Write(res.body)
	}
}

func (s *Server) authenticate(r *http.Request) (string, *apiErr) {
	key := ""
	if v, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
		key = strings.TrimSpace(v)
	} else if u, _, ok := r.BasicAuth(); ok {
		key = u
	}
	if key == "" {
		return "", &apiErr{Type: "invalid_request_error", Message: "You did not provide an API key. Send it as 'Authorization: Bearer sk_test_...'."}
	}
	if s.apiKeys != nil && !s.apiKeys[key] {
		return "", &apiErr{Type: "invalid_request_error", Code: "api_key_invalid", Message: "Invalid API Key provided: " + redactKey(key)}
	}
	return key, nil
}

// redactKey keeps a key's kind prefix (such as "sk_test_") and its last four
// characters, as Stripe does.
func redactKey(k string) string {
	if len(k) < 16 {
		return "****"
	}
	prefix := ""
	if i := strings.IndexByte(k, '_'); i > 0 && i < 4 {
		if j := strings.IndexByte(k[i+1:], '_'); j > 0 && j < 5 {
			prefix = k[:i+j+2]
		}
	}
	return prefix + strings.Repeat("*", 8) + k[len(k)-4:]
}

// signature canonicalises a request's parameters for the same-parameters
// check. Order of parameters does not matter; values do.
func signature(form map[string][]string) string {
	keys := make([]string, 0, len(form))
	for k := range form {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k)
		b.WriteByte('=')
		b.WriteString(strings.Join(form[k], "\x00"))
		b.WriteByte('\x01')
	}
	return b.String()
}

func rateLimited() result {
	return errResult(http.StatusTooManyRequests, apiErr{Type: "invalid_request_error", Code: "rate_limit",
		Message: "Too many requests hit the API too quickly. We recommend an exponential backoff of your requests."})
}

func inUse(key string) result {
	return errResult(http.StatusConflict, apiErr{Type: "invalid_request_error", Code: "idempotency_key_in_use",
		Message: fmt.Sprintf("There is currently another in-progress request using this Stripe-Idempotency-Key (%s). Please try again later.", key)})
}

func declineMessage(code string) string {
	switch code {
	case "insufficient_funds":
		return "Your card has insufficient funds."
	case "expired_card":
		return "Your card has expired."
	case "lost_card", "stolen_card", "fraudulent":
		return "Your card was declined."
	case authenticationRequired:
		return "Your card was declined. This transaction requires authentication."
	}
	return "Your card was declined."
}

func mustJSON(v any) []byte {
	b, err := json.Marshal(v)
	if err != nil {
		panic("billingtest: " + err.Error())
	}
	return b
}
