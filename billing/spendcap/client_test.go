package spendcap_test

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

// appSecret is what the application believes is its Stripe key; behind
// the proxy it must never leave the process.
const appSecret = "sk_live_application_secret_must_not_leave_0001"

// stripeAPI is a stripe-go client that believes it talks to Stripe with
// appSecret, over hc, with stripe-go's own retries off.
func stripeAPI(hc *http.Client) *client.API {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
	})
	api := &client.API{}
	api.Init(appSecret, &stripe.Backends{API: b, Connect: b, Uploads: b})
	return api
}

func proxied(tb testing.TB, proxyURL string) *client.API {
	tb.Helper()
	hc, err := spendcap.Client(proxyURL, vaultKey, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return stripeAPI(hc)
}

func vaultChargeParams(customer, key string, amount int64) *stripe.ChargeParams {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
	p.AddMetadata(billing.MetaPeriod, "2026-09")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

// answerer serves one canned answer and records what it was sent.
func answerer(status int, header http.Header, body string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		for k, v := range header {
			w.Header()[k] = v
		}
		w.WriteHeader(status)
		io.WriteString(w, body)
	})
}

func TestVaultTellsProxyAnswersFromStripeAnswers(t *testing.T) {
	t.Parallel()
	stripeID := http.Header{"Request-Id": {"req_abc123"}}
	stripe429 := `{"error":{"type":"invalid_request_error","code":"rate_limit","message":"Too many requests"}}`
	tests := []struct {
		name   string
		status int
		header http.Header
		body   string
		want   error  // sentinel, for a proxy refusal
		stripe string // else: the *stripe.Error type stripe-go reports
	}{
		{"keybrake cap", 429, nil, `{"error":"Daily spend cap of $50 reached","spent":5000}`, spendcap.ErrSpendCapReached, ""},
		{"402 cap", 402, nil, `{"error":"Budget exhausted"}`, spendcap.ErrSpendCapReached, ""},
		{"412 cap", 412, nil, `{"error":"Spend limit"}`, spendcap.ErrSpendCapReached, ""},
		{"blocked endpoint", 403, nil, `{"error":"Endpoint not allowed","allowed_endpoints":["POST /v1/charges"]}`, spendcap.ErrEndpointNotAllowed, ""},
		{"revoked", 401, nil, `{"error":"Vault key revoked"}`, spendcap.ErrVaultKeyRevoked, ""},
		{"Stripe 429 with Request-Id", 429, stripeID, stripe429, nil, "invalid_request_error"},
		{"Stripe-shaped 429 without Request-Id", 429, nil, stripe429, nil, "invalid_request_error"},
		{"Stripe 402 decline", 402, stripeID, `{"error":{"type":"card_error","code":"card_declined","message":"declined"}}`, nil, "card_error"},
		{"Stripe 401 with Request-Id and a string error", 401, stripeID, `{"error":"odd"}`, nil, ""},
		{"proxy 502", 502, nil, `{"error":"Upstream request failed; the outcome is unknown"}`, nil, "api_error"},
		{"proxy 400", 400, nil, `{"error":"Malformed request"}`, nil, "invalid_request_error"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ts := httptest.NewServer(answerer(tt.status, tt.header, tt.body))
			defer ts.Close()
			_, err := proxied(t, ts.URL).Charges.New(vaultChargeParams("cus_1", "k", 100))
			var pe *spendcap.ProxyError
			if tt.want != nil {
				if !errors.Is(err, tt.want) || !errors.As(err, &pe) || pe.Status != tt.status {
					t.Fatalf("err = %v; want a *ProxyError with status %d matching %v", err, tt.status, tt.want)
				}
				return
			}
			if errors.As(err, &pe) {
				t.Fatalf("err = %v; a Stripe answer was taken for a proxy refusal", err)
			}
			var se *stripe.Error
			if tt.stripe == "" {
				if err == nil || errors.As(err, &se) {
					t.Fatalf("err = %v; want stripe-go's own error for an unparseable body", err)
				}
				return
			}
			if !errors.As(err, &se) || string(se.Type) != tt.stripe || se.HTTPStatusCode != tt.status {
				t.Fatalf("err = %v; want a *stripe.Error of type %s, status %d", err, tt.stripe, tt.status)
			}
		})
	}
}

