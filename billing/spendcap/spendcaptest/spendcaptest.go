// Package spendcaptest serves the spend-cap proxy of package spendcap on
// loopback for tests: [spendcap.Proxy] on a [spendcap.MemoryStore], with
// the knobs a test needs to issue and revoke vault keys, change caps,
// suspend every key (the proxy's own Suspend) and lose answers after
// Stripe committed. Its
// accounting is the production handler's.
//
// Put it in front of the fake Stripe of package billingtest, on the fake's
// clock, and send requests with a vault key through [spendcap.Client]:
//
//	srv := billingtest.Start(t, billingtest.Config{APIKeys: []string{"sk_test_real"}})
//	px := spendcaptest.NewProxy(spendcaptest.Config{Upstream: srv.URL, StripeKey: "sk_test_real", Clock: srv})
//	defer px.Close()
//	px.IssueKey("vault_run_1", spendcap.Key{CapAmount: 5000, Per: spendcap.PerDay})
//	hc, err := spendcap.Client(px.URL, "vault_run_1", nil)
//
// [Proxy.Usage] and [Proxy.Log] tell what it let through.
package spendcaptest

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"time"

	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/internal/proxyhook"
)

// Config configures a [Proxy]. Upstream and StripeKey are required.
type Config struct {
	// Upstream is the base URL requests are forwarded to, such as a
	// billingtest.Server's URL.
	Upstream string
	// StripeKey is the secret the proxy sends upstream in place of the
	// vault key.
	StripeKey string
	// Clock tells the time for expiry, PerDay caps and counted keys; pass
	// the billingtest.Server to follow its Advance. Defaults to the wall
	// clock.
	Clock interface{ Now() time.Time }
	// CapStatus is the status of a cap refusal: 429
	// (spendcap.DefaultCapStatus), 402 or 412, as different proxies answer.
	CapStatus int
}

// Proxy is a spend-cap proxy listening on loopback: the [spendcap.Proxy]
// it serves, whose Suspend refuses every request while on, and the knobs
// of its store. Its methods are safe for concurrent use.
type Proxy struct {
	*spendcap.Proxy
	// URL is the base URL, http://ipaddr:port with no trailing slash.
	URL string

	store *spendcap.MemoryStore
	clock interface{ Now() time.Time }
	ts    *httptest.Server
}

// NewProxy starts a proxy on a free loopback port and returns it. It
// panics if the configuration is invalid; the message says why. Call Close
// when done.
func NewProxy(cfg Config) *Proxy {
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	store := spendcap.NewMemoryStore()
	h, err := spendcap.NewProxy(spendcap.ProxyConfig{
		Upstream: cfg.Upstream, StripeKey: cfg.StripeKey, Store: store,
		Clock: cfg.Clock, CapStatus: cfg.CapStatus,
	})
	if err != nil {
		panic(fmt.Sprintf("spendcaptest: NewProxy: %v", err))
	}
	// httptest's Close closes unused connections at once and waits for
	// requests in progress.
	ts := httptest.NewUnstartedServer(h)
	ts.Config.ReadHeaderTimeout = 10 * time.Second
	ts.Start()
	return &Proxy{Proxy: h, URL: ts.URL, store: store, clock: cfg.Clock, ts: ts}
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Close stops accepting connections and waits for requests in progress.
func (p *Proxy) Close() { p.ts.Close() }

// IssueKey makes vaultKey valid with k, replacing any key of that name
// (and its spend). It panics on an empty key, a cap that is not positive,
// or a bad allowlist.
func (p *Proxy) IssueKey(vaultKey string, k spendcap.Key) {
	if vaultKey == "" {
		panic("spendcaptest: IssueKey: the vault key is empty")
	}
	if err := p.store.IssueKey(context.Background(), vaultKey, k); err != nil {
		panic("spendcaptest: IssueKey: " + err.Error())
	}
}

// Revoke makes vaultKey invalid: later requests with it answer 401.
// Requests already forwarded finish.
func (p *Proxy) Revoke(vaultKey string) {
	_ = p.store.Revoke(context.Background(), spendcap.KeyID(vaultKey))
}

// SetCap changes vaultKey's cap; what it has spent is kept. It panics on a
// cap that is not positive.
func (p *Proxy) SetCap(vaultKey string, capAmount int64) {
	if err := p.store.SetCap(context.Background(), spendcap.KeyID(vaultKey), capAmount); err != nil {
		panic("spendcaptest: SetCap: " + err.Error())
	}
}

// LoseAnswers makes the proxy settle each forwarded request for which lose
// returns true as usual, and then cut the client's connection without an
// answer: the client cannot tell whether Stripe charged. nil turns it off.
func (p *Proxy) LoseAnswers(lose func(*http.Request) bool) {
	if lose == nil {
		proxyhook.SetBeforeReply(p.Proxy, nil)
		return
	}
	proxyhook.SetBeforeReply(p.Proxy, func(r *http.Request) {
		if lose(r) {
			panic(http.ErrAbortHandler)
		}
	})
}

// Usage returns what vaultKey has spent and holds reserved in its current
// window.
func (p *Proxy) Usage(vaultKey string) spendcap.Usage {
	return p.store.Usage(spendcap.KeyID(vaultKey), p.clock.Now())
}

// Log returns a copy of the proxy's audit log, in the order answers were
// sent. An entry is logged before its answer is written.
func (p *Proxy) Log() []spendcap.Entry { return p.store.Entries() }
