package billingtest

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/billonce/billonce/billing/spendcap"
)

// DefaultCapStatus is the status of a cap refusal when ProxyConfig.CapStatus
// is zero.
const DefaultCapStatus = spendcap.DefaultCapStatus

// Per says over which span a vault key's cap is counted.
type Per = spendcap.Per

// The spans of [Per].
const (
	PerRun = spendcap.PerRun
	PerDay = spendcap.PerDay
)

// VaultKey is a key the fake proxy accepts, with its spend cap and
// allowlist (see [spendcap.Key]).
type VaultKey struct {
	// Key is what clients send as "Authorization: Bearer <Key>".
	Key              string
	CapAmount        int64
	Per              Per
	AllowedEndpoints []string
	ExpiresAt        time.Time
}

// ProxyConfig configures a [Proxy]. Upstream and StripeKey are required.
type ProxyConfig struct {
	// Upstream is the base URL requests are forwarded to: a [Server]'s
	// URL.
	Upstream string
	// StripeKey is the secret the proxy sends upstream in place of the
	// vault key.
	StripeKey string
	// Clock tells the time for expiry, PerDay caps and counted keys; pass
	// the [Server] to follow [Server.Advance]. Defaults to the wall clock.
	Clock interface{ Now() time.Time }
	// CapStatus is the status of a cap refusal: 429 (DefaultCapStatus), 402
	// or 412, as different proxies answer.
	CapStatus int
	// Addr is the TCP address to listen on. Defaults to DefaultAddr.
	Addr string
}

// Proxy is the spend-cap proxy of package spendcap ([spendcap.Proxy]) with
// an in-memory budget store ([spendcap.MemoryStore]), listening on
// loopback, with the knobs tests need: issue and revoke keys, change caps,
// suspend every key, and lose answers. Its methods are safe for concurrent
// use.
type Proxy struct {
	// URL is the base URL, http://ipaddr:port with no trailing slash.
	URL string

	handler   *spendcap.Proxy
	store     *spendcap.MemoryStore
	clock     interface{ Now() time.Time }
	hs        *httpServer
	closeOnce sync.Once
	serveErr  chan error
}

// ProxyEntry is one request the proxy answered: an audit row of
// [spendcap.Entry], which names the vault key only by its
// [spendcap.KeyID].
type ProxyEntry = spendcap.Entry

// Usage is what a vault key has spent and holds reserved in its current
// window.
type Usage = spendcap.Usage

// NewProxy starts a proxy and returns it. It panics if the configuration is
// invalid or it cannot listen; the message says which. Call Close when done.
func NewProxy(cfg ProxyConfig) *Proxy {
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	store := spendcap.NewMemoryStore()
	h, err := spendcap.NewProxy(spendcap.ProxyConfig{
		Upstream: cfg.Upstream, StripeKey: cfg.StripeKey, Store: store,
		Clock: cfg.Clock, CapStatus: cfg.CapStatus,
	})
	if err != nil {
		panic(fmt.Sprintf("billingtest: NewProxy: %v", err))
	}
	ln, err := net.Listen("tcp", orDefault(cfg.Addr, DefaultAddr))
	if err != nil {
		panic(fmt.Sprintf("billingtest: listen on %q: %v", orDefault(cfg.Addr, DefaultAddr), err))
	}
	p := &Proxy{URL: "http://" + ln.Addr().String(), handler: h, store: store, clock: cfg.Clock, serveErr: make(chan error, 1)}
	p.hs = newHTTPServer(h)
	go func() { p.serveErr <- p.hs.Serve(ln) }()
	return p
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Close stops accepting connections and waits for requests in progress.
func (p *Proxy) Close() {
	p.closeOnce.Do(func() {
		p.hs.shutdown()
		<-p.serveErr
	})
}

// IssueKey makes k valid, replacing any key with the same Key (and its
// spend). It panics on an empty key, a cap that is not positive, or a bad
// allowlist.
func (p *Proxy) IssueKey(k VaultKey) {
	if k.Key == "" {
		panic("billingtest: IssueKey: the Key is empty")
	}
	err := p.store.IssueKey(context.Background(), k.Key, spendcap.Key{
		CapAmount: k.CapAmount, Per: k.Per, AllowedEndpoints: k.AllowedEndpoints, ExpiresAt: k.ExpiresAt,
	})
	if err != nil {
		panic("billingtest: IssueKey: " + err.Error())
	}
}

// Revoke makes key invalid: later requests with it answer 401. Requests
// already forwarded finish.
func (p *Proxy) Revoke(key string) {
	_ = p.store.Revoke(context.Background(), spendcap.KeyID(key))
}

// SetCap changes key's cap; what it has spent is kept. It panics on a cap
// that is not positive.
func (p *Proxy) SetCap(key string, capAmount int64) {
	if err := p.store.SetCap(context.Background(), spendcap.KeyID(key), capAmount); err != nil {
		panic("billingtest: SetCap: " + err.Error())
	}
}

// KillSwitch makes the proxy refuse every request with 401 while on is
// true, until it is turned off.
func (p *Proxy) KillSwitch(on bool) { p.handler.Suspend(on) }

// LoseAnswers makes the proxy settle each forwarded request for which lose
// returns true as usual, and then cut the client's connection without an
// answer: the client cannot tell whether Stripe charged. nil turns it off.
func (p *Proxy) LoseAnswers(lose func(*http.Request) bool) {
	if lose == nil {
		p.handler.SetBeforeReply(nil)
		return
	}
	p.handler.SetBeforeReply(func(r *http.Request) {
		if lose(r) {
			panic(http.ErrAbortHandler)
		}
	})
}

// Usage returns what key has spent and holds reserved in its current
// window.
func (p *Proxy) Usage(key string) Usage {
	return p.store.Usage(spendcap.KeyID(key), p.clock.Now())
}

// Log returns a copy of the proxy's audit log, in the order answers were
// sent. An entry is logged before its answer is written.
func (p *Proxy) Log() []ProxyEntry { return p.store.Entries() }
