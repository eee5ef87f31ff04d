package billingtest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

func meterEvent(eventName, customer, value, identifier, key string) *stripe.BillingMeterEventParams {
	p := &stripe.BillingMeterEventParams{EventName: stripe.String(eventName),
		Payload: map[string]string{"stripe_customer_id": customer}}
	if value != "" {
		p.Payload["value"] = value
	}
	if identifier != "" {
		p.Identifier = stripe.String(identifier)
	}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

// summaries lists the summaries of meter for customer over [start, end).
func summaries(t *testing.T, api *client.API, meter, customer string, start, end time.Time, group string) ([]float64, error) {
	t.Helper()
	p := &stripe.BillingMeterEventSummaryListParams{ID: stripe.String(meter), Customer: stripe.String(customer),
		StartTime: stripe.Int64(start.Unix()), EndTime: stripe.Int64(end.Unix())}
	if group != "" {
		p.ValueGroupingWindow = stripe.String(group)
	}
	var out []float64
	it := api.BillingMeterEventSummaries.List(p)
	for it.Next() {
		out = append(out, it.BillingMeterEventSummary().AggregatedValue)
	}
	return out, it.Err()
}

func TestMeterCreateGetAndList(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)

	p := &stripe.BillingMeterParams{DisplayName: stripe.String("API calls"), EventName: stripe.String("api_calls"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")},
		EventTimeWindow:    stripe.String("day")}
	m, err := api.BillingMeters.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(m.ID, "mtr_") || m.Object != "billing.meter" || m.Status != "active" || m.EventTimeWindow != "day" ||
		m.CustomerMapping.EventPayloadKey != "stripe_customer_id" || m.ValueSettings.EventPayloadKey != "value" {
		t.Fatalf("meter = %+v", m)
	}
	if got, err := api.BillingMeters.Get(m.ID, nil); err != nil || got.EventName != "api_calls" || got.DefaultAggregation.Formula != "sum" {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	_, err = api.BillingMeters.New(p)
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Param != "event_name" {
		t.Fatalf("second meter for api_calls: %+v; want 400 on event_name", se)
	}
	id2 := srv.CreateMeter("seats", "count", "")
	var ids []string
	for it := api.BillingMeters.List(&stripe.BillingMeterListParams{Status: stripe.String("active")}); it.Next(); {
		ids = append(ids, it.BillingMeter().ID)
	}
	if !slices.Equal(ids, []string{id2, m.ID}) {
		t.Fatalf("active meters = %v; want [%s %s], newest first", ids, id2, m.ID)
	}
	if it := api.BillingMeters.List(&stripe.BillingMeterListParams{Status: stripe.String("inactive")}); it.Next() {
		t.Fatalf("inactive meters: %v; want none", it.BillingMeter().ID)
	}
}

func TestMeterEventIdentifierIsUniqueWithinTheWindow(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{IdentifierWindow: time.Hour})
	api := newAPI(t, srv, testKey, nil)
	srv.CreateMeter("api_calls", "sum", "")

	ev, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "5", "cus_1-2026-09-01T10", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if ev.Identifier != "cus_1-2026-09-01T10" || ev.Object != "billing.meter_event" || ev.Payload["value"] != "5" {
		t.Fatalf("event = %+v", ev)
	}
	// Another idempotency key, the same identifier: refused, and not to retry.
	form := url.Values{"event_name": {"api_calls"}, "payload[stripe_customer_id]": {"cus_1"}, "payload[value]": {"5"},
		"identifier": {"cus_1-2026-09-01T10"}}
	resp, body := do(t, srv, http.MethodPost, "/v1/billing/meter_events", "k2", form)
	var e struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(body, &e); err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != 400 || e.Error.Type != "invalid_request_error" ||
		e.Error.Message != "An event already exists with identifier cus_1-2026-09-01T10." {
		t.Fatalf("duplicate identifier: %d %s", resp.StatusCode, body)
	}
	if h := resp.Header.Get("Stripe-Should-Retry"); h != "" {
		t.Fatalf("duplicate identifier: Stripe-Should-Retry %q; want none", h)
	}
	// Through stripe-go too, with no key at all.
	_, err = api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "5", "cus_1-2026-09-01T10", ""))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest {
		t.Fatalf("duplicate identifier through stripe-go: %+v", se)
	}
	if n := srv.MeterEvents("api_calls", "cus_1"); n != 1 {
		t.Fatalf("MeterEvents = %d inside the window; want 1", n)
	}

	srv.Advance(time.Hour)
	if _, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "5", "cus_1-2026-09-01T10", "k3")); err != nil {
		t.Fatalf("identifier after the window: %v; want it free again", err)
	}
	if n := srv.MeterEvents("api_calls", "cus_1"); n != 2 {
		t.Fatalf("MeterEvents = %d after the window; want 2", n)
	}
}

