package spendcap_test

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

// A 500 that stored nothing at the upstream (error before execution) marks
// the idempotency key as counted. A resend with that key and a larger
// amount then reserves nothing, yet the upstream executes it afresh: money
// moves past the cap.
func TestAttackUnknownThenBiggerAmountSameKey(t *testing.T) {
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
func TestAttackCountedKeyReusedByOtherVaultKey(t *testing.T) {
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

func (c *stepClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *stepClock) Set(t time.Time) { c.mu.Lock(); c.t = t; c.mu.Unlock() }

// A clock stepped back over midnight and forward again (an NTP step) must
// not give a PerDay key a fresh cap each time its window changes.
func TestAttackPerDayClockSteppedBackAcrossMidnight(t *testing.T) {
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

func TestAttackSpellingsMethodsPaths(t *testing.T) {
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
func TestAttackReplaysCountedOnce(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	const other = "vault_key_test_other_00000000000000008"
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000})
	px.IssueKey(other, spendcap.Key{CapAmount: 1000})
	post(t, px.URL, vaultKey, "r-1", "cus_1", 400)
	post(t, px.URL, vaultKey, "r-1", "cus_1", 400) // replay
	post(t, px.URL, other, "r-1", "cus_1", 400)    // replay via another vault key
	srv.FailNext(billingtest.Match{IdempotencyKey: "r-2"}, billingtest.Fault{Kind: billingtest.FaultCut})
	req, _ := http.NewRequest("POST", px.URL+"/v1/charges", strings.NewReader("amount=300&currency=usd&customer=cus_2&metadata%5B"+billingtest.DefaultPeriodKey+"%5D=2026-09"))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Authorization", "Bearer "+vaultKey)
	req.Header.Set("Idempotency-Key", "r-2")
	if resp, err := http.DefaultClient.Do(req); err == nil {
		resp.Body.Close()
		t.Logf("cut: status %d", resp.StatusCode)
	}
	// The same request, parameters in another order: a replay.
	req, _ = http.NewRequest("POST", px.URL+"/v1/charges", strings.NewReader("customer=cus_2&currency=usd&metadata%5B"+billingtest.DefaultPeriodKey+"%5D=2026-09&amount=300"))
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
func TestAttackCapLoweredInFlight(t *testing.T) {
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
