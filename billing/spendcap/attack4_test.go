package spendcap_test

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
)

// A proxy configured to believe the upstream keeps idempotency keys longer
// than Stripe's 24 hours (KeyLifetime 72 h): a key resent 30 hours after it
// was counted passes as a replay, but Stripe has forgotten it and charges
// again: with a cap of one charge, two charges would move. NewProxy
// refuses such a lifetime; at 24 hours the resend is reserved, and refused.
func TestAttack4KeyLifetimeLongerThanStripes(t *testing.T) {
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
