package billingotel_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.opentelemetry.io/otel/attribute"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

// A gateway in front of Stripe that answers in Stripe's error shape with
// error types of its own, and echoes the request's Authorization header
// into every field and the Request-Id: no metric, span, span event or
// span status carries the secret key, and error.type stays one of
// Stripe's error types (or "http_error"), so the gateway's words cannot
// grow a metric's series.
func TestAGatewayEchoingTheKeyPutsNothingOfItsOwnIntoTelemetry(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel := newTelemetry(t)
	var n atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a := r.Header.Get("Authorization")
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Request-Id", "req_"+a)
		w.WriteHeader(http.StatusBadGateway)
		fmt.Fprintf(w, `{"error":{"type":"gateway_error_%d %s","code":%q,"message":%q,"param":%q}}`, n.Add(1), a, a, "upstream said: "+a, a)
	}))
	t.Cleanup(gw.Close)
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{
		SecretKey: secretKey, StripeURL: gw.URL, Claims: store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 1500, Currency: "usd"}, nil
		},
		RateLimit:  -1,
		HTTPClient: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		Retry:      retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 3, AttemptTimeout: 5 * time.Second},
		Observe:    tel.obs.Observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Run(ctx, "2026-09", billing.Customers("cus_1", "cus_2"), nil); err != nil {
		t.Fatal(err)
	}
	if n.Load() < 4 {
		t.Fatalf("the gateway answered %d requests; want the retries of both customers", n.Load())
	}
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	types := map[string]bool{"api_error": true, "card_error": true, "idempotency_error": true, "invalid_request_error": true, "http_error": true}
	check := func(where string, attrs []attribute.KeyValue) {
		t.Helper()
		for _, kv := range attrs {
			v := kv.Value.String()
			if strings.Contains(v, secret) {
				t.Errorf("%s: %s = %q carries the secret key", where, kv.Key, v)
			}
			if kv.Key == "error.type" && strings.HasPrefix(v, "gateway_error") {
				t.Errorf("%s: error.type = %q, the gateway's own word; want one of %v or a kind of billing's", where, v, types)
			}
		}
	}
	spans := tel.spans.Ended()
	if len(spans) != 2 {
		t.Fatalf("%d spans, want one per customer", len(spans))
	}
	for _, s := range spans {
		check("span", s.Attributes())
		for _, ev := range s.Events() {
			check("span event", ev.Attributes)
		}
		if strings.Contains(s.Status().Description, secret) {
			t.Errorf("span status carries the secret key: %.300s", s.Status().Description)
		}
	}
	for name, data := range tel.metrics(t) {
		for _, l := range metricLabels(data) {
			if strings.Contains(l, secret) || strings.Contains(l, "gateway_error") {
				t.Errorf("metric %s has the gateway's words or the key: %s", name, l)
			}
		}
	}
}
