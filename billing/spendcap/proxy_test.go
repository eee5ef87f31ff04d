package spendcap_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

const (
	upstreamKey = "sk_test_upstream_secret_0000000000009999"
	vaultKey    = "vault_key_test_run_000000000000000042"
)

// newProxy starts a fake Stripe that accepts only upstreamKey and a proxy
// in front of it holding that key.
func newProxy(tb testing.TB, cfg spendcaptest.Config) (*billingtest.Server, *spendcaptest.Proxy) {
	tb.Helper()
	srv := newServer(tb, billingtest.Config{APIKeys: []string{upstreamKey}})
	cfg.Upstream, cfg.StripeKey = srv.URL, upstreamKey
	if cfg.Clock == nil {
		cfg.Clock = srv
	}
	px := spendcaptest.NewProxy(cfg)
	tb.Cleanup(px.Close)
	return srv, px
}

type answer struct {
	status int
	header http.Header
	body   map[string]any
}

// post sends a charge for amount through the proxy with plain net/http.
func post(tb testing.TB, base, bearer, idem, customer string, amount int64) answer {
	tb.Helper()
	form := url.Values{"amount": {fmt.Sprint(amount)}, "currency": {"usd"}, "customer": {customer}, "metadata[" + billing.MetaPeriod + "]": {"2026-09"}}
	req, err := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(form.Encode()))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+bearer)
	if idem != "" {
		req.Header.Set("Idempotency-Key", idem)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST /v1/charges: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	a := answer{status: resp.StatusCode, header: resp.Header}
	if err := json.Unmarshal(b, &a.body); err != nil {
		tb.Fatalf("body %q is not a JSON object: %v", b, err)
	}
	return a
}

// paid sums the amounts of payments that moved money at the fake.
func paid(srv *billingtest.Server) (total int64, n int) {
	for _, p := range srv.Payments() {
		if p.Paid {
			total += p.Amount
			n++
		}
	}
	return total, n
}

func TestProxyCapPerRun(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 10000})

	var refused answer
	for i := range 10 {
		a := post(t, px.URL, vaultKey, fmt.Sprintf("runaway-%d", i), "cus_1", 4200)
		if a.status != http.StatusOK {
			refused = a
			break
		}
	}
	if got, n := paid(srv); got != 8400 || n != 2 {
		t.Fatalf("paid at the fake = %d in %d payments; want 8400 in 2 (cap 10000)", got, n)
	}
	if refused.status != http.StatusTooManyRequests {
		t.Fatalf("refusal status = %d; want 429", refused.status)
	}
	if msg, ok := refused.body["error"].(string); !ok || msg != "Spend cap of $100 for this key reached" {
		t.Errorf(`refusal "error" = %#v; want the string "Spend cap of $100 for this key reached"`, refused.body["error"])
	}
	if rid := refused.header.Get("Request-Id"); rid != "" {
		t.Errorf("refusal carries Request-Id %q; a proxy's own answer has none", rid)
	}
	if u := px.Usage(vaultKey); u != (spendcap.Usage{Spent: 8400}) {
		t.Errorf("Usage = %+v; want Spent 8400, nothing reserved", u)
	}
}

func TestProxyReplaysDoNotConsumeCap(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 5000})
	for i := range 5 {
		if a := post(t, px.URL, vaultKey, "cus_1/2026-09", "cus_1", 4200); a.status != http.StatusOK {
			t.Fatalf("attempt %d: status %d %v; want 200 (a replay)", i, a.status, a.body)
		}
	}
	if n := srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Fatalf("charged %d times; want 1", n)
	}
	if u := px.Usage(vaultKey); u.Spent != 4200 || u.Reserved != 0 {
		t.Fatalf("Usage = %+v; want Spent 4200: replays are not counted", u)
	}
	replayed := 0
	for _, e := range px.Log() {
		if e.Replayed {
			replayed++
		}
	}
	if replayed != 4 {
		t.Errorf("proxy logged %d replays; want 4", replayed)
	}
}

func TestProxyConcurrentChargesAtTheEdgeDoNotOvershoot(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	const amount, fit = 200, 25
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: amount * fit})

	var wg sync.WaitGroup
	statuses := make([]int, 50)
	for i := range statuses {
		wg.Go(func() {
			statuses[i] = post(t, px.URL, vaultKey, fmt.Sprintf("edge-%d", i), fmt.Sprintf("cus_%d", i), amount).status
		})
	}
	wg.Wait()
	ok, capped := 0, 0
	for _, s := range statuses {
		switch s {
		case http.StatusOK:
			ok++
		case http.StatusTooManyRequests:
			capped++
		default:
			t.Errorf("unexpected status %d", s)
		}
	}
	total, n := paid(srv)
	if total > amount*fit {
		t.Fatalf("paid %d at the fake; the cap is %d", total, amount*fit)
	}
	if ok != fit || capped != 50-fit || n != fit || total != amount*fit {
		t.Fatalf("ok=%d capped=%d payments=%d total=%d; want %d ok, %d capped, %d payments of %d", ok, capped, n, total, fit, 50-fit, fit, amount)
	}
}

