package spendcap

import "testing"

// An allowlist entry matches segment by segment: "*" as a segment is any
// one segment (never an empty one, "." or ".."), and a last segment ending
// in "*" is a prefix of the rest of the path.
func TestAllowedEndpointPatterns(t *testing.T) {
	t.Parallel()
	k := Key{AllowedEndpoints: []string{"POST /v1/payment_intents", "POST /v1/payment_intents/*/cancel", "GET /v1/payment_intents/*", "GET /v1/ch*"}}
	cases := []struct {
		method, path string
		want         bool
	}{
		{"POST", "/v1/payment_intents", true},
		{"POST", "/v1/payment_intents/pi_1/cancel", true},
		{"post", "/v1/payment_intents/pi_1/cancel", true},
		{"POST", "/v1/payment_intents/pi_1/confirm", false},
		{"POST", "/v1/payment_intents/pi_1/capture", false},
		{"POST", "/v1/payment_intents/pi_1", false},
		{"POST", "/v1/payment_intents/pi_1/x/cancel", false},
		{"POST", "/v1/payment_intents//cancel", false},
		{"POST", "/v1/payment_intents/../cancel", false},
		{"POST", "/v1/payment_intents/./cancel", false},
		{"POST", "/v1/payment_intents/pi_1/cancel/", false},
		{"POST", "/v1/payment_intents/", false},
		{"GET", "/v1/payment_intents/pi_1", true},
		{"GET", "/v1/payment_intents/search", true},
		{"GET", "/v1/payment_intents/", true},
		{"GET", "/v1/payment_intents", false},
		{"GET", "/v1/charges/ch_1/refunds", true},
		{"GET", "/v1/customers", false},
		{"DELETE", "/v1/payment_intents/pi_1/cancel", false},
	}
	for _, c := range cases {
		if got := k.allows(c.method, c.path); got != c.want {
			t.Errorf("allows(%s %s) = %v, want %v", c.method, c.path, got, c.want)
		}
	}
}