func TestMeterEventValidation(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	srv.CreateMeter("api_calls", "sum", "")
	now := srv.Now()

	for _, tc := range []struct {
		name  string
		p     *stripe.BillingMeterEventParams
		param string
	}{
		{"timestamp 36 days ago", func() *stripe.BillingMeterEventParams {
			p := meterEvent("api_calls", "cus_1", "1", "", "")
			p.Timestamp = stripe.Int64(now.Add(-36 * 24 * time.Hour).Unix())
			return p
		}(), "timestamp"},
		{"timestamp 6 minutes ahead", func() *stripe.BillingMeterEventParams {
			p := meterEvent("api_calls", "cus_1", "1", "", "")
			p.Timestamp = stripe.Int64(now.Add(6 * time.Minute).Unix())
			return p
		}(), "timestamp"},
		{"value not a number", meterEvent("api_calls", "cus_1", "ten", "", ""), "payload[value]"},
		{"identifier of 101 characters", meterEvent("api_calls", "cus_1", "1", strings.Repeat("x", 101), ""), "identifier"},
		{"no event_name", meterEvent("", "cus_1", "1", "", ""), "event_name"},
	} {
		_, err := api.BillingMeterEvents.New(tc.p)
		if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest || se.Param != tc.param {
			t.Errorf("%s: %+v; want 400 invalid_request_error on %s", tc.name, se, tc.param)
		}
	}
	// The limits themselves are accepted.
	ok := meterEvent("api_calls", "cus_1", "1.5", strings.Repeat("x", 100), "")
	ok.Timestamp = stripe.Int64(now.Add(-34 * 24 * time.Hour).Unix())
	if _, err := api.BillingMeterEvents.New(ok); err != nil {
		t.Fatalf("event at the limits: %v", err)
	}
	if n := srv.MeterEvents("api_calls", "cus_1"); n != 1 {
		t.Fatalf("MeterEvents = %d; want 1, the refused ones uncounted", n)
	}
}

