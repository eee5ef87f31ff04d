package billingtest_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// The fake's answers have Stripe's shape: every field the fake writes is a
// field of Stripe's own object or error in ../../testdata/stripe (bodies as
// Stripe documents them), with a value of the same JSON kind, and the
// fields a client decides by (object, status, type, code, decline_code,
// param) have Stripe's values.
func TestAnswersHaveStripesShape(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	post := func(path, key string, form url.Values) []byte {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(form.Encode()))
		req.Header.Set("Authorization", "Bearer "+testKey)
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return b
	}
	charge := func(customer, amount string) url.Values {
		return url.Values{"amount": {amount}, "currency": {"usd"}, "customer": {customer}, "metadata[billonce_period]": {"2026-09"}}
	}
	intent := url.Values{"amount": {"2500"}, "currency": {"usd"}, "customer": {"cus_1"}, "payment_method": {"pm_1"},
		"confirm": {"true"}, "off_session": {"true"}, "metadata[billonce_period]": {"2026-09"}}

	for _, tc := range []struct {
		fixture string
		answer  func() []byte
		decide  []string // fields whose values must equal Stripe's
	}{
		{"charge.json", func() []byte { return post("/v1/charges", "k1", charge("cus_1", "2500")) }, []string{"object", "status", "amount", "currency", "paid", "captured"}},
		{"payment_intent.json", func() []byte { return post("/v1/payment_intents", "k2", intent) }, []string{"object", "status", "amount", "amount_received", "currency"}},
		{"error_card_declined.json", func() []byte { return post("/v1/charges", "k3", charge("cus_d", "2500")) }, []string{"type", "code", "decline_code"}},
		{"error_idempotency.json", func() []byte { return post("/v1/charges", "k1", charge("cus_1", "2600")) }, []string{"type"}},
		{"error_key_in_use.json", func() []byte {
			srv.FailNext(billingtest.Match{IdempotencyKey: "k4"}, billingtest.Fault{Kind: billingtest.FaultInFlight})
			return post("/v1/charges", "k4", charge("cus_1", "2500"))
		}, []string{"type", "code"}},
		{"error_invalid_param.json", func() []byte { return post("/v1/charges", "k5", charge("cus_1", "abc")) }, []string{"type", "param"}},
		{"error_lock_timeout.json", func() []byte {
			srv.FailNext(billingtest.Match{IdempotencyKey: "k6"}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
			return post("/v1/charges", "k6", charge("cus_1", "2500"))
		}, []string{"type", "code"}},
		{"error_api.json", func() []byte {
			srv.FailNext(billingtest.Match{IdempotencyKey: "k7"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
			return post("/v1/charges", "k7", charge("cus_1", "2500"))
		}, []string{"type"}},
	} {
		t.Run(tc.fixture, func(t *testing.T) {
			raw, err := os.ReadFile("../../testdata/stripe/" + tc.fixture)
			if err != nil {
				t.Fatal(err)
			}
			var want, got map[string]any
			if err := json.Unmarshal(raw, &want); err != nil {
				t.Fatal(err)
			}
			body := tc.answer()
			if err := json.Unmarshal(body, &got); err != nil {
				t.Fatalf("answer %s: %v", body, err)
			}
			if e, ok := want["error"].(map[string]any); ok {
				want = e
				if got, ok = got["error"].(map[string]any); !ok {
					t.Fatalf("answer %s; want a Stripe error object", body)
				}
			}
			for k, v := range got {
				w, ok := want[k]
				if !ok {
					t.Errorf("field %q is not in Stripe's %s", k, tc.fixture)
					continue
				}
				if w != nil && v != nil && kind(w) != kind(v) {
					t.Errorf("field %q is a %s; Stripe's is a %s", k, kind(v), kind(w))
				}
			}
			for _, k := range tc.decide {
				if g, w := got[k], want[k]; g != w {
					t.Errorf("%s = %v; Stripe answers %v", k, g, w)
				}
			}
		})
	}
}

func kind(v any) string {
	switch v.(type) {
	case string:
		return "string"
	case float64:
		return "number"
	case bool:
		return "bool"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return "null"
}