func TestProxyUnknownOutcomeStaysCounted(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 4200})

	// Stripe commits, then the connection is cut: the proxy cannot know.
	srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	a := post(t, px.URL, vaultKey, "cus_1/2026-09", "cus_1", 4200)
	if a.status != http.StatusBadGateway {
		t.Fatalf("status = %d %v; want 502", a.status, a.body)
	}
	if u := px.Usage(vaultKey); u.Spent != 4200 {
		t.Fatalf("after an unknown outcome Usage = %+v; want Spent 4200 (assume the money moved)", u)
	}
	// A retry with the same key needs no more cap: Stripe replays.
	if a := post(t, px.URL, vaultKey, "cus_1/2026-09", "cus_1", 4200); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("retry: status %d, replayed %q; want a 200 replay", a.status, a.header.Get("Idempotent-Replayed"))
	}
	// A new key for the same customer is a new charge, and past the cap.
	if a := post(t, px.URL, vaultKey, "a-fresh-uuid", "cus_1", 4200); a.status != http.StatusTooManyRequests {
		t.Fatalf("new key: status %d; want 429", a.status)
	}
	if n := srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Fatalf("charged %d times; want 1", n)
	}
	if u := px.Usage(vaultKey); u.Spent != 4200 {
		t.Fatalf("Usage = %+v; want Spent 4200", u)
	}
}

func TestProxyDefinitiveFailuresRelease(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 4200})
	srv.Decline("cus_declined", "insufficient_funds")

	if a := post(t, px.URL, vaultKey, "k1", "cus_declined", 4200); a.status != http.StatusPaymentRequired {
		t.Fatalf("decline: status %d; want Stripe's 402", a.status)
	} else if _, isObject := a.body["error"].(map[string]any); !isObject || !strings.HasPrefix(a.header.Get("Request-Id"), "req_") {
		t.Fatalf("decline answer %v (Request-Id %q); want Stripe's error object passed through", a.body, a.header.Get("Request-Id"))
	}
	// A Stripe 429 is forwarded untouched and releases its reservation.
	srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	if a := post(t, px.URL, vaultKey, "k2", "cus_1", 4200); a.status != http.StatusTooManyRequests || a.header.Get("Request-Id") == "" {
		t.Fatalf("lock_timeout: status %d, Request-Id %q; want Stripe's 429", a.status, a.header.Get("Request-Id"))
	}
	if u := px.Usage(vaultKey); u != (spendcap.Usage{}) {
		t.Fatalf("Usage = %+v; want nothing spent after a decline and a 429", u)
	}
	if a := post(t, px.URL, vaultKey, "k2", "cus_1", 4200); a.status != http.StatusOK {
		t.Fatalf("the whole cap is still there: status %d %v; want 200", a.status, a.body)
	}
}

func TestProxyRefusals(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	allowed := []string{"POST /v1/payment_intents", "GET /v1/payment_intents/*"}
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100000, AllowedEndpoints: allowed})
	px.IssueKey("vault_other", spendcap.Key{CapAmount: 100000})

	a := post(t, px.URL, vaultKey, "k1", "cus_1", 100)
	if a.status != http.StatusForbidden {
		t.Fatalf("blocked endpoint: status %d; want 403", a.status)
	}
	if got := fmt.Sprint(a.body["allowed_endpoints"]); got != fmt.Sprint([]any{allowed[0], allowed[1]}) {
		t.Errorf("allowed_endpoints = %s; want %v", got, allowed)
	}
	if a := post(t, px.URL, "vault_nobody_issued", "k1", "cus_1", 100); a.status != http.StatusUnauthorized {
		t.Errorf("unknown key: status %d; want 401", a.status)
	}
	px.Revoke("vault_other")
	if a := post(t, px.URL, "vault_other", "k1", "cus_1", 100); a.status != http.StatusUnauthorized || a.body["error"] != "Vault key revoked" {
		t.Errorf("revoked key: %d %v; want 401 Vault key revoked", a.status, a.body)
	}
	px.IssueKey("vault_third", spendcap.Key{CapAmount: 100000})
	px.Suspend(true)
	if a := post(t, px.URL, "vault_third", "k1", "cus_1", 100); a.status != http.StatusUnauthorized {
		t.Errorf("kill switch: status %d; want 401", a.status)
	}
	if st := srv.Stats(); st.Requests != 0 {
		t.Fatalf("the fake Stripe saw %d requests; refusals must forward nothing", st.Requests)
	}
	px.Suspend(false)
	if a := post(t, px.URL, "vault_third", "k1", "cus_1", 100); a.status != http.StatusOK {
		t.Errorf("kill switch off: status %d %v; want 200", a.status, a.body)
	}
	var why []string
	for _, e := range px.Log() {
		why = append(why, string(e.Refused))
	}
	if got, want := strings.Join(why, ","), "endpoint,unknown_key,revoked,kill_switch,"; got != want {
		t.Errorf("log refusals = %q; want %q", got, want)
	}
}