func TestMeterEventIdempotency(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	srv.CreateMeter("api_calls", "sum", "")

	first, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "5", "", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "5", "", "k1"))
	if err != nil {
		t.Fatal(err)
	}
	if again.LastResponse.Header.Get("Idempotent-Replayed") != "true" || again.Identifier != first.Identifier {
		t.Fatalf("replay: identifier %q (first %q), Idempotent-Replayed %q", again.Identifier, first.Identifier,
			again.LastResponse.Header.Get("Idempotent-Replayed"))
	}
	_, err = api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "6", "", "k1"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeIdempotency {
		t.Fatalf("same key, other value: %+v; want idempotency_error", se)
	}

	srv.FailNext(billingtest.Match{IdempotencyKey: "k2"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err = api.BillingMeterEvents.New(meterEvent("api_calls", "cus_2", "5", "", "k2")); err == nil {
		t.Fatal("FaultErrorBefore: no error")
	}
	if n := srv.MeterEvents("api_calls", "cus_2"); n != 0 {
		t.Fatalf("after FaultErrorBefore MeterEvents = %d; want 0", n)
	}
	srv.FailNext(billingtest.Match{IdempotencyKey: "k3"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	for range 2 {
		_, err = api.BillingMeterEvents.New(meterEvent("api_calls", "cus_3", "5", "", "k3"))
		if se := stripeErr(t, err); se.HTTPStatusCode != 500 {
			t.Fatalf("FaultErrorAfter and its replay: %+v; want the stored 500", se)
		}
	}
	srv.FailNext(billingtest.Match{Customer: "cus_4"}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err = api.BillingMeterEvents.New(meterEvent("api_calls", "cus_4", "5", "", "k4")); err == nil {
		t.Fatal("FaultCut: no error")
	}
	if got, want := []int{srv.MeterEvents("api_calls", "cus_1"), srv.MeterEvents("api_calls", "cus_3"), srv.MeterEvents("api_calls", "cus_4")}, []int{1, 1, 1}; !slices.Equal(got, want) {
		t.Fatalf("MeterEvents of cus_1, cus_3, cus_4 = %v; want %v", got, want)
	}
	var replayed, faulted int
	for _, e := range srv.Log() {
		if e.Path == "/v1/billing/meter_events" && e.Replayed {
			replayed++
		}
		if e.Path == "/v1/billing/meter_events" && e.Fault != "" {
			faulted++
		}
	}
	if replayed != 2 || faulted != 3 {
		t.Fatalf("log: %d replays, %d faults; want 2 and 3", replayed, faulted)
	}
}

func TestMeterAggregatesOnlyAfterProcessing(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{MeterDelay: 2 * time.Minute})
	api := newAPI(t, srv, testKey, nil)
	m := srv.CreateMeter("api_calls", "sum", "")
	start := srv.Now().Truncate(time.Minute).Add(-10 * time.Minute)
	end := start.Add(time.Hour)

	for i, v := range []string{"3", "4", ""} { // no value counts 1
		if _, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", v, fmt.Sprint("e", i), "")); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := summaries(t, api, m, "cus_1", start, end, ""); err != nil || !slices.Equal(got, []float64{0}) {
		t.Fatalf("summaries right after sending = %v, %v; want [0]", got, err)
	}
	if got := srv.MeterTotal("api_calls", "cus_1", start, end); got != 8 {
		t.Fatalf("MeterTotal = %v; want 8 before processing too", got)
	}
	srv.Advance(time.Minute)
	if got, _ := summaries(t, api, m, "cus_1", start, end, ""); !slices.Equal(got, []float64{0}) {
		t.Fatalf("summaries before MeterDelay = %v; want [0]", got)
	}
	srv.Advance(time.Minute)
	if got, _ := summaries(t, api, m, "cus_1", start, end, ""); !slices.Equal(got, []float64{8}) {
		t.Fatalf("summaries after MeterDelay = %v; want [8]", got)
	}

	if _, err := api.BillingMeterEvents.New(meterEvent("api_calls", "cus_1", "10", "", "")); err != nil {
		t.Fatal(err)
	}
	if n := srv.AggregateNow(); n != 1 {
		t.Fatalf("AggregateNow = %d; want 1", n)
	}
	if got, _ := summaries(t, api, m, "cus_1", start, end, ""); !slices.Equal(got, []float64{18}) {
		t.Fatalf("summaries after AggregateNow = %v; want [18]", got)
	}
	if got, _ := summaries(t, api, m, "cus_2", start, end, ""); !slices.Equal(got, []float64{0}) {
		t.Fatalf("another customer's summaries = %v; want [0]", got)
	}
}

func TestWindowedMeterKeepsTheLatestEventOfEachWindow(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	m := srv.CreateMeter("seats", "sum", "hour")
	count := srv.CreateMeter("logins", "count", "")
	h := srv.Now().UTC().Truncate(time.Hour).Add(-3 * time.Hour)

	send := func(name, value string, at time.Time) {
		t.Helper()
		p := meterEvent(name, "cus_1", value, "", "")
		p.Timestamp = stripe.Int64(at.Unix())
		if _, err := api.BillingMeterEvents.New(p); err != nil {
			t.Fatal(err)
		}
	}
	send("seats", "10", h.Add(10*time.Minute))
	send("seats", "25", h.Add(20*time.Minute)) // the latest of hour h
	send("seats", "15", h.Add(5*time.Minute))  // received later, but older
	send("seats", "3", h.Add(time.Hour+time.Minute))
	send("seats", "7", h.Add(time.Hour+time.Minute)) // same timestamp, received later: kept
	for range 3 {
		send("logins", "", h.Add(time.Minute))
	}
	srv.AggregateNow()

	if got, _ := summaries(t, api, m, "cus_1", h, h.Add(2*time.Hour), ""); !slices.Equal(got, []float64{32}) {
		t.Fatalf("summary over both hours = %v; want [32]", got)
	}
	if got, _ := summaries(t, api, m, "cus_1", h, h.Add(2*time.Hour), "hour"); !slices.Equal(got, []float64{25, 7}) {
		t.Fatalf("hourly summaries = %v; want [25 7]", got)
	}
	if got := srv.MeterTotal("seats", "cus_1", h, h.Add(2*time.Hour)); got != 32 {
		t.Fatalf("MeterTotal = %v; want 32", got)
	}
	if n := srv.MeterEvents("seats", "cus_1"); n != 5 {
		t.Fatalf("MeterEvents = %d; want every accepted event, 5", n)
	}
	if got, _ := summaries(t, api, count, "cus_1", h, h.Add(time.Hour), ""); !slices.Equal(got, []float64{3}) {
		t.Fatalf("count meter = %v; want [3]", got)
	}
}

func TestSummariesRefuseUnalignedTimes(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	plain := srv.CreateMeter("api_calls", "sum", "")
	hourly := srv.CreateMeter("seats", "sum", "hour")
	day := srv.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)

	for _, tc := range []struct {
		name       string
		meter      string
		start, end time.Time
		group      string
		param      string
	}{
		{"start between minutes", plain, day.Add(30 * time.Second), day.Add(time.Hour), "", "start_time"},
		{"end between minutes", plain, day, day.Add(time.Hour + time.Second), "", "end_time"},
		{"minutes on an hourly meter", hourly, day.Add(time.Minute), day.Add(time.Hour), "", "start_time"},
		{"hours with a daily grouping", plain, day.Add(time.Hour), day.Add(24 * time.Hour), "day", "start_time"},
		{"end before start", plain, day.Add(time.Hour), day, "", "end_time"},
	} {
		_, err := summaries(t, api, tc.meter, "cus_1", tc.start, tc.end, tc.group)
		if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Param != tc.param {
			t.Errorf("%s: %+v; want 400 on %s", tc.name, se, tc.param)
		}
	}
	if _, err := summaries(t, api, hourly, "cus_1", day, day.Add(time.Hour), "hour"); err != nil {
		t.Fatalf("aligned request: %v", err)
	}
}

func TestRejectedEventsProduceAnErrorReport(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	m := srv.CreateMeter("api_calls", "sum", "")
	srv.RejectUsage("cus_gone", "meter_event_customer_not_found")

	for _, p := range []*stripe.BillingMeterEventParams{
		meterEvent("api_calls", "cus_gone", "5", "gone-1", ""),
		meterEvent("api_calls", "cus_gone", "5", "gone-2", ""),
		meterEvent("api_calls", "cus_1", "5", "fine-1", ""),
		meterEvent("no_such_meter", "cus_1", "5", "nometer-1", ""),
	} {
		if _, err := api.BillingMeterEvents.New(p); err != nil {
			t.Fatalf("%s: %v; want accepted, rejected only at processing", *p.Identifier, err)
		}
	}
	for _, e := range srv.Events() {
		if e.Type == "v1.billing.meter.error_report_triggered" {
			t.Fatalf("error report %s before processing", e.ID)
		}
	}
	if n := srv.MeterEvents("api_calls", "cus_gone"); n != 0 {
		t.Fatalf("MeterEvents(cus_gone) = %d; want 0", n)
	}
	srv.AggregateNow()

	var reports []billingtest.Event
	for _, e := range srv.Events() {
		if e.Type == "v1.billing.meter.error_report_triggered" {
			reports = append(reports, e)
		}
	}
	if len(reports) != 2 {
		t.Fatalf("%d error reports; want 2 (one for the meter, one for no meter)", len(reports))
	}
	type report struct {
		ID, Object, Type, Created string
		RelatedObject             *struct{ ID, Type, URL string } `json:"related_object"`
		Data                      *struct {
			Reason struct {
				ErrorCount int `json:"error_count"`
				ErrorTypes []struct {
					Code         string
					ErrorCount   int `json:"error_count"`
					SampleErrors []struct {
						ErrorMessage string `json:"error_message"`
						Request      struct{ Identifier string }
					} `json:"sample_errors"`
				} `json:"error_types"`
			}
		}
	}
	want := map[string][]string{m: {"meter_event_customer_not_found", "gone-1", "gone-2"}, "": {"no_meter", "nometer-1"}}
	for _, e := range reports {
		var thin report
		if err := json.Unmarshal(e.Body, &thin); err != nil {
			t.Fatal(err)
		}
		if thin.Object != "v2.core.event" || thin.Data != nil {
			t.Fatalf("delivered event %s; want a thin v2.core.event without data", e.Body)
		}
		if _, err := time.Parse(time.RFC3339, thin.Created); err != nil {
			t.Fatalf("created %q: %v", thin.Created, err)
		}
		meterID := ""
		if thin.RelatedObject != nil {
			meterID = thin.RelatedObject.ID
			if thin.RelatedObject.Type != "billing.meter" || thin.RelatedObject.URL != "/v1/billing/meters/"+m {
				t.Fatalf("related_object = %+v", thin.RelatedObject)
			}
		}
		resp, body := do(t, srv, http.MethodGet, "/v2/core/events/"+thin.ID, "", nil)
		var full report
		if err := json.Unmarshal(body, &full); err != nil || resp.StatusCode != 200 || full.Data == nil {
			t.Fatalf("GET /v2/core/events/%s: %d %s", thin.ID, resp.StatusCode, body)
		}
		w := want[meterID]
		types := full.Data.Reason.ErrorTypes
		if len(types) != 1 || types[0].Code != w[0] || types[0].ErrorCount != len(w)-1 || full.Data.Reason.ErrorCount != len(w)-1 {
			t.Fatalf("report for meter %q: %s; want code %s for %v", meterID, body, w[0], w[1:])
		}
		var idents []string
		for _, s := range types[0].SampleErrors {
			idents = append(idents, s.Request.Identifier)
		}
		if !slices.Equal(idents, w[1:]) {
			t.Fatalf("sample identifiers %v; want %v", idents, w[1:])
		}
	}
	resp, _ := do(t, srv, http.MethodGet, "/v2/core/events/evt_missing", "", nil)
	if resp.StatusCode != 404 {
		t.Fatalf("unknown v2 event: %d; want 404", resp.StatusCode)
	}
	start := srv.Now().Add(-time.Hour).Truncate(time.Minute)
	if got, _ := summaries(t, api, m, "cus_gone", start, start.Add(2*time.Hour), ""); !slices.Equal(got, []float64{0}) {
		t.Fatalf("rejected customer's summary = %v; want [0]", got)
	}
	if got, _ := summaries(t, api, m, "cus_1", start, start.Add(2*time.Hour), ""); !slices.Equal(got, []float64{5}) {
		t.Fatalf("accepted customer's summary = %v; want [5]", got)
	}
}
