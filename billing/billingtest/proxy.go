package billingtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Defaults for [ProxyConfig] fields left zero.
const (
	DefaultCapStatus    = http.StatusTooManyRequests
	DefaultMaxProxyBody = 1 << 20
)

// Per says over which span a vault key's cap is counted.
type Per uint8

const (
	// PerRun counts every charge made with the key, for as long as it lives.
	PerRun Per = iota
	// PerDay counts charges per UTC day on the proxy's clock.
	PerDay
)

// VaultKey is a key the fake proxy accepts, with its spend cap and
// allowlist.
type VaultKey struct {
	// Key is what clients send as "Authorization: Bearer <Key>".
	Key string
	// CapAmount is the most the key may charge over Per, in the smallest
	// currency unit, summed over all currencies. It must be positive.
	CapAmount int64
	Per       Per
	// AllowedEndpoints lists "METHOD /path" entries the key may call; a
	// path ending in "*" matches any path with that prefix
	// ("GET /v1/charges/*"). Nil allows every endpoint.
	AllowedEndpoints []string
}

// ProxyConfig configures a [Proxy]. Upstream and StripeKey are required.
type ProxyConfig struct {
	// Upstream is the base URL requests are forwarded to: a [Server]'s
	// URL.
	Upstream string
	// StripeKey is the secret the proxy sends upstream in place of the
	// vault key.
	StripeKey string
	// Clock tells the time for PerDay caps; pass the [Server] to follow
	// [Server.Advance]. Defaults to the wall clock.
	Clock interface{ Now() time.Time }
	// CapStatus is the status of a cap refusal: 429 (DefaultCapStatus), 402
	// or 412, as different proxies answer.
	CapStatus int
	// Addr is the TCP address to listen on. Defaults to DefaultAddr.
	Addr string
}

// Proxy is a fake spend-cap proxy: it holds the real Stripe secret, accepts
// vault keys in its place, forwards only allowed endpoints, and refuses
// payments past a key's cap. It answers as a real proxy does, not as
// Stripe: refusals are JSON objects whose "error" member is a string,
// without a Request-Id header:
//
//	429 (or CapStatus) {"error":"Daily spend cap of $50 reached","cap":5000,"spent":4800,"requested":500}
//	403 {"error":"Endpoint POST /v1/refunds is not allowed for this vault key","allowed_endpoints":[...]}
//	401 {"error":"Vault key revoked"}                                  (also unknown keys, and the kill switch)
//	502 {"error":"Upstream request failed; the outcome is unknown"}
//
// Everything Stripe answers is passed back unchanged.
//
// # Counting spend
//
// A POST carrying an "amount" form parameter reserves that amount before it
// is forwarded; a request that would take spent plus reserved past the cap
// is refused. The reservation is taken under one lock, so concurrent
// requests never overshoot. When Stripe answers, the reservation is
//
//   - settled (counted as spent) on a 2xx;
//   - released on a 2xx marked Idempotent-Replayed: true (the original
//     request was counted) and on a 4xx (nothing was charged);
//   - kept as spent on a 5xx or a lost connection: the outcome is unknown,
//     so the proxy assumes the money moved.
//
// Once an idempotency key has been counted for a vault key, later requests
// with that key reserve nothing: Stripe will replay, not charge again.
//
// Its methods are safe for concurrent use.
type Proxy struct {
	// URL is the base URL, http://ipaddr:port with no trailing slash.
	URL string

	upstream  *url.URL
	stripeKey string
	clock     interface{ Now() time.Time }
	capStatus int
	hs        *httpServer
	tr        *http.Transport
	closeOnce sync.Once
	serveErr  chan error

	mu     sync.Mutex
	keys   map[string]*vaultState
	killed bool
	log    []ProxyEntry
}

type vaultState struct {
	VaultKey
	revoked  bool
	day      time.Time // start of the UTC day spent belongs to, for PerDay
	spent    int64     // settled and unknown outcomes
	reserved int64     // in flight
	counted  map[string]bool
}

