package billingotel_test

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingotel"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	secretKey = "sk_test_51BillonceOtelS3cretNeverExport000000wxyz"
	period    = "2026-09"
)

// telemetry is an Observer on the SDK's in-memory reader and recorder.
type telemetry struct {
	obs    *billingotel.Observer
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	next   atomic.Int64 // events passed on to Config.Next
}

func newTelemetry(tb testing.TB) *telemetry {
	tb.Helper()
	t := &telemetry{reader: sdkmetric.NewManualReader(), spans: tracetest.NewSpanRecorder()}
	obs, err := billingotel.New(billingotel.Config{
		MeterProvider:  sdkmetric.NewMeterProvider(sdkmetric.WithReader(t.reader)),
		TracerProvider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(t.spans)),
		Next:           func(billing.Event) { t.next.Add(1) },
	})
	if err != nil {
		tb.Fatal(err)
	}
	t.obs = obs
	return t
}

// metrics collects every metric by name.
func (t *telemetry) metrics(tb testing.TB) map[string]metricdata.Aggregation {
	tb.Helper()
	var rm metricdata.ResourceMetrics
	if err := t.reader.Collect(context.Background(), &rm); err != nil {
		tb.Fatal(err)
	}
	out := make(map[string]metricdata.Aggregation)
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != billingotel.ScopeName {
			tb.Fatalf("scope %q; want %q", sm.Scope.Name, billingotel.ScopeName)
		}
		for _, m := range sm.Metrics {
			out[m.Name] = m.Data
		}
	}
	return out
}

// label renders an attribute set as "k=v,k=v" in key order.
func label(s attribute.Set) string {
	var b []string
	for _, kv := range s.ToSlice() {
		b = append(b, string(kv.Key)+"="+kv.Value.String())
	}
	return strings.Join(b, ",")
}

// sums returns a counter's values by attribute set.
func sums(tb testing.TB, data metricdata.Aggregation) map[string]int64 {
	tb.Helper()
	s, ok := data.(metricdata.Sum[int64])
	if !ok {
		tb.Fatalf("%T is not an int64 sum", data)
	}
	out := make(map[string]int64)
	for _, dp := range s.DataPoints {
		out[label(dp.Attributes)] = dp.Value
	}
	return out
}

// counts returns a histogram's counts by attribute set.
func counts(tb testing.TB, data metricdata.Aggregation) map[string]uint64 {
	tb.Helper()
	h, ok := data.(metricdata.Histogram[float64])
	if !ok {
		tb.Fatalf("%T is not a float64 histogram", data)
	}
	out := make(map[string]uint64)
	for _, dp := range h.DataPoints {
		if dp.Count > 0 && dp.Sum <= 0 {
			tb.Errorf("%s: %d values summing to %v s", label(dp.Attributes), dp.Count, dp.Sum)
		}
		out[label(dp.Attributes)] = dp.Count
	}
	return out
}

func equal[V comparable](tb testing.TB, what string, got, want map[string]V) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("%s: %v; want %v", what, got, want)
		return
	}
	for k, v := range want {
		if got[k] != v {
			tb.Errorf("%s: %v; want %v", what, got, want)
			return
		}
	}
}

