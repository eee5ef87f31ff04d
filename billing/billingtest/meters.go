package billingtest

import (
	"fmt"
	"math"
	"net/http"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// Stripe's limits on meter events, and the fake's defaults.
const (
	defaultIdentifierWindow = 24 * time.Hour
	defaultMeterDelay       = time.Minute
	maxEventAge             = 35 * 24 * time.Hour // timestamps up to 35 days in the past
	maxEventAhead           = 5 * time.Minute     // and 5 minutes in the future
	maxIdentifier           = 100
	maxSampleErrors         = 100
	defaultCustomerKey      = "stripe_customer_id"
	defaultValueKey         = "value"
	errorReportType         = "v1.billing.meter.error_report_triggered"
)

// meterIDs numbers the meters of every Server in the process. Stripe's
// ids are unique across accounts, and two Servers stand for two accounts:
// a meter's id tells one account's meter from another's of the same
// event_name, as at Stripe.
var meterIDs atomic.Uint64

// meter is a billing meter.
type meter struct {
	id, account, displayName, eventName string
	formula                             string // "sum" or "count"
	window                              string // "", "hour" or "day": event_time_window
	customerKey, valueKey               string
	created                             time.Time
}

// meterEvent is an accepted meter event.
type meterEvent struct {
	account, eventName, customer, identifier string
	meterID                                  string // the active meter of eventName at acceptance, if any
	payload                                  map[string]string
	value                                    float64
	timestamp, received                      time.Time
	seq                                      uint64 // order of receipt
	reject                                   string // the error code processing rejects it with; "" when it counts
	processed                                bool
}

// meterState holds the meters and their events. Guarded by Server.mu.
type meterState struct {
	list        []*meter
	byID        map[string]*meter
	events      []*meterEvent // in order of receipt, so of the server's clock
	next        int           // index in events of the first unprocessed event
	perCustomer map[[2]string][]*meterEvent
	idents      map[string]time.Time // account and identifier → when its event was accepted
	reject      map[string]string    // customer → error code (RejectUsage)
	reports     map[string]report    // v2 event id → the event with its data
	delay       time.Duration
	identWindow time.Duration
	seq         uint64
}

func newMeterState(identWindow, delay time.Duration) meterState {
	if identWindow == 0 {
		identWindow = defaultIdentifierWindow
	}
	if delay == 0 {
		delay = defaultMeterDelay
	}
	return meterState{byID: make(map[string]*meter), perCustomer: make(map[[2]string][]*meterEvent),
		idents: make(map[string]time.Time), reject: make(map[string]string), reports: make(map[string]report),
		delay: delay, identWindow: identWindow}
}

// report is a meter error report as GET /v2/core/events/{id} serves it
// to the account it is about.
type report struct {
	account string
	body    []byte
}

// CreateMeter creates an active meter as POST /v1/billing/meters does and
// returns its id. formula is "sum" or "count"; window is "" for none, or
// "hour" or "day" for a meter that keeps only the most recent event of
// each UTC hour or day. The payload keys are stripe_customer_id and value.
// It panics, saying why, if the arguments are invalid or an active meter
// already has eventName.
func (s *Server) CreateMeter(eventName, formula, window string) string {
	form := url.Values{"display_name": {eventName}, "event_name": {eventName}, "default_aggregation[formula]": {formula}}
	if window != "" {
		form.Set("event_time_window", window)
	}
	verr, run := s.createMeter("", form)
	if verr != nil {
		panic(fmt.Sprintf("billingtest: CreateMeter(%q, %q, %q): %s", eventName, formula, window, verr.Message))
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	res, ok := run(s.now())
	if !ok {
		panic(fmt.Sprintf("billingtest: CreateMeter(%q, %q, %q): %s", eventName, formula, window, res.body))
	}
	return res.objectID
}

var meterParams = map[string]bool{
	"display_name": true, "event_name": true, "default_aggregation[formula]": true,
	"customer_mapping[event_payload_key]": true, "customer_mapping[type]": true,
	"value_settings[event_payload_key]": true, "event_time_window": true,
}

// createMeter validates POST /v1/billing/meters and returns how to run it.
func (s *Server) createMeter(acct string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	if bad := unknownParam(form, meterParams); bad != nil {
		return bad, nil
	}
	m := &meter{displayName: form.Get("display_name"), eventName: form.Get("event_name"),
		formula: form.Get("default_aggregation[formula]"), window: form.Get("event_time_window"),
		customerKey: orDefault(form.Get("customer_mapping[event_payload_key]"), defaultCustomerKey),
		valueKey:    orDefault(form.Get("value_settings[event_payload_key]"), defaultValueKey)}
	for _, p := range []struct{ name, v string }{{"display_name", m.displayName}, {"event_name", m.eventName}, {"default_aggregation[formula]", m.formula}} {
		if p.v == "" {
			return invalid(p.name, "parameter_missing", "Missing required param: "+p.name+"."), nil
		}
	}
	if m.formula != "sum" && m.formula != "count" {
		return invalid("default_aggregation[formula]", "parameter_invalid_string", fmt.Sprintf("Invalid formula %q: use sum or count.", m.formula)), nil
	}
	if m.window != "" && m.window != "hour" && m.window != "day" {
		return invalid("event_time_window", "parameter_invalid_string", fmt.Sprintf("Invalid event_time_window %q: use hour or day.", m.window)), nil
	}
	if t := form.Get("customer_mapping[type]"); t != "" && t != "by_id" {
		return invalid("customer_mapping[type]", "parameter_invalid_string", fmt.Sprintf("Invalid customer_mapping[type] %q: use by_id.", t)), nil
	}
	return nil, func(now time.Time) (result, bool) {
		if s.activeMeter(acct, m.eventName) != nil {
			return errResult(http.StatusBadRequest, *invalid("event_name", "",
				fmt.Sprintf("An active meter with event_name %q already exists.", m.eventName))), false
		}
		s.objSeq++ // the server's other objects keep their numbers
		m.id = fmt.Sprintf("mtr_%014d", meterIDs.Add(1))
		m.account = acct
		m.created = now
		s.meters.list = append(s.meters.list, m)
		s.meters.byID[m.id] = m
		s.stats.Created++
		res := ok(m.render())
		res.objectID = m.id
		return res, true
	}
}

// activeMeter returns acct's active meter of eventName, or nil; mu is
// held. The fake has no endpoint to deactivate a meter: every meter is
// active.
func (s *Server) activeMeter(acct, eventName string) *meter {
	for _, m := range s.meters.list {
		if m.account == acct && m.eventName == eventName {
			return m
		}
	}
	return nil
}

// customerKey is the payload key that names the customer of eventName's
// events; mu is held.
func (s *Server) customerKey(acct, eventName string) string {
	if m := s.activeMeter(acct, eventName); m != nil {
		return m.customerKey
	}
	return defaultCustomerKey
}

func (m *meter) render() map[string]any {
	var window any
	if m.window != "" {
		window = m.window
	}
	return map[string]any{"id": m.id, "object": "billing.meter", "created": m.created.Unix(),
		"customer_mapping":    map[string]any{"event_payload_key": m.customerKey, "type": "by_id"},
		"default_aggregation": map[string]any{"formula": m.formula},
		"display_name":        m.displayName, "event_name": m.eventName, "event_time_window": window,
		"livemode": false, "status": "active", "status_transitions": map[string]any{"deactivated_at": nil},
		"updated": m.created.Unix(), "value_settings": map[string]any{"event_payload_key": m.valueKey}}
}

// createMeterEvent validates POST /v1/billing/meter_events and returns how
// to run it.
func (s *Server) createMeterEvent(acct string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	ev := &meterEvent{account: acct, eventName: form.Get("event_name"), identifier: form.Get("identifier"), payload: map[string]string{}}
	for k := range form {
		if pk, ok := strings.CutPrefix(k, "payload["); ok && strings.HasSuffix(pk, "]") {
			ev.payload[strings.TrimSuffix(pk, "]")] = form.Get(k)
			continue
		}
		switch k {
		case "event_name", "identifier", "timestamp":
		default:
			if k != "expand" && !strings.HasPrefix(k, "expand[") {
				return invalid(k, "parameter_unknown", "Received unknown parameter: "+k), nil
			}
		}
	}
	if ev.eventName == "" {
		return invalid("event_name", "parameter_missing", "Missing required param: event_name."), nil
	}
	if len(ev.payload) == 0 {
		return invalid("payload", "parameter_missing", "Missing required param: payload."), nil
	}
	if len(ev.identifier) > maxIdentifier {
		return invalid("identifier", "parameter_invalid_string", fmt.Sprintf("identifier is %d characters; the limit is %d.", len(ev.identifier), maxIdentifier)), nil
	}
	var ts int64
	hasTS := form.Get("timestamp") != ""
	if hasTS {
		var err error
		if ts, err = strconv.ParseInt(form.Get("timestamp"), 10, 64); err != nil {
			return invalid("timestamp", "parameter_invalid_integer", "Invalid integer: "+form.Get("timestamp")), nil
		}
	}
	return nil, func(now time.Time) (result, bool) {
		s.processMeterEvents(false)
		ev.timestamp = now.Truncate(time.Second)
		if hasTS {
			ev.timestamp = time.Unix(ts, 0)
			if ev.timestamp.Before(now.Add(-maxEventAge)) {
				return errResult(http.StatusBadRequest, *invalid("timestamp", "timestamp_too_far_in_past",
					fmt.Sprintf("The timestamp %d is more than 35 days in the past.", ts))), false
			}
			if ev.timestamp.After(now.Add(maxEventAhead)) {
				return errResult(http.StatusBadRequest, *invalid("timestamp", "timestamp_in_future",
					fmt.Sprintf("The timestamp %d is more than 5 minutes in the future.", ts))), false
			}
		}
		ckey, vkey := defaultCustomerKey, defaultValueKey
		m := s.activeMeter(acct, ev.eventName)
		if m != nil {
			ev.meterID, ckey, vkey = m.id, m.customerKey, m.valueKey
		}
		ev.value = 1
		if raw, ok := ev.payload[vkey]; ok {
			v, err := strconv.ParseFloat(raw, 64)
			if err != nil || math.IsNaN(v) || math.IsInf(v, 0) {
				return errResult(http.StatusBadRequest, *invalid("payload["+vkey+"]", "parameter_invalid_string",
					fmt.Sprintf("The value %q under payload key %q is not a number.", raw, vkey))), false
			}
			ev.value = v
		}
		s.meters.seq++
		ev.seq = s.meters.seq
		if ev.identifier == "" {
			ev.identifier = fmt.Sprintf("fake-%014d", ev.seq)
		}
		ident := acct + "\x00" + ev.identifier
		if at, taken := s.meters.idents[ident]; taken && now.Sub(at) < s.meters.identWindow {
			return errResult(http.StatusBadRequest, apiErr{Type: "invalid_request_error",
				Message: fmt.Sprintf("An event already exists with identifier %s.", ev.identifier)}), false
		}
		ev.customer = ev.payload[ckey]
		ev.received = now
		switch {
		case m == nil:
			ev.reject = "no_meter"
		case ev.customer == "":
			ev.reject = "meter_event_no_customer_defined"
		case s.bindCustomer(acct, ev.customer) != nil:
			ev.reject = "meter_event_customer_not_found" // a customer of another account
		default:
			ev.reject = s.meters.reject[ev.customer]
		}
		s.meters.idents[ident] = now
		s.meters.events = append(s.meters.events, ev)
		k := [2]string{ev.eventName, ev.customer}
		s.meters.perCustomer[k] = append(s.meters.perCustomer[k], ev)
		s.stats.Created++
		return ok(map[string]any{"object": "billing.meter_event", "created": now.Unix(), "event_name": ev.eventName,
			"identifier": ev.identifier, "livemode": false, "payload": ev.payload, "timestamp": ev.timestamp.Unix()}), true
	}
}

// RejectUsage makes the meter events of customer accepted later fail at
// processing with the error code code (such as
// meter_event_customer_not_found): they are answered 200 when sent, never
// counted, and reported in a meter error report event. An empty code
// accepts the customer's events again.
func (s *Server) RejectUsage(customer, code string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if code == "" {
		delete(s.meters.reject, customer)
		return
	}
	s.meters.reject[customer] = code
}

// AggregateNow processes every accepted meter event now, without waiting
// for Config.MeterDelay, and returns how many it processed.
func (s *Server) AggregateNow() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.processMeterEvents(true)
}

// processMeterEvents processes the events due on the server's clock, or
// all of them: accepted events join their meter's summaries, rejected ones
// are gathered into error reports, one per meter. mu is held.
func (s *Server) processMeterEvents(all bool) int {
	ms := &s.meters
	now := s.now()
	start := ms.next
	for ms.next < len(ms.events) {
		ev := ms.events[ms.next]
		if !all && now.Sub(ev.received) < ms.delay {
			break
		}
		ev.processed = true
		ms.next++
	}
	done := ms.events[start:ms.next]
	type group struct{ account, meterID string }
	byMeter := map[group][]*meterEvent{}
	var order []group
	for _, ev := range done {
		if ev.reject == "" {
			continue
		}
		g := group{ev.account, ev.meterID}
		if _, seen := byMeter[g]; !seen {
			order = append(order, g)
		}
		byMeter[g] = append(byMeter[g], ev)
	}
	for _, g := range order {
		// Stripe validates events as they come, and each report is about
		// the events of a short validation window: events received further
		// apart than the delay (or before a jump of the clock) are in
		// reports of their own.
		evs := byMeter[g]
		for len(evs) > 0 {
			n := 1
			for n < len(evs) && evs[n].received.Sub(evs[n-1].received) < ms.delay {
				n++
			}
			s.errorReport(g.account, g.meterID, evs[:n], now)
			evs = evs[n:]
		}
	}
	return len(done)
}

// errorReport emits a v1.billing.meter.error_report_triggered event for
// the rejected events of one meter of acct ("" for events with no meter),
// in Stripe's v2 thin-event shape (its context naming a connected
// account), and keeps the full event for GET /v2/core/events/{id}. Its validation window runs from the first event's
// receipt to the time the last one was due for processing (Config.MeterDelay
// after its receipt), or now if that is sooner. mu is held.
func (s *Server) errorReport(acct, meterID string, evs []*meterEvent, now time.Time) {
	type sample struct {
		Message string            `json:"error_message"`
		Request map[string]string `json:"request"`
	}
	type errType struct {
		Code    string   `json:"code"`
		Count   int      `json:"error_count"`
		Samples []sample `json:"sample_errors"`
	}
	var types []*errType
	byCode := map[string]*errType{}
	for _, ev := range evs {
		t := byCode[ev.reject]
		if t == nil {
			t = &errType{Code: ev.reject}
			byCode[ev.reject] = t
			types = append(types, t)
		}
		t.Count++
		if len(t.Samples) < maxSampleErrors {
			t.Samples = append(t.Samples, sample{rejectMessage(ev), map[string]string{"identifier": ev.identifier}})
		}
	}
	s.evSeq++
	id := fmt.Sprintf("evt_%014d", s.evSeq)
	var related any
	if meterID != "" {
		related = map[string]any{"id": meterID, "type": "billing.meter", "url": "/v1/billing/meters/" + meterID}
	}
	thin := map[string]any{"id": id, "object": "v2.core.event", "type": errorReportType,
		"created": now.UTC().Format(time.RFC3339Nano), "livemode": false, "related_object": related}
	if acct != "" {
		thin["context"] = acct
	}
	body := mustJSON(thin)
	thin["data"] = map[string]any{
		"developer_message_summary": fmt.Sprintf("%d meter events were rejected.", len(evs)),
		"reason":                    map[string]any{"error_count": len(evs), "error_types": types},
		"validation_start":          evs[0].received.UTC().Format(time.RFC3339),
		"validation_end":            minTime(now, evs[len(evs)-1].received.Add(s.meters.delay)).UTC().Format(time.RFC3339),
	}
	s.meters.reports[id] = report{acct, mustJSON(thin)}
	s.events = append(s.events, Event{ID: id, Type: errorReportType, ObjectID: meterID, Account: acct, Created: now, Body: body})
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func rejectMessage(ev *meterEvent) string {
	switch ev.reject {
	case "no_meter":
		return fmt.Sprintf("No active meter was found for event_name %q.", ev.eventName)
	case "meter_event_no_customer_defined":
		return "The event's payload names no customer."
	case "meter_event_customer_not_found":
		return fmt.Sprintf("No such customer: '%s'.", ev.customer)
	}
	return fmt.Sprintf("The event for customer %s was rejected (%s).", ev.customer, ev.reject)
}

// readV2Event serves GET /v2/core/events/{id}: the meter error reports
// of acct.
func (s *Server) readV2Event(acct, id string) result {
	s.mu.Lock()
	s.processMeterEvents(false)
	rep, found := s.meters.reports[id]
	body := rep.body
	s.mu.Unlock()
	if !found || rep.account != acct {
		return errResult(http.StatusNotFound, *invalid("id", "resource_missing", fmt.Sprintf("No such event: '%s'", id)))
	}
	return result{status: http.StatusOK, body: body, objectID: id}
}

// readMeters serves the meter GETs: list, by id, event summaries.
func (s *Server) readMeters(acct string, ep endpoint, id string, form url.Values) result {
	limit, bad := parseLimit(form)
	if bad != nil {
		return errResult(http.StatusBadRequest, *bad)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.processMeterEvents(false)
	if ep == epListMeters {
		if st := form.Get("status"); st != "" && st != "active" && st != "inactive" {
			return errResult(http.StatusBadRequest, *invalid("status", "parameter_invalid_string", "Invalid status: use active or inactive."))
		}
		var items []listItem
		if form.Get("status") != "inactive" {
			for i := len(s.meters.list) - 1; i >= 0; i-- {
				if m := s.meters.list[i]; m.account == acct {
					items = append(items, listItem{m.id, m.render()})
				}
			}
		}
		return listResult("/v1/billing/meters", items, limit, form.Get("starting_after"))
	}
	m := s.meters.byID[id]
	if m == nil || m.account != acct {
		return missing("id", "billing meter", id)
	}
	if ep == epGetMeter {
		return result{status: http.StatusOK, body: mustJSON(m.render()), objectID: id}
	}

	customer := form.Get("customer")
	if customer == "" {
		return errResult(http.StatusBadRequest, *invalid("customer", "parameter_missing", "Missing required param: customer."))
	}
	if bad := s.customerHere(acct, customer); bad != nil {
		return errResult(http.StatusNotFound, *bad)
	}
	var bounds [2]int64
	for i, p := range []string{"start_time", "end_time"} {
		raw := form.Get(p)
		if raw == "" {
			return errResult(http.StatusBadRequest, *invalid(p, "parameter_missing", "Missing required param: "+p+"."))
		}
		n, err := strconv.ParseInt(raw, 10, 64)
		if err != nil {
			return errResult(http.StatusBadRequest, *invalid(p, "parameter_invalid_integer", "Invalid integer: "+raw))
		}
		bounds[i] = n
	}
	group := form.Get("value_grouping_window")
	if group != "" && group != "hour" && group != "day" {
		return errResult(http.StatusBadRequest, *invalid("value_grouping_window", "parameter_invalid_string", "Invalid value_grouping_window: use hour or day."))
	}
	align, unit := int64(60), "minute"
	for _, w := range []string{group, m.window} {
		if w == "hour" && align < 3600 {
			align, unit = 3600, "hour"
		}
		if w == "day" {
			align, unit = 86400, "day"
		}
	}
	for i, p := range []string{"start_time", "end_time"} {
		if bounds[i]%align != 0 {
			return errResult(http.StatusBadRequest, *invalid(p, "parameter_invalid_integer",
				fmt.Sprintf("%s %d is not aligned to a%s %s boundary.", p, bounds[i], map[bool]string{true: "n", false: ""}[unit == "hour"], unit)))
		}
	}
	if bounds[1] <= bounds[0] {
		return errResult(http.StatusBadRequest, *invalid("end_time", "parameter_invalid_integer", "end_time must be after start_time."))
	}
	step := bounds[1] - bounds[0]
	switch group {
	case "hour":
		step = 3600
	case "day":
		step = 86400
	}
	evs := s.meters.perCustomer[[2]string{m.eventName, customer}]
	var items []listItem
	for t := bounds[0]; t < bounds[1]; t += step {
		end := min(t+step, bounds[1])
		v := aggregate(m, evs, time.Unix(t, 0), time.Unix(end, 0), true)
		sid := fmt.Sprintf("mtrusg_%s_%d", strings.TrimPrefix(m.id, "mtr_"), t)
		items = append(items, listItem{sid, map[string]any{"id": sid, "object": "billing.meter_event_summary",
			"aggregated_value": v, "start_time": t, "end_time": end, "livemode": false, "meter": m.id}})
	}
	return listResult("/v1/billing/meters/"+m.id+"/event_summaries", items, limit, form.Get("starting_after"))
}

// aggregate is m's value over the events of one customer whose timestamp
// is in [start, end): processed ones only, or all that count (the ledger).
// A meter with an event time window keeps the most recent event of each
// UTC window (ties: the later received).
func aggregate(m *meter, evs []*meterEvent, start, end time.Time, processedOnly bool) float64 {
	var kept []*meterEvent
	latest := map[int64]*meterEvent{}
	for _, ev := range evs {
		if ev.reject != "" || (processedOnly && !ev.processed) || ev.meterID != m.id ||
			ev.timestamp.Before(start) || !ev.timestamp.Before(end) {
			continue
		}
		if m.window == "" {
			kept = append(kept, ev)
			continue
		}
		w := windowStart(ev.timestamp, m.window)
		if cur := latest[w]; cur == nil || ev.timestamp.After(cur.timestamp) || (ev.timestamp.Equal(cur.timestamp) && ev.seq > cur.seq) {
			latest[w] = ev
		}
	}
	for _, ev := range latest {
		kept = append(kept, ev)
	}
	if m.formula == "count" {
		return float64(len(kept))
	}
	sort.Slice(kept, func(i, j int) bool { return kept[i].seq < kept[j].seq }) // a stable float sum
	sum := 0.0
	for _, ev := range kept {
		sum += ev.value
	}
	return sum
}

func windowStart(t time.Time, window string) int64 {
	if window == "day" {
		return t.UTC().Truncate(24 * time.Hour).Unix()
	}
	return t.UTC().Truncate(time.Hour).Unix()
}

// MeterTotal returns what the active meter of eventName, on the account
// customer lives on, counts for customer over events timestamped in
// [start, end), aggregated as the meter does (sum, count, or the most
// recent event of each window), over every event accepted and not
// rejected, processed or not. With no meter for eventName it returns 0.
// This is the exactly-once oracle for usage.
func (s *Server) MeterTotal(eventName, customer string, start, end time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	m := s.activeMeter(s.connect.customers[customer], eventName)
	if m == nil {
		return 0
	}
	return aggregate(m, s.meters.perCustomer[[2]string{eventName, customer}], start, end, false)
}

// MeterEvents returns how many meter events of eventName for customer were
// accepted and not rejected, processed or not.
func (s *Server) MeterEvents(eventName, customer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, ev := range s.meters.perCustomer[[2]string{eventName, customer}] {
		if ev.reject == "" {
			n++
		}
	}
	return n
}

// listItem is one element of a list answer: its id, for starting_after,
// and its JSON.
type listItem struct {
	id  string
	obj any
}

// listResult pages items, in the order given, as Stripe's list answers:
// at most limit after the item whose id is startingAfter. mu may be held.
func listResult(url string, items []listItem, limit int, startingAfter string) result {
	return ok(listPage(url, items, limit, startingAfter))
}

func listPage(url string, items []listItem, limit int, startingAfter string) map[string]any {
	i := 0
	if startingAfter != "" {
		for i < len(items) && items[i].id != startingAfter {
			i++
		}
		i++
	}
	data := []any{}
	for ; i < len(items) && len(data) < limit; i++ {
		data = append(data, items[i].obj)
	}
	return map[string]any{"object": "list", "data": data, "has_more": i < len(items), "url": url}
}

// parseLimit reads a list's limit: 1 to 100, 10 by default.
func parseLimit(form url.Values) (int, *apiErr) {
	raw := form.Get("limit")
	if raw == "" {
		return 10, nil
	}
	n, err := strconv.Atoi(raw)
	if err != nil || n < 1 || n > 100 {
		return 0, invalid("limit", "parameter_invalid_integer", "limit must be an integer between 1 and 100.")
	}
	return n, nil
}

// unknownParam refuses the first parameter that is not allowed, expand
// aside.
func unknownParam(form url.Values, allowed map[string]bool) *apiErr {
	for k := range form {
		if !allowed[k] && k != "expand" && !strings.HasPrefix(k, "expand[") {
			return invalid(k, "parameter_unknown", "Received unknown parameter: "+k)
		}
	}
	return nil
}
