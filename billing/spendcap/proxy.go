package spendcap

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"mime"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/billonce/billonce/internal/proxyhook"
	"github.com/billonce/billonce/internal/redact"
)

// maxBody is the largest request body the proxy reads.
const maxBody = 1 << 20

// Defaults for [ProxyConfig] fields left zero.
const (
	DefaultCapStatus = http.StatusTooManyRequests
	// DefaultKeyLifetime is how long Stripe keeps an idempotency key.
	DefaultKeyLifetime = 24 * time.Hour
)

// Defaults stated in ProxyConfig's field docs.
const (
	defaultClockSkew       = 5 * time.Minute
	defaultUpstreamTimeout = 80 * time.Second
)

// ProxyConfig configures a [Proxy]. Upstream, StripeKey and Store are
// required.
type ProxyConfig struct {
	// Upstream is the base URL requests are forwarded to, such as
	// "https://api.stripe.com".
	Upstream string
	// StripeKey is the secret the proxy sends upstream in place of the
	// vault key. It never appears in answers, logs or audit rows.
	StripeKey string
	// Store keeps the keys, budgets and audit rows.
	Store Store
	// Clock tells the time for expiry, PerDay caps and counted keys.
	// Defaults to the wall clock.
	Clock interface{ Now() time.Time }
	// CapStatus is the status of a cap refusal: 429 (DefaultCapStatus),
	// 402 or 412.
	CapStatus int
	// KeyLifetime is how long the upstream keeps an idempotency key
	// (DefaultKeyLifetime, and at most that: Stripe keeps keys for at
	// least 24 hours, and may forget them from then on); ClockSkew (5
	// minutes by default: how far the proxy's clock may be ahead of
	// Stripe's) is subtracted from it. A key counted longer ago
	// than that is reserved again when it is resent: the upstream may
	// charge it anew.
	KeyLifetime, ClockSkew time.Duration
	// UpstreamTimeout bounds one forwarded request (80 seconds by
	// default). A request that times out keeps its
	// reservation: its outcome is unknown.
	UpstreamTimeout time.Duration
	// Transport sends requests upstream. Defaults to a transport of its
	// own that ignores proxy environment variables.
	Transport http.RoundTripper
	// Observe, when set, is called with each audit entry the proxy
	// records, one per request, admitted (Refused empty) or refused, once
	// the entry is stored and before the answer is written: for metrics
	// (billingotel's Observer.ObserveProxy). An Entry holds no secret. It
	// must be fast and safe for concurrent use.
	Observe func(Entry)
}

// Proxy is a spend-cap proxy as an [http.Handler]: it holds the Stripe
// secret, accepts vault keys in its place, forwards only allowed
// endpoints, and refuses payments past a key's cap. Refusals are JSON
// objects whose "error" member is a string, without a admitRequest-Id header,
// as a [Transport] expects:
//
//	429 (or CapStatus) {"error":"Daily spend cap of $50 reached","cap":5000,"spent":4800,"requested":500}
//	403 {"error":"Endpoint POST /v1/refunds is not allowed for this vault key","allowed_endpoints":[...]}
//	401 {"error":"Vault key revoked"}          (also expired and unknown keys, and Suspend)
//	400 {"error":"..."}                         (a request whose amount the proxy cannot count)
//	502 {"error":"Upstream request failed; the outcome is unknown"}
//
// Everything Stripe answers is passed back unchanged. A Proxy printed with
// fmt or slog shows no secret; encoding/json sees no field.
//
// # Counting spend
//
// A POST's "amount" form parameter is reserved before the request is
// forwarded, in one atomic step of the [Store] with the cap check, so
// concurrent requests, on one proxy or on replicas sharing a store, never
// take the key past its cap. An amount above the cap is refused outright;
// the sums cannot wrap. A POST the proxy cannot count is refused: one with
// a URL query (Stripe reads parameters there too), a body that is not a
// form, or an amount that is not one plain positive integer. When Stripe
// answers, the reservation is
//
//   - kept (counted as spent) on a 2xx;
//   - released on an answer marked Idempotent-Replayed: true, whatever
//     its status (that request moved no money; the one that did was
//     counted when it was answered), and on a 4xx (nothing was charged);
//   - kept on another 5xx, a timeout or a lost connection: the outcome is
//     unknown, so the proxy assumes the money moved. A request forwarded
//     is never cancelled by its client going away, and is settled when
//     its answer comes, or not at all.
//
// Once an idempotency key has been counted, a resend with it reserves
// nothing, as long as Stripe surely remembers the key: KeyLifetime minus
// ClockSkew after the earliest Stripe can have first seen it: a chain of
// resends each less than a key lifetime after the one before counts from
// the first. Then a resend is reserved like a new request. Only the
// same request counts as a resend: the same idempotency key from the same
// vault key to the same endpoint with the same parameters. Any other use
// of a key is reserved, as Stripe executes it afresh when it never stored
// the key (a 5xx before execution, a request lost on the way).
type Proxy struct {
	upstream    *url.URL
	stripeKey   string
	store       Store
	clock       interface{ Now() time.Time }
	capStatus   int
	countFor    time.Duration
	skew        time.Duration
	timeout     time.Duration
	tr          http.RoundTripper
	suspended   atomic.Bool
	beforeReply atomic.Pointer[func(*http.Request)]
	observe     func(Entry)
}

