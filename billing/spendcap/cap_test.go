package spendcap_test

import (
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

// Stripe forgets an idempotency key after 24 hours; a resend after that is
// a new charge, and the proxy must count it as one.
func TestProxyCountsAResendAfterStripeForgotTheKey(t *testing.T) {
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerRun})
	if a := post(t, px.URL, vaultKey, "key-1", "cus_a", 600); a.status != http.StatusOK {
		t.Fatalf("first: %d %v", a.status, a.body)
	}
	// Within the lifetime, a resend is a replay and reserves nothing.
	srv.Advance(23 * time.Hour)
	if a := post(t, px.URL, vaultKey, "key-1", "cus_a", 600); a.status != http.StatusOK || a.header.Get("Idempotent-Replayed") != "true" {
		t.Fatalf("resend after 23h: %d replayed=%q %v; want a 200 replay", a.status, a.header.Get("Idempotent-Replayed"), a.body)
	}
	if u := px.Usage(vaultKey); u.Spent != 600 || u.Reserved != 0 {
		t.Fatalf("usage after the replay = %+v; want 600 spent", u)
	}
	srv.Advance(2 * time.Hour)
	a := post(t, px.URL, vaultKey, "key-1", "cus_a", 600)
	if a.status != http.StatusTooManyRequests {
		t.Errorf("resend after 25h: status %d %v; want 429: Stripe would charge it anew", a.status, a.body)
	}
	if total, n := paid(srv); total > 1000 {
		t.Fatalf("moved %d in %d payments at the fake; cap 1000", total, n)
	}
}

// Stripe reads parameters from the URL query as well as the body; the
// proxy counts only the body, so it refuses writes with a query, and
// amounts it cannot read as Stripe would.
func TestProxyRefusesAmountsItCannotCount(t *testing.T) {
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerRun})
	base := url.Values{"currency": {"usd"}, "customer": {"cus_q"}}.Encode()
	for i, c := range []struct{ query, body, contentType string }{
		{"?amount=5000", base, "application/x-www-form-urlencoded"},
		{"?amount=5000", base + "&amount=1", "application/x-www-form-urlencoded"},
		{"?", base + "&amount=5000", "application/x-www-form-urlencoded"},
		{"", base + "&amount=1&amount=5000", "application/x-www-form-urlencoded"},
		{"", base + "&amount=%2B5000", "application/x-www-form-urlencoded"},
		{"", base + "&amount=5e3", "application/x-www-form-urlencoded"},
		{"", base + "&amount=-5", "application/x-www-form-urlencoded"},
		{"", base + "&amount=5000", "text/plain"},
		{"", `{"amount":5000,"currency":"usd","customer":"cus_q"}`, "application/json"},
	} {
		req, _ := http.NewRequest(http.MethodPost, px.URL+"/v1/charges"+c.query, strings.NewReader(c.body))
		req.Header.Set("Content-Type", c.contentType)
		req.Header.Set("Authorization", "Bearer "+vaultKey)
		req.Header.Set("Idempotency-Key", fmt.Sprint("key-q", i))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusBadRequest {
			t.Errorf("POST /v1/charges%s %s (%s): %d %s; want 400 from the proxy", c.query, c.body, c.contentType, resp.StatusCode, b)
		}
	}
	if total, n := paid(srv); total > 1000 {
		t.Fatalf("moved %d in %d payments at the fake; cap 1000", total, n)
	}
}

// A huge amount in flight must not wrap spent+reserved+amount and let
// later requests through; an amount above the cap is refused outright.
func TestProxySumsCannotWrap(t *testing.T) {
	srv := newServer(t, billingtest.Config{APIKeys: []string{upstreamKey}})
	// An upstream that holds the huge request until released, so that it
	// is in flight while the others arrive.
	huge := int64(math.MaxInt64 - 500)
	up, _ := url.Parse(srv.URL)
	rp := httputil.NewSingleHostReverseProxy(up)
	release, arrived := make(chan struct{}), make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(strings.NewReader(string(b)))
		if strings.Contains(string(b), fmt.Sprint(huge)) {
			close(arrived)
			<-release
		}
		rp.ServeHTTP(w, r)
	}))
	defer slow.Close()
	px := spendcaptest.NewProxy(spendcaptest.Config{Upstream: slow.URL, StripeKey: upstreamKey, Clock: srv})
	defer px.Close()
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerRun})
	post(t, px.URL, vaultKey, "a", "cus_1", 600)
	done := make(chan answer)
	go func() { done <- post(t, px.URL, vaultKey, "huge", "cus_2", huge) }()
	var hugeAnswer answer
	select {
	case <-arrived:
		defer func() { <-done }()
	case hugeAnswer = <-done:
	}
	for i := range 5 {
		post(t, px.URL, vaultKey, fmt.Sprint("n", i), fmt.Sprint("cus_n", i), 600)
	}
	close(release)
	if total, n := paid(srv); total > 1000 {
		t.Fatalf("moved %d in %d payments at the fake; cap 1000", total, n)
	}
	if hugeAnswer.status != http.StatusTooManyRequests || !strings.Contains(fmt.Sprint(hugeAnswer.body["error"]), "above the spend cap") {
		t.Errorf("huge amount: %d %v; want 429 saying it is above the cap", hugeAnswer.status, hugeAnswer.body)
	}
}

// net/http resends a request with an Idempotency-Key by itself when a
// reused connection closes before the answer; the resend is answered as a
// replay, which the proxy releases. The proxy must never resend: each
// request it forwards arrives at most once.
func TestProxyNeverResendsUpstreamByItself(t *testing.T) {
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerRun})
	post(t, px.URL, vaultKey, "warm", "cus_w", 100) // opens the connection the next request reuses
	srv.FailNext(billingtest.Match{Customer: "cus_d"}, billingtest.Fault{Kind: billingtest.FaultDrop})
	if a := post(t, px.URL, vaultKey, "dropped", "cus_d", 600); a.status != http.StatusBadGateway {
		t.Errorf("dropped: %d %v; want 502", a.status, a.body)
	}
	total, _ := paid(srv)
	if u := px.Usage(vaultKey); total > u.Spent {
		t.Errorf("moved %d at the fake; the proxy counted %d", total, u.Spent)
	}
	for i := range 3 {
		post(t, px.URL, vaultKey, fmt.Sprint("after", i), fmt.Sprint("cus_", i), 300)
	}
	if total, n := paid(srv); total > 1000 {
		t.Fatalf("moved %d in %d payments at the fake; cap 1000", total, n)
	}
}
