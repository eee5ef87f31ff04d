package spendcap_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
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

// Stripe forgets an idempotency key after 24 hours; a resend after that is
// a new charge, and the proxy must count it as one.
func TestProxyCountsAResendAfterStripeForgotTheKey(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// A 500 that stored nothing at the upstream (error before execution) marks
// the idempotency key as counted. A resend with that key and a larger
// amount then reserves nothing, yet the upstream executes it afresh: money
// moves past the cap.
func TestUnknownOutcomeThenBiggerAmountStaysUnderCap(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000})
	srv.FailNext(billingtest.Match{IdempotencyKey: "k-unknown"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if a := post(t, px.URL, vaultKey, "k-unknown", "cus_1", 100); a.status != 500 {
		t.Fatalf("first: status %d, want 500", a.status)
	}
	a := post(t, px.URL, vaultKey, "k-unknown", "cus_1", 5000)
	total, _ := paid(srv)
	u := px.Usage(vaultKey)
	t.Logf("resend status %d; paid at fake %d; proxy counted spent %d reserved %d; cap 1000", a.status, total, u.Spent, u.Reserved)
	if total > 1000 || total > u.Spent {
		t.Errorf("moved %d at the fake but the proxy counts %d (cap 1000)", total, u.Spent)
	}
}

// The same, across vault keys: a key with a tiny cap reuses an idempotency
// key another vault key got counted by an unknown outcome.
func TestKeyReusedByAnotherVaultKeyStaysUnderCap(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	const small = "vault_key_test_small_00000000000000007"
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000})
	px.IssueKey(small, spendcap.Key{CapAmount: 10})
	srv.FailNext(billingtest.Match{IdempotencyKey: "k-shared"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	post(t, px.URL, vaultKey, "k-shared", "cus_1", 100)
	a := post(t, px.URL, small, "k-shared", "cus_2", 5000)
	total, _ := paid(srv)
	t.Logf("small-cap key resend status %d; paid at fake %d; small key usage %+v", a.status, total, px.Usage(small))
	if total > 0 && px.Usage(small).Spent < 5000 && a.status < 300 {
		t.Errorf("vault key with cap 10 moved %d at the fake, counted %d", total, px.Usage(small).Spent)
	}
}

type stepClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *stepClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }

func (c *stepClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// A clock stepped back over midnight and forward again (an NTP step) must
// not give a PerDay key a fresh cap each time its window changes.
func TestPerDayCapHoldsWhenClockStepsBackAcrossMidnight(t *testing.T) {
	t.Parallel()
	midnight := time.Date(2026, 9, 2, 0, 0, 0, 0, time.UTC)
	clk := &stepClock{t: midnight.Add(time.Second)}
	srv, px := newProxy(t, spendcaptest.Config{Clock: clk})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerDay})
	for i, at := range []time.Time{midnight.Add(time.Second), midnight.Add(-time.Second), midnight.Add(2 * time.Second)} {
		clk.Set(at)
		a := post(t, px.URL, vaultKey, fmt.Sprintf("day-%d", i), fmt.Sprintf("cus_%d", i), 1000)
		t.Logf("at %s: status %d", at.Format(time.TimeOnly), a.status)
	}
	if total, n := paid(srv); total > 1000 {
		t.Errorf("daily cap 1000 within 3 seconds of clock time: %d payments moved %d at the fake", n, total)
	}
}