// Format prints the configuration without the Stripe secret, for every
// verb, so that a ProxyConfig printed whole, by start-up code or a panic,
// leaks nothing.
func (c ProxyConfig) Format(f fmt.State, verb rune) { formatString(f, verb, c.describe()) }

// LogValue implements [slog.LogValuer] without the secret.
func (c ProxyConfig) LogValue() slog.Value { return slog.StringValue(c.describe()) }

func (c ProxyConfig) describe() string {
	secret := "(none)"
	if c.StripeKey != "" {
		secret = "****"
	}
	return fmt.Sprintf("spendcap.ProxyConfig{Upstream: %s, StripeKey: %s, Store: %T, CapStatus: %d, KeyLifetime: %v, ClockSkew: %v, UpstreamTimeout: %v}",
		redact.RawURL(c.Upstream), secret, c.Store, c.CapStatus, c.KeyLifetime, c.ClockSkew, c.UpstreamTimeout)
}

// Format prints the proxy without the Stripe secret it holds, for every
// verb.
func (p *Proxy) Format(f fmt.State, verb rune) {
	formatString(f, verb, fmt.Sprintf("spendcap.Proxy{upstream: %s, store: %T}", redact.URL(p.upstream), p.store))
}

func formatString(f fmt.State, verb rune, s string) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", s)
		return
	}
	io.WriteString(f, s)
}

// NewProxy validates cfg and returns a Proxy. Errors wrap
// [ErrInvalid] and never contain the Stripe secret.
func NewProxy(cfg ProxyConfig) (*Proxy, error) {
	up, err := url.Parse(cfg.Upstream)
	if err != nil || (up.Scheme != "http" && up.Scheme != "https") || up.Host == "" || up.User != nil || up.RawQuery != "" || up.ForceQuery || up.Fragment != "" {
		return nil, invalid("ProxyConfig.Upstream %q: want a base URL such as https://api.stripe.com, without user info, query or fragment", redact.RawURL(cfg.Upstream))
	}
	if cfg.StripeKey == "" {
		return nil, invalid("ProxyConfig.StripeKey is empty; set the secret the proxy sends upstream")
	}
	if strings.ContainsFunc(cfg.StripeKey, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, invalid("ProxyConfig.StripeKey contains white space or control characters: check how it is loaded")
	}
	if cfg.Store == nil {
		return nil, invalid("ProxyConfig.Store is nil: use NewMemoryStore in tests, NewPostgresStore in production")
	}
	switch cfg.CapStatus {
	case 0:
		cfg.CapStatus = DefaultCapStatus
	case http.StatusPaymentRequired, http.StatusPreconditionFailed, http.StatusTooManyRequests:
	default:
		return nil, invalid("ProxyConfig.CapStatus %d; want 402, 412 or 429", cfg.CapStatus)
	}
	if cfg.KeyLifetime == 0 {
		cfg.KeyLifetime = DefaultKeyLifetime
	}
	if cfg.ClockSkew == 0 {
		cfg.ClockSkew = defaultClockSkew
	}
	if cfg.ClockSkew < 0 || cfg.KeyLifetime <= cfg.ClockSkew {
		return nil, invalid("ProxyConfig.KeyLifetime %v must be above ClockSkew %v, which must not be negative", cfg.KeyLifetime, cfg.ClockSkew)
	}
	if cfg.KeyLifetime > DefaultKeyLifetime {
		return nil, invalid("ProxyConfig.KeyLifetime %v is above Stripe's %v: Stripe may forget a key once it is 24 hours old, and a resend the proxy took for a replay would then be charged without a reservation; leave it zero or lower it", cfg.KeyLifetime, DefaultKeyLifetime)
	}
	if cfg.UpstreamTimeout == 0 {
		cfg.UpstreamTimeout = defaultUpstreamTimeout
	}
	if cfg.Clock == nil {
		cfg.Clock = wallClock{}
	}
	if cfg.Transport == nil {
		cfg.Transport = &http.Transport{Proxy: nil, MaxIdleConnsPerHost: 64, ForceAttemptHTTP2: true}
	}
	up.Path = strings.TrimRight(up.Path, "/")
	return &Proxy{
		upstream: up, stripeKey: cfg.StripeKey, store: cfg.Store, clock: cfg.Clock,
		capStatus: cfg.CapStatus, countFor: cfg.KeyLifetime - cfg.ClockSkew, skew: cfg.ClockSkew,
		timeout: cfg.UpstreamTimeout, tr: cfg.Transport, observe: cfg.Observe,
	}, nil
}