func TestNewTransportValidates(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      spendcap.Config
		ok       bool
		mentions string
	}{
		{"https", spendcap.Config{ProxyURL: "https://proxy.example.com/stripe", VaultKey: vaultKey}, true, ""},
		{"http loopback", spendcap.Config{ProxyURL: "http://127.0.0.1:8080", VaultKey: vaultKey}, true, ""},
		{"http localhost", spendcap.Config{ProxyURL: "http://localhost:8080", VaultKey: vaultKey}, true, ""},
		{"http ipv6 loopback", spendcap.Config{ProxyURL: "http://[::1]:8080", VaultKey: vaultKey}, true, ""},
		{"http allowed", spendcap.Config{ProxyURL: "http://proxy.internal", VaultKey: vaultKey, AllowInsecure: true}, true, ""},
		{"http remote", spendcap.Config{ProxyURL: "http://proxy.example.com", VaultKey: vaultKey}, false, "clear text"},
		{"empty URL", spendcap.Config{VaultKey: vaultKey}, false, "ProxyURL is empty"},
		{"bad scheme", spendcap.Config{ProxyURL: "ftp://proxy.example.com", VaultKey: vaultKey}, false, "scheme"},
		{"no host", spendcap.Config{ProxyURL: "https:///v1", VaultKey: vaultKey}, false, "no host"},
		{"user info", spendcap.Config{ProxyURL: "https://user:" + vaultKey + "@proxy.example.com", VaultKey: vaultKey}, false, "user info"},
		{"query", spendcap.Config{ProxyURL: "https://proxy.example.com/?key=" + vaultKey, VaultKey: vaultKey}, false, "query"},
		{"empty key", spendcap.Config{ProxyURL: "https://proxy.example.com"}, false, "VaultKey is empty"},
		{"key with newline", spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vaultKey + "\n"}, false, "white space"},
		{"oversized key", spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: strings.Repeat(vaultKey, 20)}, false, "at most"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vt, err := spendcap.NewTransport(tt.cfg)
			if tt.ok {
				if err != nil || vt == nil {
					t.Fatalf("err = %v; want a transport", err)
				}
				return
			}
			if !errors.Is(err, spendcap.ErrInvalid) || !strings.Contains(err.Error(), tt.mentions) {
				t.Fatalf("err = %v; want ErrInvalid mentioning %q", err, tt.mentions)
			}
			if strings.Contains(err.Error(), vaultKey) {
				t.Fatalf("error leaks the vault key: %v", err)
			}
		})
	}
	if _, err := spendcap.Client("http://proxy.example.com", vaultKey, nil); !errors.Is(err, spendcap.ErrInvalid) {
		t.Errorf("Client over remote http: err = %v; want ErrInvalid", err)
	}
}

// roundTripFunc adapts a function to http.RoundTripper.
type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// closeCounter counts Close calls on a body.
type closeCounter struct {
	io.Reader
	closed *atomic.Int32
}

func (c closeCounter) Close() error { c.closed.Add(1); return nil }

func TestVaultTransportRewritesRequests(t *testing.T) {
	t.Parallel()
	var sent *http.Request
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		sent = r
		return &http.Response{StatusCode: 200, Header: http.Header{}, Body: io.NopCloser(strings.NewReader("{}")), Request: r}, nil
	})
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com/stripe/", VaultKey: vaultKey, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodGet, "https://api.stripe.com/v1/charges/search?query=metadata%5B%27k%27%5D%3A%27v%27", nil)
	req.Header.Set("Authorization", "Bearer "+appSecret)
	req.Header["authorization"] = []string{"Basic " + appSecret}
	req.Header.Set("Idempotency-Key", "k1")
	if _, err := vt.RoundTrip(req); err != nil {
		t.Fatal(err)
	}
	if got, want := sent.URL.String(), "https://proxy.example.com/stripe/v1/charges/search?query=metadata%5B%27k%27%5D%3A%27v%27"; got != want {
		t.Errorf("sent to %s; want %s", got, want)
	}
	lower := "authorization" // set above as a raw, non-canonical key
	if got := fmt.Sprint(sent.Header.Values("Authorization"), sent.Header[lower]); got != "[Bearer "+vaultKey+"] []" {
		t.Errorf("Authorization sent = %s; want only the vault key", got)
	}
	if sent.Header.Get("Idempotency-Key") != "k1" {
		t.Errorf("Idempotency-Key dropped")
	}
	if req.URL.Host != "api.stripe.com" || req.Header.Get("Authorization") != "Bearer "+appSecret {
		t.Errorf("the caller's request was modified: %s %v", req.URL, req.Header)
	}
}

func TestVaultTransportRefusesRedirects(t *testing.T) {
	t.Parallel()
	var elsewhere atomic.Int32
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { elsewhere.Add(1) }))
	defer other.Close()
	proxy := httptest.NewServer(http.RedirectHandler(other.URL+"/v1/charges", http.StatusTemporaryRedirect))
	defer proxy.Close()
	hc, err := spendcap.Client(proxy.URL, vaultKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	var closed, redirectClosed atomic.Int32
	req, _ := http.NewRequest(http.MethodPost, "https://api.stripe.com/v1/charges", nil)
	req.Body = closeCounter{strings.NewReader("amount=100"), &closed}
	req.GetBody = func() (io.ReadCloser, error) {
		return closeCounter{strings.NewReader("amount=100"), &redirectClosed}, nil
	}
	_, err = hc.Do(req)
	if err == nil || !strings.Contains(err.Error(), "redirect") || strings.Contains(err.Error(), vaultKey) {
		t.Fatalf("err = %v; want a refused redirect without the key", err)
	}
	if elsewhere.Load() != 0 {
		t.Fatalf("the redirect target was called %d times", elsewhere.Load())
	}
	if closed.Load() == 0 || redirectClosed.Load() != 1 {
		t.Errorf("request body closed %d times, the refused redirect's %d times; want both closed", closed.Load(), redirectClosed.Load())
	}
}