func TestCapCountsEverySpellingOfMethodAndPath(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges/*"}})
	meta := "&currency=usd&customer=cus_1"
	cases := []struct{ method, path, ctype, body string }{
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=5000&amount=1" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=1&amount=5000" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=%2B5000" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=0005000" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=5000%00" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "am%6Funt=5000" + meta},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=5000;x=1" + meta},
		{"POST", "/v1/charges", "APPLICATION/X-WWW-FORM-URLENCODED; charset=utf-8", "amount=5000" + meta},
		{"POST", "/v1/charges", "application/json", `{"amount":5000,"currency":"usd","customer":"cus_1"}`},
		{"POST", "/v1/charges", "", "amount=5000" + meta},
		{"POST", "/v1/charges?amount=5000", "application/x-www-form-urlencoded", "currency=usd&customer=cus_1"},
		{"POST", "/v1/charges", "application/x-www-form-urlencoded", "amount=18446744073709556616" + meta},
		{"PUT", "/v1/charges", "application/x-www-form-urlencoded", "amount=5000" + meta},
		{"POST", "/v1/charges/../payment_intents", "application/x-www-form-urlencoded", "amount=5000&confirm=true" + meta},
		{"POST", "/v1/charges/%2E%2E/payment_intents", "application/x-www-form-urlencoded", "amount=5000&confirm=true" + meta},
		{"POST", "/v1/charges%2F..%2Fpayment_intents", "application/x-www-form-urlencoded", "amount=5000&confirm=true" + meta},
		{"POST", "//v1/charges", "application/x-www-form-urlencoded", "amount=5000" + meta},
		{"POST", "/V1/charges", "application/x-www-form-urlencoded", "amount=5000" + meta},
		{"POST", "/v1/payment_intents", "application/x-www-form-urlencoded", "amount=5000&confirm=true" + meta},
	}
	for i, c := range cases {
		conn, err := net.Dial("tcp", strings.TrimPrefix(px.URL, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		ct := ""
		if c.ctype != "" {
			ct = "Content-Type: " + c.ctype + "\r\n"
		}
		fmt.Fprintf(conn, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: sp-%d\r\n%sContent-Length: %d\r\nConnection: close\r\n\r\n%s", c.method, c.path, vaultKey, i, ct, len(c.body), c.body)
		b, _ := io.ReadAll(conn)
		conn.Close()
		line, _, _ := strings.Cut(string(b), "\r\n")
		total, _ := paid(srv)
		t.Logf("%s %s %q: %s; moved so far %d", c.method, c.path, c.body, line, total)
	}
	if total, n := paid(srv); total > 1000 {
		t.Errorf("cap 1000: %d payments moved %d at the fake", n, total)
	}
}

// Replays through the proxy, from another vault key, and after a lost
// answer, are never counted twice; a lost answer resent after Stripe forgot
// the key is counted as the charge it is.
func TestReplaysCountedOnce(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	const other = "vault_key_test_other_00000000000000008"
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000})
	px.IssueKey(other, spendcap.Key{CapAmount: 1000})
	post(t, px.URL, vaultKey, "r-1", "cus_1", 400)
	post(t, px.URL, vaultKey, "r-1", "cus_1", 400) // replay
	post(t, px.URL, other, "r-1", "cus_1", 400)    // replay via another vault key
	srv.FailNext(billingtest.Match{IdempotencyKey: "r-2"}, billingtest.Fault{Kind: billingtest.FaultCut})
	req, _ := http.NewRequest("POST", px.URL+"/v1/charges", strings.NewReader("amount=300&currency=usd&customer=cus_2&metadata%5B"+billing.MetaPeriod+"%5D=2026-09"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Idempotency-Key", "r-2")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Logf("cut: status %d", resp.StatusCode)
	}
	// The same request, parameters in another order: a replay.
	req, _ = http.NewRequest("POST", px.URL+"/v1/charges", strings.NewReader("customer=cus_2&currency=usd&metadata%5B"+billing.MetaPeriod+"%5D=2026-09&amount=300"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Idempotency-Key", "r-2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	total, n := paid(srv)
	u, uo := px.Usage(vaultKey), px.Usage(other)
	t.Logf("reordered resend: status %d replayed=%q; fake moved %d in %d; spent %d + %d", resp.StatusCode, resp.Header.Get("Idempotent-Replayed"), total, n, u.Spent, uo.Spent)
	if u.Spent+uo.Spent != total {
		t.Errorf("fake moved %d, proxy counted %d", total, u.Spent+uo.Spent)
	}
}

// A cap lowered while a request is in flight: the request admitted under
// the old cap finishes, and nothing more is admitted until the spend is
// back under the new cap.
func TestCapLoweredInFlightAdmitsNothingMore(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000})
	release := make(chan struct{})
	srv.FailNext(billingtest.Match{IdempotencyKey: "slow"}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	done := make(chan answer)
	go func() { done <- post(t, px.URL, vaultKey, "slow", "cus_1", 800) }()
	for px.Usage(vaultKey).Reserved == 0 {
		time.Sleep(time.Millisecond)
	}
	px.SetCap(vaultKey, 500)
	b := post(t, px.URL, vaultKey, "after", "cus_2", 100)
	close(release)
	a := <-done
	total, n := paid(srv)
	t.Logf("in flight: %d; after lowering: %d; fake moved %d in %d; usage %+v", a.status, b.status, total, n, px.Usage(vaultKey))
	if b.status < 300 {
		t.Errorf("admitted %d with 800 reserved under a cap lowered to 500", 100)
	}
}

// A proxy configured to believe the upstream keeps idempotency keys longer
// than Stripe's 24 hours (KeyLifetime 72 h): a key resent 30 hours after it
// was counted passes as a replay, but Stripe has forgotten it and charges
// again: with a cap of one charge, two charges would move. NewProxy
// refuses such a lifetime; at 24 hours the resend is reserved, and refused.
func TestKeyLifetimeLongerThanStripesIsRefused(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{APIKeys: []string{upstreamKey}})
	store := spendcap.NewMemoryStore()
	cfg := spendcap.ProxyConfig{Upstream: srv.URL, StripeKey: upstreamKey, Store: store, Clock: srv, KeyLifetime: 72 * time.Hour}
	if _, err := spendcap.NewProxy(cfg); !errors.Is(err, spendcap.ErrInvalid) {
		t.Fatalf("NewProxy with KeyLifetime 72h: %v; want ErrInvalid", err)
	}
	cfg.KeyLifetime = 24 * time.Hour
	px, err := spendcap.NewProxy(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(px)
	t.Cleanup(hs.Close)
	if err := store.IssueKey(context.Background(), vaultKey, spendcap.Key{CapAmount: 1000}); err != nil {
		t.Fatal(err)
	}
	a := post(t, hs.URL, vaultKey, "k-once", "cus_1", 1000)
	srv.Advance(30 * time.Hour)
	b := post(t, hs.URL, vaultKey, "k-once", "cus_1", 1000)
	total, n := paid(srv)
	t.Logf("statuses %d, %d; %d payments moved %d; cap 1000", a.status, b.status, n, total)
	if total > 1000 {
		t.Errorf("a cap of 1000 let %d move in %d payments", total, n)
	}
}