type wallClock struct{}

func (wallClock) Now() time.Time { return time.Now() }

// Suspend makes the proxy refuse every request with 401 while on is true,
// until it is turned off. Requests already forwarded finish.
func (p *Proxy) Suspend(on bool) { p.suspended.Store(on) }

func init() {
	proxyhook.SetBeforeReply = func(p any, f func(*http.Request)) { p.(*Proxy).setBeforeReply(f) }
}

// setBeforeReply installs f, called after a forwarded request is settled
// and audited, before its answer is written (nil removes it). Tests reach
// it through internal/proxyhook to lose answers: a client that gives up
// meanwhile never sees Stripe's answer.
func (p *Proxy) setBeforeReply(f func(*http.Request)) {
	if f == nil {
		p.beforeReply.Store(nil)
		return
	}
	p.beforeReply.Store(&f)
}

// ServeHTTP implements [http.Handler].
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// Work that must finish goes on without the client.
	ctx := context.WithoutCancel(r.Context())
	e := Entry{Method: r.Method, Path: r.URL.Path, IdempotencyKey: r.Header.Get("Idempotency-Key")}
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if bearer != "" {
		e.KeyID = KeyID(bearer)
	}
	if p.suspended.Load() {
		p.refuse(ctx, w, &e, http.StatusUnauthorized, refusedSuspended, map[string]any{"error": "All vault keys are suspended"})
		return
	}
	if bearer == "" {
		p.refuse(ctx, w, &e, http.StatusUnauthorized, refusedUnknownKey, map[string]any{"error": "Unknown vault key"})
		return
	}
	body, amount, msg := p.read(r)
	if msg != "" {
		p.refuse(ctx, w, &e, http.StatusBadRequest, refusedBadRequest, map[string]any{"error": msg})
		return
	}
	e.Amount = amount

	now := p.clock.Now()
	adm, err := p.store.admit(ctx, admitRequest{
		KeyID: e.KeyID, Method: r.Method, Path: r.URL.Path, IdempotencyKey: countedKey(e.KeyID, r, body),
		Amount: amount, Now: now, CountFor: p.countFor, Window: p.countFor + p.timeout + 2*p.skew,
	})
	if err != nil {
		p.refuse(ctx, w, &e, http.StatusServiceUnavailable, refusedStore, map[string]any{"error": "The spend-cap proxy cannot reach its budget store; nothing was sent"})
		return
	}
	switch adm.Refusal {
	case notRefused:
	case refusedCap:
		what := "Spend cap of " + dollars(adm.Cap) + " for this key reached"
		if adm.Per == PerDay {
			what = "Daily spend cap of " + dollars(adm.Cap) + " reached"
		}
		if amount > adm.Cap {
			what = "Amount " + dollars(amount) + " is above the spend cap of " + dollars(adm.Cap) + " for this key"
		}
		p.refuse(ctx, w, &e, p.capStatus, refusedCap, map[string]any{"error": what, "cap": adm.Cap, "spent": adm.Used, "requested": amount})
		return
	case refusedEndpoint:
		p.refuse(ctx, w, &e, http.StatusForbidden, refusedEndpoint, map[string]any{
			"error":             fmt.Sprintf("Endpoint %s %s is not allowed for this vault key", r.Method, r.URL.Path),
			"allowed_endpoints": adm.AllowedEndpoints,
		})
		return
	case refusedRevoked:
		p.refuse(ctx, w, &e, http.StatusUnauthorized, refusedRevoked, map[string]any{"error": "Vault key revoked"})
		return
	case refusedExpired:
		p.refuse(ctx, w, &e, http.StatusUnauthorized, refusedExpired, map[string]any{"error": "Vault key expired"})
		return
	default:
		p.refuse(ctx, w, &e, http.StatusUnauthorized, refusedUnknownKey, map[string]any{"error": "Unknown vault key"})
		return
	}

	resp, err := p.forward(ctx, r, body)
	res := adm.Reservation
	o := outcomeReleased
	switch {
	case err != nil:
		o = outcomeUnknown
	case resp.Header.Get("Idempotent-Replayed") == "true":
		// A replay, of whatever status, moved nothing now; the request
		// that executed was counted when it was answered.
	case resp.StatusCode >= 500:
		o = outcomeUnknown
	case resp.StatusCode < 300:
		o = outcomeCharged
	}
	if res.Amount > 0 {
		// A failed settlement leaves the amount reserved: the cap can
		// only be reached too early, never passed.
		_ = p.store.settle(ctx, res, o, p.clock.Now())
		e.Kept = o != outcomeReleased
	}
	if err != nil {
		p.refuse(ctx, w, &e, http.StatusBadGateway, refusedUpstream, map[string]any{"error": "Upstream request failed; the outcome is unknown"}, r)
		return
	}
	e.Status, e.Replayed = resp.StatusCode, resp.Header.Get("Idempotent-Replayed") == "true"
	p.record(ctx, &e) // before the answer, so a client that has it finds the entry
	p.hook(r)
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(resp.body)
}