func TestVaultTransportClosesRefusedResponses(t *testing.T) {
	t.Parallel()
	var closed atomic.Int32
	base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
		return &http.Response{StatusCode: 429, Header: http.Header{},
			Body: closeCounter{strings.NewReader(`{"error":"cap"}`), &closed}, Request: r}, nil
	})
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vaultKey, Base: base})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(http.MethodPost, "https://api.stripe.com/v1/charges", strings.NewReader("amount=1"))
	resp, err := vt.RoundTrip(req)
	if resp != nil || !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("resp %v, err %v; want nil and ErrSpendCapReached", resp, err)
	}
	if closed.Load() != 1 {
		t.Fatalf("response body closed %d times; want 1", closed.Load())
	}
}

func TestVaultKeyNeverPrinted(t *testing.T) {
	t.Parallel()
	// A proxy that echoes the key in its refusal.
	echo := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		key := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		w.WriteHeader(http.StatusForbidden)
		fmt.Fprintf(w, `{"error":"key %s may not call %s","allowed_endpoints":["GET /v1/charges for %s"]}`, key, r.URL.Path, key)
	}))
	defer echo.Close()
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: echo.URL, VaultKey: vaultKey})
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(&out, nil))
	logger.Info("transport", "t", vt, "v", *vt)
	slog.New(slog.NewTextHandler(&out, nil)).Info("transport", "t", vt)
	fmt.Fprintf(&out, "%v %+v %#v %s %v %+v %#v\n", vt, vt, vt, vt, *vt, *vt, *vt)

	hc := &http.Client{Transport: vt}
	api := stripeAPI(hc)
	_, err = api.Charges.New(vaultChargeParams("cus_1", "k", 100))
	var pe *spendcap.ProxyError
	if !errors.As(err, &pe) {
		t.Fatalf("err = %v; want a *ProxyError", err)
	}
	fmt.Fprintf(&out, "%v %+v %#v %s\n", err, err, pe, pe.AllowedEndpoints)
	logger.Error("charge failed", "err", err)

	if strings.Contains(out.String(), vaultKey) {
		t.Fatalf("the vault key was printed:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "[redacted …0042]") || !strings.Contains(pe.Message, "[redacted …0042]") {
		t.Fatalf("want the redacted form in the output:\n%s", out.String())
	}
}

// BenchmarkVaultTransport measures what the transport adds to a request: the
// rewrite on every request, and reading a refusal.
func BenchmarkVaultTransport(b *testing.B) {
	for _, bc := range []struct {
		name   string
		status int
		header http.Header
		body   string
	}{
		{"ok", 200, http.Header{"Request-Id": {"req_1"}}, `{"id":"ch_1"}`},
		{"stripe-429", 429, http.Header{"Request-Id": {"req_1"}}, `{"error":{"type":"invalid_request_error","code":"rate_limit"}}`},
		{"proxy-cap", 429, http.Header{}, `{"error":"Daily spend cap of $50 reached","spent":5000}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			base := roundTripFunc(func(r *http.Request) (*http.Response, error) {
				return &http.Response{StatusCode: bc.status, Header: bc.header, Body: io.NopCloser(strings.NewReader(bc.body)), Request: r}, nil
			})
			vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com/stripe", VaultKey: vaultKey, Base: base})
			if err != nil {
				b.Fatal(err)
			}
			req, _ := http.NewRequest(http.MethodPost, "https://api.stripe.com/v1/charges", nil)
			req.Header.Set("Authorization", "Bearer "+appSecret)
			req.Header.Set("Idempotency-Key", "k")
			b.ReportAllocs()
			for b.Loop() {
				resp, err := vt.RoundTrip(req)
				if resp != nil {
					resp.Body.Close()
				} else if err == nil {
					b.Fatal("no response and no error")
				}
			}
		})
	}
}

// A typed nil transport is refused with a clear error, never a panic.
func TestClientRefusesANilTransport(t *testing.T) {
	t.Parallel()
	for name, call := range map[string]func() error{
		"NewTransport": func() error {
			_, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: "vault_key_0001", Base: (*http.Transport)(nil)})
			return err
		},
		"Client": func() error {
			_, err := spendcap.Client("https://proxy.example.com", "vault_key_0001", &http.Client{Transport: (*http.Transport)(nil)})
			return err
		},
	} {
		if err := call(); !errors.Is(err, spendcap.ErrInvalid) || !strings.Contains(err.Error(), "nil *http.Transport") {
			t.Errorf("%s with a nil *http.Transport: %v; want ErrInvalid naming it", name, err)
		}
	}
}
