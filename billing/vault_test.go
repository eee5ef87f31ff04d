package billing_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

const (
	// appSecret is what the application believes is its Stripe key; behind
	// the proxy it must never leave the process.
	appSecret   = "sk_live_application_secret_must_not_leave_0001"
	upstreamKey = "sk_test_upstream_secret_held_by_proxy_0002"
	vaultKey    = "vault_key_for_run_2026_09_secret_tail_7f3a"
)

// authRecorder records the Authorization headers a handler receives.
type authRecorder struct {
	mu   sync.Mutex
	seen map[string]int
}

func (a *authRecorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		if a.seen == nil {
			a.seen = make(map[string]int)
		}
		a.seen[r.Header.Get("Authorization")]++
		a.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (a *authRecorder) only(tb testing.TB, who, want string) {
	tb.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) != 1 || a.seen[want] == 0 {
		tb.Errorf("%s saw Authorization headers %v; want only %q", who, a.seen, want)
	}
}

type stack struct {
	srv      *billingtest.Server
	px       *billingtest.Proxy
	proxyURL string // the proxy, behind a recorder
	atStripe *authRecorder
	atProxy  *authRecorder
}

// newStack starts a fake Stripe that accepts only upstreamKey, a fake proxy
// in front of it, and recorders of the Authorization headers each sees.
func newStack(tb testing.TB, pcfg billingtest.ProxyConfig) *stack {
	tb.Helper()
	s := &stack{atStripe: &authRecorder{}, atProxy: &authRecorder{}}
	s.srv = billingtest.NewServer(billingtest.Config{APIKeys: []string{upstreamKey}})
	tb.Cleanup(s.srv.Close)
	stripeFront := httptest.NewServer(s.atStripe.wrap(reverse(tb, s.srv.URL)))
	tb.Cleanup(stripeFront.Close)
	pcfg.Upstream, pcfg.StripeKey, pcfg.Clock = stripeFront.URL, upstreamKey, s.srv
	s.px = billingtest.NewProxy(pcfg)
	tb.Cleanup(s.px.Close)
	proxyFront := httptest.NewServer(s.atProxy.wrap(reverse(tb, s.px.URL)))
	tb.Cleanup(proxyFront.Close)
	s.proxyURL = proxyFront.URL
	return s
}

func reverse(tb testing.TB, target string) http.Handler {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	return rp
}

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
	p.AddMetadata(billingtest.DefaultPeriodKey, "2026-09")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func paidTotal(srv *billingtest.Server) (total int64) {
	for _, p := range srv.Payments() {
		if p.Paid {
			total += p.Amount
		}
	}
	return total
}

// The seeds' worst case: a loop that makes a fresh key on every iteration
// charges again and again. Behind the proxy it stops at the cap.
func TestVaultRunawayLoopStopsAtTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	const capAmount, amount = 10000, 2999
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: capAmount, AllowedEndpoints: []string{"POST /v1/charges"}})
	api := proxied(t, s.proxyURL)

	var err error
	iterations := 0
	for ; iterations < 100; iterations++ {
		if _, err = api.Charges.New(vaultChargeParams("cus_1", rand.Text(), amount)); err != nil {
			break
		}
	}
	if !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("loop ended after %d iterations with %v; want ErrSpendCapReached", iterations, err)
	}
	var pe *spendcap.ProxyError
	if !errors.As(err, &pe) || pe.Status != http.StatusTooManyRequests || pe.Message != "Spend cap of $100 for this key reached" {
		t.Fatalf("error %#v; want a *spendcap.ProxyError with status 429 and the proxy's message", err)
	}
	if got := paidTotal(s.srv); got > capAmount || got != 3*amount {
		t.Fatalf("charged %d at the fake; want %d (3 charges under the cap of %d)", got, 3*amount, capAmount)
	}
	if iterations != 3 {
		t.Fatalf("loop stopped after %d charges; want 3", iterations)
	}
	s.atProxy.only(t, "the proxy", "Bearer "+vaultKey)
	s.atStripe.only(t, "the fake Stripe", "Bearer "+upstreamKey)
}

func TestVaultReplaysDoNotConsumeCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 5000})
	api := proxied(t, s.proxyURL)
	// The first response is lost after Stripe committed.
	s.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	var ids []string
	for i := range 4 {
		ch, err := api.Charges.New(vaultChargeParams("cus_1", "cus_1/2026-09", 4000))
		if i == 0 {
			if err == nil {
				t.Fatal("first attempt succeeded; want the proxy's 502 for the cut connection")
			}
			var se *stripe.Error
			if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusBadGateway || se.Type != stripe.ErrorTypeAPI {
				t.Fatalf("first attempt: %v; want a *stripe.Error api_error 502 (retryable, outcome unknown)", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		ids = append(ids, ch.ID)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("charge IDs %v; want the same charge replayed", ids)
	}
	if n := s.srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Fatalf("charged %d times; want 1", n)
	}
	if u := s.px.Usage(vaultKey); u.Spent != 4000 {
		t.Fatalf("Usage = %+v; want Spent 4000", u)
	}
}

func TestVaultConcurrentChargesAtTheEdge(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{CapStatus: http.StatusPaymentRequired})
	const amount, fit, n = 300, 20, 50
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: amount*fit + amount - 1})
	api := proxied(t, s.proxyURL)
	var ok, capped, other atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := api.Charges.New(vaultChargeParams(fmt.Sprintf("cus_%d", i), fmt.Sprintf("k%d", i), amount))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, spendcap.ErrSpendCapReached):
				capped.Add(1)
			default:
				other.Add(1)
				t.Errorf("charge %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if got := paidTotal(s.srv); got != amount*fit || ok.Load() != fit || capped.Load() != n-fit {
		t.Fatalf("paid %d, ok %d, capped %d, other %d; want %d paid, %d ok, %d capped", got, ok.Load(), capped.Load(), other.Load(), amount*fit, fit, n-fit)
	}
}

func TestVaultRefusalsAreTypedAndNotRetried(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 100000, AllowedEndpoints: []string{"POST /v1/payment_intents"}})
	hc, err := spendcap.Client(s.proxyURL, vaultKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := stripeAPI(hc)

	_, err = api.Charges.New(vaultChargeParams("cus_1", "k1", 100))
	var pe *spendcap.ProxyError
	if !errors.Is(err, spendcap.ErrEndpointNotAllowed) || !errors.As(err, &pe) || len(pe.AllowedEndpoints) != 1 || pe.AllowedEndpoints[0] != "POST /v1/payment_intents" {
		t.Fatalf("blocked endpoint: %v; want ErrEndpointNotAllowed with the allowlist", err)
	}
	if errors.Is(err, spendcap.ErrSpendCapReached) || errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Errorf("blocked endpoint also matches another sentinel: %v", err)
	}

	s.px.KillSwitch(true)
	_, err = api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
	if !errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Fatalf("kill switch: %v; want ErrVaultKeyRevoked", err)
	}
	s.px.KillSwitch(false)
	s.px.Revoke(vaultKey)
	_, err = api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
	if !errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Fatalf("revoked: %v; want ErrVaultKeyRevoked", err)
	}
	if log := s.px.Log(); len(log) != 3 {
		t.Fatalf("the proxy answered %d requests; want 3, one per refusal, none retried: %+v", len(log), log)
	}
	if st := s.srv.Stats(); st.Requests != 0 {
		t.Fatalf("the fake Stripe saw %d requests; want 0", st.Requests)
	}
}

// A Stripe 429 that the proxy only forwards stays a Stripe error, so the
// retry layer retries it; only the proxy's own refusal stops.
func TestVaultStripeRateLimitPassesThrough(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 100000})
	api := proxied(t, s.proxyURL)
	for _, kind := range []billingtest.FaultKind{billingtest.FaultLockTimeout, billingtest.FaultRateLimit} {
		s.srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: kind})
		_, err := api.Charges.New(vaultChargeParams("cus_1", "k-"+string(kind), 100))
		var se *stripe.Error
		if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusTooManyRequests || !strings.HasPrefix(se.RequestID, "req_") {
			t.Fatalf("%s: %v; want Stripe's 429 as a *stripe.Error", kind, err)
		}
		var pe *spendcap.ProxyError
		if errors.As(err, &pe) || errors.Is(err, spendcap.ErrSpendCapReached) {
			t.Fatalf("%s: a forwarded Stripe 429 was taken for a proxy refusal: %v", kind, err)
		}
	}
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