// countedKey names r's idempotency key in the store: the key the client
// sent, scoped to the vault key, the endpoint and the parameters. A resend
// reserves nothing only if it is the same request: the upstream executes a
// request with other parameters afresh when it never stored the key (a
// 5xx before execution, a connection lost before arrival), so a key
// counted for one request must not let another through unreserved. The
// account the request acts on (Stripe-Account, Stripe-Context on /v2) is
// part of it, since Stripe keeps keys per account: one key sent to two
// accounts executes twice.
func countedKey(keyID string, r *http.Request, body []byte) string {
	k := r.Header.Get("Idempotency-Key")
	if k == "" {
		return ""
	}
	canon := string(body)
	if q, err := url.ParseQuery(canon); err == nil {
		canon = q.Encode() // sorted: parameters in another order are the same request
	}
	for _, h := range []string{"Stripe-Account", "Stripe-Context"} {
		if a := r.Header.Get(h); a != "" {
			canon = h + ": " + a + "\n" + canon // the platform's requests are named as before
		}
	}
	h := sha256.Sum256([]byte(r.Method + " " + r.URL.Path + "\n" + canon))
	return keyID + " " + hex.EncodeToString(h[:16]) + " " + k
}

// hook calls the function installed by setBeforeReply for a forwarded
// request.
func (p *Proxy) hook(r *http.Request) {
	if f := p.beforeReply.Load(); f != nil && r != nil {
		(*f)(r)
	}
}

