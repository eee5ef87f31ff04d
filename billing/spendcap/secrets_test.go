package spendcap_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/internal/proxyhook"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of loggers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// The Stripe secret and vault keys in clear never appear in what the proxy
// answers, its audit rows and every other row of its PostgreSQL store, the
// errors of the proxy, the store and the client transport, or anything
// logged while the proxy works, whatever goes wrong: refusals of every
// kind, a lost answer, an upstream that is down or that refuses the
// secret, configuration mistakes. Not parallel: it captures the process's
// default loggers.
func TestSecretsNeverLeak(t *testing.T) {
	const (
		secret      = "sk_test_proxy_holds_this_51Hq8xZk2LmN7pQr4sTu9999"
		wrongSecret = "sk_test_rotated_away_0f9e8d7c6b5a4f3e2d1c0b9a8888"
		vk          = "vault_run_secret_test_7y6t5r4e3w2q1a0z9x8c7v6b"
		otherVK     = "vault_run_secret_test_other_k3j4h5g6f7d8s9a0"
	)
	// Partial redactions must not give away the bulk of a secret either.
	forbidden := []string{secret, wrongSecret, vk, otherVK}
	for _, s := range []string{secret, wrongSecret, vk, otherVK} {
		forbidden = append(forbidden, s[len(s)/3:len(s)-4])
	}

	var logged syncBuffer
	oldOut, oldFlags, oldSlog := log.Writer(), log.Flags(), slog.Default()
	log.SetOutput(&logged)
	slog.SetDefault(slog.New(slog.NewTextHandler(&logged, &slog.HandlerOptions{Level: slog.LevelDebug})))
	t.Cleanup(func() { log.SetOutput(oldOut); log.SetFlags(oldFlags); slog.SetDefault(oldSlog) })

	ctx := context.Background()
	pool := pgtest.Pool(t)
	store, err := spendcap.NewPostgresStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	srv := newServer(t, billingtest.Config{APIKeys: []string{secret}})
	if err := store.IssueKey(ctx, vk, spendcap.Key{CapAmount: 1000, AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges/*"}}, "secret test"); err != nil {
		t.Fatal(err)
	}
	if err := store.IssueKey(ctx, otherVK, spendcap.Key{CapAmount: 1000}, "revoked later"); err != nil {
		t.Fatal(err)
	}

	var seen []string // every answer, error and row, to be searched at the end
	serve := func(upstream, stripeKey string) (*spendcap.Proxy, string) {
		p, err := spendcap.NewProxy(spendcap.ProxyConfig{Upstream: upstream, StripeKey: stripeKey, Store: store, Clock: srv})
		if err != nil {
			t.Fatal(err)
		}
		hs := httptest.NewUnstartedServer(p)
		hs.Config.ErrorLog = log.New(&logged, "http: ", 0)
		hs.Start()
		t.Cleanup(hs.Close)
		return p, hs.URL
	}
	px, pxURL := serve(srv.URL, secret)
	_, downURL := serve("http://127.0.0.1:1", secret) // nothing listens there
	_, wrongURL := serve(srv.URL, wrongSecret)        // Stripe refuses the secret

	send := func(base, method, path, bearer, idem, query string, form url.Values) {
		t.Helper()
		u := base + path
		if query != "" {
			u += "?" + query
		}
		req, err := http.NewRequest(method, u, strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+bearer)
		if idem != "" {
			req.Header.Set("Idempotency-Key", idem)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			seen = append(seen, err.Error())
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var h bytes.Buffer
		resp.Header.Write(&h)
		seen = append(seen, fmt.Sprintf("%s %s -> %d\n%s\n%s", method, path, resp.StatusCode, h.String(), b))
	}
	charge := func(amount int64) url.Values {
		return url.Values{"amount": {fmt.Sprint(amount)}, "currency": {"usd"}, "customer": {"cus_1"}}
	}

	send(pxURL, "POST", "/v1/charges", vk, "k1", "", charge(400))                  // charged
	send(pxURL, "POST", "/v1/charges", vk, "k1", "", charge(400))                  // replayed
	send(pxURL, "POST", "/v1/charges", vk, "k2", "", charge(900))                  // over the cap
	send(pxURL, "POST", "/v1/charges", vk, "k3", "", charge(1<<62))                // above the cap
	send(pxURL, "POST", "/v1/refunds", vk, "k4", "", url.Values{"charge": {"ch"}}) // endpoint
	send(pxURL, "POST", "/v1/charges", vk, "k5", "amount=5", charge(5))            // amount in the query
	send(pxURL, "POST", "/v1/charges", vk, "k6", "", url.Values{"amount": {"1e3"}})
	send(pxURL, "POST", "/v1/charges", secret, "k7", "", charge(5)) // the secret sent as a vault key
	send(pxURL, "POST", "/v1/charges", "", "k8", "", charge(5))
	send(pxURL, "GET", "/v1/charges/ch_missing", vk, "", "", nil)
	send(downURL, "POST", "/v1/charges", vk, "k9", "", charge(5))        // upstream down: 502
	send(wrongURL, "POST", "/v1/charges", vk, "k10", "", charge(5))      // Stripe refuses the secret
	send(wrongURL, "POST", "/v1/charges", otherVK, "k11", "", charge(5)) // the other key, before revocation
	proxyhook.SetBeforeReply(px, func(*http.Request) { panic(http.ErrAbortHandler) })
	send(pxURL, "POST", "/v1/charges", vk, "k12", "", charge(5)) // answer lost after Stripe charged
	proxyhook.SetBeforeReply(px, nil)
	if err := store.Revoke(ctx, spendcap.KeyID(otherVK)); err != nil {
		t.Fatal(err)
	}
	send(pxURL, "POST", "/v1/charges", otherVK, "k13", "", charge(5))
	px.Suspend(true)
	send(pxURL, "POST", "/v1/charges", vk, "k14", "", charge(5))
	px.Suspend(false)

	// The client side: the errors a caller sees, and the transport printed.
	hc, err := spendcap.Client(pxURL, vk, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Post(pxURL+"/v1/refunds", "application/x-www-form-urlencoded", strings.NewReader("charge=ch_1"))
	if err == nil {
		resp.Body.Close()
		t.Fatal("a refused endpoint gave no error at the client")
	}
	if !errors.Is(err, spendcap.ErrEndpointNotAllowed) {
		t.Errorf("client error %v; want ErrEndpointNotAllowed", err)
	}
	var pe *spendcap.ProxyError
	if errors.As(err, &pe) {
		seen = append(seen, fmt.Sprintf("%v %+v %#v", pe, pe, pe))
	}
	seen = append(seen, err.Error(), fmt.Sprintf("%v %+v %#v %s", hc.Transport, hc.Transport, hc.Transport, hc.Transport))
	slog.Info("transport", "t", hc.Transport)

	// Configuration mistakes that carry a secret.
	for _, cfg := range []spendcap.ProxyConfig{
		{Upstream: "https://user:" + secret + "@api.stripe.com", StripeKey: secret, Store: store},
		{Upstream: "https://api.stripe.com?key=" + secret, StripeKey: secret, Store: store},
		{Upstream: "https://api.stripe.com", StripeKey: secret + " \n", Store: store},
		{Upstream: "https://api.stripe.com", StripeKey: secret},
	} {
		if _, err := spendcap.NewProxy(cfg); err == nil {
			t.Errorf("NewProxy(%q) accepted a bad configuration", cfg.Upstream)
		} else {
			seen = append(seen, err.Error())
		}
	}
	for _, k := range []spendcap.Key{{CapAmount: 0}, {CapAmount: 5, AllowedEndpoints: []string{"bad entry"}}} {
		if err := store.IssueKey(ctx, vk+"x", k, ""); err == nil {
			t.Errorf("IssueKey(%+v) accepted a bad key", k)
		} else {
			seen = append(seen, err.Error())
		}
	}
	if _, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "http://proxy.example.com", VaultKey: vk}); err == nil {
		t.Error("NewTransport accepted a remote http proxy")
	} else {
		seen = append(seen, err.Error())
	}

	// The audit rows, as the store returns them and as every spendcap
	// table holds them.
	entries, err := store.Entries(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) < 14 {
		t.Errorf("%d audit rows; want one per request, at least 14", len(entries))
	}
	js, _ := json.Marshal(entries)
	seen = append(seen, string(js))
	rows, err := pool.Query(ctx, `SELECT table_name FROM information_schema.tables WHERE table_name LIKE 'spendcap%'`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		tables = append(tables, n)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	for _, tb := range tables {
		var dump string
		if err := pool.QueryRow(ctx, fmt.Sprintf(`SELECT coalesce(string_agg(to_jsonb(t)::text, E'\n'), '') FROM %q t`, tb)).Scan(&dump); err != nil {
			t.Fatal(err)
		}
		seen = append(seen, tb+":\n"+dump)
	}
	seen = append(seen, "log:\n"+logged.String())

	all := strings.Join(seen, "\n")
	for _, s := range forbidden {
		if strings.Contains(all, s) {
			t.Errorf("%q appears in what the proxy answered, stored, returned or logged:\n%s", s, all)
		}
	}
	for _, want := range []string{"Spend cap", "not allowed", "Vault key revoked", "spendcap_audit:", spendcap.KeyID(vk)} {
		if !strings.Contains(all, want) {
			t.Errorf("%q missing: the test did not see what it meant to check", want)
		}
	}
	if testing.Verbose() {
		t.Log(all)
	}
}