func TestProxyPerDayCapFollowsTheServerClock(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 5000, Per: spendcap.PerDay})
	if a := post(t, px.URL, vaultKey, "d1", "cus_1", 5000); a.status != http.StatusOK {
		t.Fatalf("status %d; want 200", a.status)
	}
	a := post(t, px.URL, vaultKey, "d2", "cus_2", 1)
	if a.status != http.StatusTooManyRequests || a.body["error"] != "Daily spend cap of $50 reached" {
		t.Fatalf("same day: %d %v; want 429 Daily spend cap of $50 reached", a.status, a.body)
	}
	srv.Advance(24 * time.Hour)
	if a := post(t, px.URL, vaultKey, "d2", "cus_2", 1); a.status != http.StatusOK {
		t.Fatalf("next day: %d %v; want 200", a.status, a.body)
	}
}

func TestProxyCapStatus(t *testing.T) {
	t.Parallel()
	for _, status := range []int{http.StatusPaymentRequired, http.StatusPreconditionFailed} {
		_, px := newProxy(t, spendcaptest.Config{CapStatus: status})
		px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1})
		if a := post(t, px.URL, vaultKey, "k", "cus_1", 2); a.status != status {
			t.Errorf("CapStatus %d: got %d", status, a.status)
		}
	}
	defer func() {
		if r := recover(); r == nil || !strings.Contains(fmt.Sprint(r), "CapStatus 500") {
			t.Errorf("CapStatus 500: panic %v; want one naming the field", r)
		}
	}()
	spendcaptest.NewProxy(spendcaptest.Config{Upstream: "http://127.0.0.1:1", StripeKey: "sk", CapStatus: 500})
}

// The proxy presents its own secret upstream, never the vault key; the
// fake, configured to accept only that secret, would refuse anything else.
func TestProxySendsOnlyItsSecretUpstream(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100})
	if a := post(t, px.URL, vaultKey, "k", "cus_1", 100); a.status != http.StatusOK {
		t.Fatalf("status %d %v; want 200", a.status, a.body)
	}
	if a := post(t, srv.URL, vaultKey, "k2", "cus_1", 100); a.status != http.StatusUnauthorized {
		t.Fatalf("the fake accepted the vault key directly (status %d)", a.status)
	}
}

// BenchmarkProxyCharge compares a charge sent to the fake directly with one
// sent through the proxy.
func BenchmarkProxyCharge(b *testing.B) {
	srv, px := newProxy(b, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1 << 62})
	for _, bc := range []struct{ name, url, key string }{
		{"direct", srv.URL, upstreamKey},
		{"proxied", px.URL, vaultKey},
	} {
		b.Run(bc.name, func(b *testing.B) {
			i := 0
			for b.Loop() {
				i++
				if a := post(b, bc.url, bc.key, fmt.Sprintf("%s-%d", bc.name, i), "cus_1", 100); a.status != http.StatusOK {
					b.Fatalf("status %d", a.status)
				}
			}
		})
	}
}

// Close does not wait on a connection a client opened and never used.
func TestProxyCloseDoesNotWaitForUnusedConnections(t *testing.T) {
	t.Parallel()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	p := spendcaptest.NewProxy(spendcaptest.Config{Upstream: srv.URL, StripeKey: "sk_test_upstream"})
	c, err := net.Dial("tcp", strings.TrimPrefix(p.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	go func() { p.Close(); close(done) }()
	<-done // a Close that waited for the connection would never return: it stays open until the test ends
}

func newServer(tb testing.TB, cfg billingtest.Config) *billingtest.Server {
	tb.Helper()
	srv := billingtest.NewServer(cfg)
	tb.Cleanup(srv.Close)
	return srv
}