// read reads r's body and the amount Stripe would move, or says why the
// proxy cannot count it.
func (p *Proxy) read(r *http.Request) (body []byte, amount int64, refusal string) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil || len(body) > maxBody {
		return nil, 0, "admitRequest body unreadable or over 1 MiB"
	}
	if r.URL.RawPath != "" || path.Clean(r.URL.Path) != r.URL.Path || !strings.HasPrefix(r.URL.Path, "/v1/") {
		return nil, 0, "admitRequest path must be a plain /v1/... path, without escapes, dot segments or repeated slashes"
	}
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return body, 0, ""
	}
	if r.Method != http.MethodPost && r.Method != http.MethodDelete {
		return nil, 0, "Method " + r.Method + " is not forwarded"
	}
	if r.URL.RawQuery != "" || r.URL.ForceQuery {
		return nil, 0, "Write requests may not carry a URL query: put every parameter in the form body, where the spend-cap proxy counts amounts"
	}
	if len(body) == 0 {
		return body, 0, ""
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "application/x-www-form-urlencoded" {
		return nil, 0, "Write requests must be application/x-www-form-urlencoded"
	}
	form, err := url.ParseQuery(string(body))
	if err != nil {
		return nil, 0, "admitRequest body is not a valid form"
	}
	vs, ok := form["amount"]
	if !ok {
		return body, 0, ""
	}
	if len(vs) != 1 || !plainPositive(vs[0]) {
		return nil, 0, "Parameter amount must appear once, as a positive integer in the smallest currency unit"
	}
	a, err := strconv.ParseInt(vs[0], 10, 64)
	if err != nil {
		return nil, 0, "Parameter amount is out of range"
	}
	return body, a, ""
}

// plainPositive reports whether s is digits only, not all zeros.
func plainPositive(s string) bool {
	if s == "" || len(s) > 19 {
		return false
	}
	nonzero := false
	for _, c := range s {
		if c < '0' || c > '9' {
			return false
		}
		nonzero = nonzero || c != '0'
	}
	return nonzero
}

type upstreamAnswer struct {
	StatusCode int
	Header     http.Header
	body       []byte
}

// forward sends r upstream with the real secret and reads the whole
// answer, so a connection cut mid-body is an error (unknown outcome).
func (p *Proxy) forward(ctx context.Context, r *http.Request, body []byte) (*upstreamAnswer, error) {
	ctx, cancel := context.WithTimeout(ctx, p.timeout)
	defer cancel()
	u := *p.upstream
	u.Path = p.upstream.Path + r.URL.Path
	u.RawPath = ""
	u.RawQuery = r.URL.RawQuery
	// The body has no GetBody, so net/http never resends the request by
	// itself (it would for an Idempotency-Key on a reused connection that
	// closes): a resend answered as a replay would release a reservation
	// whose first attempt moved the money.
	out, err := http.NewRequestWithContext(ctx, r.Method, u.String(), io.NopCloser(bytes.NewReader(body)))
	if err != nil {
		return nil, err
	}
	out.ContentLength = int64(len(body))
	if len(body) == 0 && (r.Method == http.MethodGet || r.Method == http.MethodHead) {
		out.Body = http.NoBody
	}
	for k, v := range r.Header {
		switch http.CanonicalHeaderKey(k) {
		case "Authorization", "Connection", "Proxy-Authorization", "Cookie":
		default:
			out.Header[k] = v
		}
	}
	out.Header.Set("Authorization", "Bearer "+p.stripeKey)
	resp, err := p.tr.RoundTrip(out)
	if err != nil {
		return nil, errors.New("upstream request failed")
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, errors.New("upstream answer cut")
	}
	h := resp.Header.Clone()
	h.Set("Content-Length", strconv.Itoa(len(b)))
	return &upstreamAnswer{StatusCode: resp.StatusCode, Header: h, body: b}, nil
}

// refuse answers the request itself. forwarded is the request when it was
// forwarded upstream, nil otherwise.
func (p *Proxy) refuse(ctx context.Context, w http.ResponseWriter, e *Entry, status int, why string, body map[string]any, forwarded ...*http.Request) {
	e.Status, e.Refused = status, why
	p.record(ctx, e)
	if len(forwarded) > 0 {
		p.hook(forwarded[0])
	}
	b, _ := json.Marshal(body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	w.Write(b)
}

func (p *Proxy) record(ctx context.Context, e *Entry) {
	e.Time = p.clock.Now()
	_ = p.store.record(ctx, *e)
	if p.observe != nil {
		p.observe(*e)
	}
}

// dollars formats an amount in cents: "$50", "$50.25".
func dollars(cents int64) string {
	if cents%100 == 0 {
		return fmt.Sprintf("$%d", cents/100)
	}
	return fmt.Sprintf("$%d.%02d", cents/100, cents%100)
}