// ProxyEntry is one request the proxy answered.
type ProxyEntry struct {
	Time           time.Time `json:"time"`
	VaultKey       string    `json:"vault_key"` // the bearer token the client presented
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Amount         int64     `json:"amount,omitempty"`
	Status         int       `json:"status"`
	// Refused is why the proxy answered itself: "cap", "endpoint",
	// "revoked", "unknown_key", "kill_switch", "upstream",
	// "bad_request"; "" when
	// Stripe's answer was passed back.
	Refused  string `json:"refused,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
}

// Usage is what a vault key has spent in its current window.
type Usage struct {
	Spent    int64 // settled, plus reservations kept on an unknown outcome
	Reserved int64 // in flight now
}

// NewProxy starts a proxy and returns it. It panics if the configuration is
// invalid or it cannot listen; the message says which. Call Close when done.
func NewProxy(cfg ProxyConfig) *Proxy {
	p, err := newProxy(cfg)
	if err != nil {
		panic(err)
	}
	return p
}

func newProxy(cfg ProxyConfig) (*Proxy, error) {
	up, err := url.Parse(cfg.Upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" {
		return nil, fmt.Errorf("billingtest: ProxyConfig.Upstream %q: want the base URL of a Server, such as srv.URL", cfg.Upstream)
	}
	if cfg.StripeKey == "" {
		return nil, errors.New("billingtest: ProxyConfig.StripeKey is empty; set the secret the proxy sends upstream")
	}
	switch cfg.CapStatus {
	case 0:
		cfg.CapStatus = DefaultCapStatus
	case http.StatusPaymentRequired, http.StatusPreconditionFailed, http.StatusTooManyRequests:
	default:
		return nil, fmt.Errorf("billingtest: ProxyConfig.CapStatus %d; want 402, 412 or 429", cfg.CapStatus)
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	p := &Proxy{
		upstream:  up,
		stripeKey: cfg.StripeKey,
		clock:     cfg.Clock,
		capStatus: cfg.CapStatus,
		tr:        &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64},
		serveErr:  make(chan error, 1),
		keys:      make(map[string]*vaultState),
	}
	ln, err := net.Listen("tcp", orDefault(cfg.Addr, DefaultAddr))
	if err != nil {
		return nil, fmt.Errorf("billingtest: listen on %q: %w", orDefault(cfg.Addr, DefaultAddr), err)
	}
	p.URL = "http://" + ln.Addr().String()
	p.hs = newHTTPServer(http.HandlerFunc(p.serveHTTP))
	go func() { p.serveErr <- p.hs.Serve(ln) }()
	return p, nil
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Close stops accepting connections and waits for requests in progress.
func (p *Proxy) Close() {
	p.closeOnce.Do(func() {
		p.hs.shutdown()
		<-p.serveErr
		p.tr.CloseIdleConnections()
	})
}

// IssueKey makes k valid, replacing any key with the same Key (and its
// spend). It panics on an empty key or a cap that is not positive.
func (p *Proxy) IssueKey(k VaultKey) {
	if k.Key == "" || k.CapAmount <= 0 || k.Per > PerDay {
		panic(fmt.Sprintf("billingtest: IssueKey: want a non-empty Key, CapAmount > 0 and Per of PerRun or PerDay; got CapAmount %d, Per %d", k.CapAmount, k.Per))
	}
	k.AllowedEndpoints = slices.Clone(k.AllowedEndpoints)
	p.mu.Lock()
	defer p.mu.Unlock()
	p.keys[k.Key] = &vaultState{VaultKey: k, counted: make(map[string]bool)}
}

// Revoke makes key invalid: later requests with it answer 401. Requests
// already forwarded finish.
func (p *Proxy) Revoke(key string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if st := p.keys[key]; st != nil {
		st.revoked = true
	}
}

// KillSwitch, when on, makes the proxy refuse every request with 401
// until it is turned off.
func (p *Proxy) KillSwitch(on bool) {
	p.mu.Lock()
	p.killed = on
	p.mu.Unlock()
}

// Usage returns what key has spent and holds reserved in its current
// window.
func (p *Proxy) Usage(key string) Usage {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := p.keys[key]
	if st == nil {
		return Usage{}
	}
	p.roll(st)
	return Usage{Spent: st.spent, Reserved: st.reserved}
}

// Log returns a copy of the proxy's request log, in the order answers
// were sent. An entry is logged before its answer is written.
func (p *Proxy) Log() []ProxyEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.log)
}

// roll starts a new window for a PerDay key whose day has passed. Guarded
// by mu.
func (p *Proxy) roll(st *vaultState) {
	if st.Per != PerDay {
		return
	}
	now := p.clock.Now().UTC()
	day := time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
	if !day.Equal(st.day) {
		st.day, st.spent = day, 0
	}
}

func (p *Proxy) serveHTTP(w http.ResponseWriter, r *http.Request) {
	e := ProxyEntry{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key")}
	e.VaultKey, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	body, err := io.ReadAll(io.LimitReader(r.Body, DefaultMaxProxyBody+1))
	if err != nil || len(body) > DefaultMaxProxyBody {
		p.refuse(w, &e, http.StatusBadRequest, "bad_request", map[string]any{"error": "Request body unreadable or over 1 MiB"})
		return
	}
	if r.Method == http.MethodPost {
		if form, err := url.ParseQuery(string(body)); err == nil {
			if a, err := strconv.ParseInt(form.Get("amount"), 10, 64); err == nil && a > 0 {
				e.Amount = a
			}
		}
	}

	// Admission and reservation, under one lock.
	p.mu.Lock()
	st := p.keys[e.VaultKey]
	var refusal func()
	switch {
	case p.killed:
		refusal = func() {
			p.refuse(w, &e, http.StatusUnauthorized, "kill_switch", map[string]any{"error": "All vault keys are suspended: the kill switch is on"})
		}
	case st == nil:
		refusal = func() {
			p.refuse(w, &e, http.StatusUnauthorized, "unknown_key", map[string]any{"error": "Unknown vault key"})
		}
	case st.revoked:
		refusal = func() {
			p.refuse(w, &e, http.StatusUnauthorized, "revoked", map[string]any{"error": "Vault key revoked"})
		}
	case !st.allows(r.Method, r.URL.Path):
		allowed := slices.Clone(st.AllowedEndpoints)
		refusal = func() {
			p.refuse(w, &e, http.StatusForbidden, "endpoint", map[string]any{
				"error":             fmt.Sprintf("Endpoint %s %s is not allowed for this vault key", r.Method, r.URL.Path),
				"allowed_endpoints": allowed,
			})
		}
	}
	reserved := int64(0)
	if refusal == nil && e.Amount > 0 && !st.counted[e.IdempotencyKey] {
		p.roll(st)
		if st.spent+st.reserved+e.Amount > st.CapAmount {
			capAmount, spent, per := st.CapAmount, st.spent+st.reserved, st.Per
			refusal = func() {
				what := "Spend cap of " + dollars(capAmount) + " for this key reached"
				if per == PerDay {
					what = "Daily spend cap of " + dollars(capAmount) + " reached"
				}
				p.refuse(w, &e, p.capStatus, "cap", map[string]any{"error": what, "cap": capAmount, "spent": spent, "requested": e.Amount})
			}
		} else {
			reserved = e.Amount
			st.reserved += reserved
		}
	}
	p.mu.Unlock()
	if refusal != nil {
		refusal()
		return
	}

	resp, err := p.forward(r, body)
	p.mu.Lock()
	st.reserved -= reserved
	switch {
	case err != nil || resp.StatusCode >= 500: // unknown outcome: assume the money moved
		st.spent += reserved
		if e.IdempotencyKey != "" && reserved > 0 {
			st.counted[e.IdempotencyKey] = true
		}
	case resp.StatusCode < 300 && resp.Header.Get("Idempotent-Replayed") != "true":
		st.spent += reserved
		if e.IdempotencyKey != "" && reserved > 0 {
			st.counted[e.IdempotencyKey] = true
		}
	}
	p.mu.Unlock()
	if err != nil {
		p.refuse(w, &e, http.StatusBadGateway, "upstream", map[string]any{"error": "Upstream request failed; the outcome is unknown"})
		return
	}
	defer resp.Body.Close()
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	e.Status, e.Replayed = resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
	p.record(&e) // before the answer, so a client that has it finds it in the log
	w.WriteHeader(resp.StatusCode)
	io.Copy(w, resp.Body)
}

// forward sends r upstream with the real secret; the response body is
// read in full, so a connection cut mid-body is an error (unknown outcome).
func (p *Proxy) forward(r *http.Request, body []byte) (*http.Response, error) {
	u := *p.upstream
	u.Path = strings.TrimRight(u.Path, "/") + r.URL.Path
	u.RawPath = ""
	u.RawQuery = r.URL.RawQuery
	out, err := http.NewRequestWithContext(context.WithoutCancel(r.Context()), r.Method, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range r.Header {
		if !strings.EqualFold(k, "Authorization") && !strings.EqualFold(k, "Connection") {
			out.Header[k] = v
		}
	}
	out.Header.Set("Authorization", "Bearer "+p.stripeKey)
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		return nil, err
	}
	b, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, err
	}
	resp.Body = io.NopCloser(bytes.NewReader(b))
	resp.Header.Del("Content-Length")
	resp.Header.Set("Content-Length", strconv.Itoa(len(b)))
	return resp, nil
}

func (p *Proxy) refuse(w http.ResponseWriter, e *ProxyEntry, status int, why string, body map[string]any) {
	e.Status, e.Refused = status, why
	p.record(e)
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func (p *Proxy) record(e *ProxyEntry) {
	p.mu.Lock()
	e.Time = p.clock.Now()
	p.log = append(p.log, *e)
	p.mu.Unlock()
}

func (st *vaultState) allows(method, path string) bool {
	if st.AllowedEndpoints == nil {
		return true
	}
	for _, a := range st.AllowedEndpoints {
		m, pat, ok := strings.Cut(a, " ")
		if !ok || !strings.EqualFold(m, method) {
			continue
		}
		if prefix, wild := strings.CutSuffix(pat, "*"); wild && strings.HasPrefix(path, prefix) || pat == path {
			return true
		}
	}
	return false
}

// dollars formats an amount in cents: "$50", "$50.25".
func dollars(cents int64) string {
	if cents%100 == 0 {
		return fmt.Sprintf("$%d", cents/100)
	}
	return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
}