func TestNewVaultTransportValidates(t *testing.T) {
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
			if !errors.Is(err, billing.ErrInvalidInput) || !strings.Contains(err.Error(), tt.mentions) {
				t.Fatalf("err = %v; want ErrInvalidInput mentioning %q", err, tt.mentions)
			}
			if strings.Contains(err.Error(), vaultKey) {
				t.Fatalf("error leaks the vault key: %v", err)
			}
		})
	}
	if _, err := spendcap.Client("http://proxy.example.com", vaultKey, nil); !errors.Is(err, billing.ErrInvalidInput) {
		t.Errorf("ProxyClient over remote http: err = %v; want ErrInvalidInput", err)
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
	if !strings.Contains(out.String(), "[redacted …7f3a]") || !strings.Contains(pe.Message, "[redacted …7f3a]") {
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

// billerBehind returns a Biller whose Stripe calls go through s's proxy with
// vaultKey, claims in a fresh PostgreSQL database, every customer owing
// amount usd, and logs written to logs.
func billerBehind(tb testing.TB, s *stack, amount int64, api billing.API, logs io.Writer) (*billing.Biller, *claim.Postgres) {
	tb.Helper()
	// A short lease: a run that stops leaves the claims it was sending
	// leased, and the next run resumes them once the lease is over.
	store, err := claim.NewPostgres(pgtest.Pool(tb), claim.Config{Lease: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	hc, err := spendcap.Client(s.proxyURL, vaultKey, &http.Client{})
	if err != nil {
		tb.Fatal(err)
	}
	if logs == nil {
		logs = io.Discard
	}
	b, err := billing.New(billing.Config{
		SecretKey:  appSecret, // dropped by the transport
		HTTPClient: hc,
		Claims:     store,
		API:        api,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
		Retry:  retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b, store
}

// checkClaims asserts that every customer's claim agrees with the fake's
// ledger: never failed, never charged twice, pending (or never claimed) when
// not charged, and succeeded when charged, or pending when final is false
// (a run that stops abandons requests in flight, whose outcome it does not
// learn; the next run resumes them with the same key). It returns how many
// were charged.
func checkClaims(tb testing.TB, b *billing.Biller, store *claim.Postgres, srv *billingtest.Server, ids []string, final bool) (charged int) {
	tb.Helper()
	ctx := context.Background()
	for _, c := range ids {
		n := srv.CountPeriod(c, "2026-09")
		if n > 1 {
			tb.Errorf("%s charged %d times", c, n)
		}
		charged += n
		key, err := b.Key(c, "2026-09", 1)
		if err != nil {
			tb.Fatal(err)
		}
		cl, err := store.Get(ctx, key.String())
		switch {
		case errors.Is(err, claim.ErrNotFound):
			if n != 0 {
				tb.Errorf("%s charged but never claimed", c)
			}
		case err != nil:
			tb.Fatal(err)
		case n == 1 && cl.State != claim.StateSucceeded && (final || cl.State != claim.StatePending),
			n == 0 && cl.State != claim.StatePending:
			tb.Errorf("%s: charged %d times, claim %s (%s); want succeeded when charged, pending otherwise", c, n, cl.State, cl.LastError)
		}
	}
	return charged
}

func TestVaultBillerRunStopsAtTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	const amount = 3000
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 10000, Per: billingtest.PerDay})
	var logs bytes.Buffer
	b, store := billerBehind(t, s, amount, billing.Charges, &logs)
	ids := customers(20)
	ctx := context.Background()

	sum, err := b.Run(ctx, "2026-09", billing.Customers(ids...), &billing.RunOptions{Concurrency: 4, BatchSize: 5})
	if !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("Run: %v; want ErrSpendCapReached", err)
	}
	if got := paidTotal(s.srv); got != 3*amount {
		t.Fatalf("charged %d at the fake; want %d (3 charges under the cap of 10000)", got, 3*amount)
	}
	if sum.Created > 3 || sum.Failed != 0 || sum.Complete() {
		t.Fatalf("summary %+v; want at most 3 created, none failed, an incomplete run", sum.Progress)
	}
	if got := checkClaims(t, b, store, s.srv, ids, false); got != 3 {
		t.Fatalf("claims agree with %d charges; want 3", got)
	}
	refused := map[string]int{}
	for _, e := range s.px.Log() {
		if e.Refused != "" {
			refused[e.IdempotencyKey]++
		}
	}
	for k, n := range refused {
		if n > 1 {
			t.Errorf("key %s was refused %d times: a cap refusal must not be retried", k, n)
		}
	}
	if len(refused) == 0 || len(refused) > 4 {
		t.Errorf("%d customers were refused; want between 1 and the run's concurrency (4)", len(refused))
	}

	// Once the cap is raised, later runs finish the job with the same keys,
	// charging nobody twice. (The fake's clock stays put: moving it past
	// Stripe's 24-hour key window without moving the database's would
	// resend keys Stripe has forgotten, which billonce reconciles only by
	// the database clock.) Claims abandoned in flight stay leased until the
	// lease ends on the database clock, so run again until complete.
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 100000, Per: billingtest.PerDay})
	deadline := time.Now().Add(10 * time.Second)
	for {
		sum, err = b.Run(ctx, "2026-09", billing.Customers(ids...), nil)
		if err != nil {
			t.Fatalf("later run: %v", err)
		}
		if sum.Complete() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("runs still incomplete after 10s: %+v; failures: %v", sum.Progress, sum.Failures)
		}
	}
	if got := checkClaims(t, b, store, s.srv, ids, true); got != 20 {
		t.Fatalf("%d customers charged; want 20, once each", got)
	}
	s.atProxy.only(t, "the proxy", "Bearer "+vaultKey)
	s.atStripe.only(t, "the fake Stripe", "Bearer "+upstreamKey)
	for _, secret := range []string{vaultKey, appSecret} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the Biller's logs contain a secret %q:\n%s", secret[:8], logs.String())
		}
	}
	if !strings.Contains(logs.String(), "spend cap") {
		t.Errorf("the logs do not mention the cap:\n%s", logs.String())
	}
}

func TestVaultBillerStopsOnRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		want  error
		api   billing.API
		setup func(s *stack)
	}{
		{"endpoint not allowed", spendcap.ErrEndpointNotAllowed, billing.PaymentIntents, func(s *stack) {
			s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 1 << 40, AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges/*"}})
		}},
		{"revoked", spendcap.ErrVaultKeyRevoked, billing.Charges, func(s *stack) {
			s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 1 << 40})
			s.px.Revoke(vaultKey)
		}},
		{"kill switch mid-run", spendcap.ErrVaultKeyRevoked, billing.Charges, func(s *stack) {
			s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 1 << 40})
			var n atomic.Int32
			s.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method == http.MethodPost && n.Add(1) == 5 {
					s.px.KillSwitch(true)
				}
				return billingtest.Fault{}
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, billingtest.ProxyConfig{})
			tt.setup(s)
			var logs bytes.Buffer
			b, store := billerBehind(t, s, 500, tt.api, &logs)
			ids := customers(30)
			sum, err := b.Run(context.Background(), "2026-09", billing.Customers(ids...), &billing.RunOptions{Concurrency: 3, BatchSize: 4})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Run: %v; want %v", err, tt.want)
			}
			if billing.Classify(err) != retry.Stop() {
				t.Errorf("Classify(%v) retries; want Stop", err)
			}
			if sum.Complete() || sum.Failed != 0 {
				t.Errorf("summary %+v; want an incomplete run with nothing failed", sum.Progress)
			}
			charged := checkClaims(t, b, store, s.srv, ids, false)
			if tt.name == "kill switch mid-run" {
				if charged < 5 || charged > 5+3 {
					t.Errorf("%d charged; want the 5 before the switch, plus at most those in flight", charged)
				}
			} else if charged != 0 || s.srv.Stats().Requests != 0 {
				t.Errorf("%d charged, %d requests at the fake; want none", charged, s.srv.Stats().Requests)
			}
			seen := map[string]int{}
			for _, e := range s.px.Log() {
				if e.Refused != "" {
					seen[e.IdempotencyKey]++
				}
			}
			if len(seen) == 0 || len(seen) > 3 {
				t.Errorf("%d customers refused; want between 1 and the run's concurrency (3)", len(seen))
			}
			for k, n := range seen {
				if n != 1 {
					t.Errorf("key %s refused %d times; a refusal is never retried", k, n)
				}
			}
			printed := fmt.Sprintf("%v\n%+v\n%s", err, sum.Failures, logs.String())
			if strings.Contains(printed, vaultKey) || strings.Contains(printed, appSecret) {
				t.Errorf("a secret was logged or returned:\n%s", printed)
			}
		})
	}
}

func TestVaultClassify(t *testing.T) {
	t.Parallel()
	s := newStack(t, billingtest.ProxyConfig{})
	s.px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 100})
	api := proxied(t, s.proxyURL)
	s.srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	_, err := api.Charges.New(vaultChargeParams("cus_1", "k1", 100))
	if billing.Classify(err) == retry.Stop() {
		t.Errorf("Classify(forwarded lock_timeout %v) = Stop; want a retry", err)
	}
	if _, err := api.Charges.New(vaultChargeParams("cus_1", "k1", 100)); err != nil {
		t.Fatal(err)
	}
	_, err = api.Charges.New(vaultChargeParams("cus_2", "k2", 100))
	if !errors.Is(err, spendcap.ErrSpendCapReached) || billing.Classify(err) != retry.Stop() {
		t.Errorf("Classify(cap refusal %v) retries, or the error does not match ErrSpendCapReached", err)
	}
}