// A Run with a decline, a 500 before Stripe commits and a connection cut
// after it commits is counted by outcome and error kind, its Stripe calls
// timed and its retries counted, and each charge is one span with an event
// per Stripe call, placed in time; no attribute carries the secret key or,
// on a metric, a customer.
func TestRunMetricsAndSpans(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel := newTelemetry(t)
	srv := billingtest.Start(t, billingtest.Config{})
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{
		SecretKey: secretKey,
		StripeURL: srv.URL,
		Claims:    store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 1500, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
		RateLimit:  -1,
		HTTPClient: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		Retry:      retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 6, AttemptTimeout: 5 * time.Second},
		Observe:    tel.obs.Observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Decline("cus_decline", "")
	srv.FailNext(billingtest.Match{Customer: "cus_500"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	srv.FailNext(billingtest.Match{Customer: "cus_cut"}, billingtest.Fault{Kind: billingtest.FaultCut})

	before := time.Now()
	sum, runErr := b.Run(ctx, period, billing.Customers("cus_ok", "cus_decline", "cus_500", "cus_cut"), nil)
	if runErr != nil {
		t.Fatal(runErr)
	}
	if sum.Created != 3 || sum.Declined != 1 {
		t.Fatalf("summary %+v; want 3 created and 1 declined", sum.Progress)
	}
	after := time.Now()

	m := tel.metrics(t)
	api := "billonce.api=charges"
	charge := api + ",billonce.object=charge"
	equal(t, "billonce.writes", sums(t, m["billonce.writes"]), map[string]int64{
		charge + ",billonce.outcome=created":                        2,
		charge + ",billonce.outcome=replayed":                       1,
		charge + ",billonce.outcome=not_billed,error.type=declined": 1,
	})
	equal(t, "billonce.stripe.retries", sums(t, m["billonce.stripe.retries"]), map[string]int64{charge: 2})
	equal(t, "billonce.stripe.call.duration", counts(t, m["billonce.stripe.call.duration"]), map[string]uint64{
		charge: 3, // cus_ok, and the second calls of cus_500 and cus_cut
		charge + ",error.type=card_error,http.response.status_code=402": 1,
		charge + ",error.type=api_error,http.response.status_code=500":  1,
		charge + ",error.type=transport":                                1,
	})
	equal(t, "billonce.runs", sums(t, m["billonce.runs"]), map[string]int64{api + ",billonce.result=incomplete": 1})
	equal(t, "billonce.run.duration", counts(t, m["billonce.run.duration"]), map[string]uint64{api + ",billonce.result=incomplete": 1})
	equal(t, "billonce.run.customers", sums(t, m["billonce.run.customers"]), map[string]int64{
		api + ",billonce.outcome=created": 3, api + ",billonce.outcome=declined": 1,
	})
	for name, data := range m {
		for _, l := range metricLabels(data) {
			if strings.Contains(l, "cus_") || strings.Contains(l, "sk_") || strings.Contains(l, "billonce.key") {
				t.Errorf("metric %s has a high-cardinality or secret attribute: %s", name, l)
			}
		}
	}
	if got := tel.next.Load(); got != 11 { // 6 calls, 4 outcomes, the run
		t.Errorf("Config.Next got %d events; want 11", got)
	}

	// One span per charge, with an event per call.
	type wantCall struct {
		status    int64
		errorType string
	}
	wants := map[string]struct {
		outcome string
		calls   []wantCall
		failed  bool
	}{
		"cus_ok":      {"created", []wantCall{{}}, false},
		"cus_decline": {"not_billed", []wantCall{{402, "card_error"}}, true},
		"cus_500":     {"created", []wantCall{{500, "api_error"}, {}}, false},
		"cus_cut":     {"replayed", []wantCall{{0, "transport"}, {}}, false},
	}
	spans := tel.spans.Ended()
	if len(spans) != len(wants) {
		t.Fatalf("%d spans; want %d", len(spans), len(wants))
	}
	for _, sp := range spans {
		attrs := attribute.NewSet(sp.Attributes()...)
		cust, _ := attrs.Value("billonce.customer")
		w, ok := wants[cust.AsString()]
		if !ok || sp.Name() != "billonce.write" || !hasAttr(sp.Attributes(), "billonce.object", "charge") {
			t.Fatalf("span %s of customer %q, attributes %v; want a billonce.write of a charge", sp.Name(), cust.AsString(), sp.Attributes())
		}
		key, err := b.Key(cust.AsString(), period, 1)
		if err != nil {
			t.Fatal(err)
		}
		if v, _ := attrs.Value("billonce.key"); v.AsString() != key.String() {
			t.Errorf("%s: span key %q; want %q", cust.AsString(), v.AsString(), key)
		}
		if v, _ := attrs.Value("billonce.outcome"); v.AsString() != w.outcome {
			t.Errorf("%s: outcome %q; want %q", cust.AsString(), v.AsString(), w.outcome)
		}
		if (sp.Status().Code == codes.Error) != w.failed {
			t.Errorf("%s: status %+v; want failed=%v", cust.AsString(), sp.Status(), w.failed)
		}
		if sp.StartTime().Before(before) || sp.EndTime().After(after) || sp.EndTime().Before(sp.StartTime()) {
			t.Errorf("%s: span from %v to %v, outside the run (%v to %v)", cust.AsString(), sp.StartTime(), sp.EndTime(), before, after)
		}
		evs := sp.Events()
		if len(evs) != len(w.calls) {
			t.Fatalf("%s: %d events; want %d", cust.AsString(), len(evs), len(w.calls))
		}
		for i, ev := range evs {
			ea := attribute.NewSet(ev.Attributes...)
			k, _ := ea.Value("billonce.key")
			n, _ := ea.Value("billonce.http_attempt")
			st, _ := ea.Value("http.response.status_code")
			et, _ := ea.Value("error.type")
			rid, hasRID := ea.Value("billonce.request_id")
			if ev.Name != "billonce.stripe.call" || k.AsString() != key.String() || n.AsInt64() != int64(i+1) ||
				st.AsInt64() != w.calls[i].status || et.AsString() != w.calls[i].errorType {
				t.Errorf("%s: event %d is %s %v; want key %s, attempt %d, %+v", cust.AsString(), i, ev.Name, ev.Attributes, key, i+1, w.calls[i])
			}
			// Every answer carries a request id; a cut connection none.
			if hasRID != (w.calls[i].errorType != "transport") || hasRID && !strings.HasPrefix(rid.AsString(), "req_") {
				t.Errorf("%s: event %d request id %q (present %v)", cust.AsString(), i, rid.AsString(), hasRID)
			}
			if ev.Time.Before(sp.StartTime()) || ev.Time.After(sp.EndTime()) || i > 0 && ev.Time.Before(evs[i-1].Time) {
				t.Errorf("%s: event %d at %v, outside its span (%v to %v) or before the previous one", cust.AsString(), i, ev.Time, sp.StartTime(), sp.EndTime())
			}
			noSecret(t, ev.Attributes)
		}
		noSecret(t, sp.Attributes())
		if strings.Contains(sp.Status().Description, "sk_") {
			t.Errorf("%s: status %q carries a secret key", cust.AsString(), sp.Status().Description)
		}
	}
}

func metricLabels(data metricdata.Aggregation) []string {
	var out []string
	switch d := data.(type) {
	case metricdata.Sum[int64]:
		for _, dp := range d.DataPoints {
			out = append(out, label(dp.Attributes))
		}
	case metricdata.Histogram[float64]:
		for _, dp := range d.DataPoints {
			out = append(out, label(dp.Attributes))
		}
	}
	return out
}

func noSecret(tb testing.TB, attrs []attribute.KeyValue) {
	tb.Helper()
	for _, kv := range attrs {
		if v := kv.Value.String(); strings.Contains(v, secretKey) || strings.Contains(v, "sk_") {
			tb.Errorf("attribute %s = %q carries a secret key", kv.Key, v)
		}
	}
}

func hasAttr(attrs []attribute.KeyValue, key, value string) bool {
	for _, kv := range attrs {
		if string(kv.Key) == key && kv.Value.String() == value {
			return true
		}
	}
	return false
}
