package spendcap

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"strings"
	"unicode"

	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/internal/redact"
	"github.com/billonce/billonce/internal/stripeanswer"
)

// maxVaultKeyLen bounds a vault key; real ones are well under it.
const maxVaultKeyLen = 512

// Config configures a [Transport]. ProxyURL and VaultKey are
// required.
type Config struct {
	// ProxyURL is the base URL of the spend-cap proxy, such as
	// "https://proxy.example.com/stripe". Every request is sent to it with
	// its /v1/... path appended and its query kept. It must be https unless
	// the host is loopback or AllowInsecure is set, and carries no user
	// info, query or fragment.
	ProxyURL string

	// VaultKey is the key the proxy issued for this run. It replaces
	// whatever Authorization the caller set (the Stripe secret never
	// leaves the process) and is redacted wherever the transport prints.
	VaultKey string

	// Base sends the rewritten request: keep your own transport for its
	// timeouts, tracing and proxies. Defaults to http.DefaultTransport.
	Base http.RoundTripper

	// AllowInsecure permits an http:// proxy URL on a non-loopback host.
	// The vault key then crosses the network in clear text; use it only
	// inside a network you trust.
	AllowInsecure bool
}

// Transport is an [http.RoundTripper] that sends Stripe API requests
// through a spend-cap proxy, authenticated with a vault key in place of the
// Stripe secret. Build one with [NewTransport], or a whole client with
// [Client].
//
// # What it changes
//
// Every request goes to the proxy: scheme and host become the proxy's, the
// proxy URL's path is prepended to the request's path, the query is kept.
// Every Authorization header is dropped and replaced with "Bearer " and the
// vault key. Redirects are refused rather than followed, so the vault key
// is only ever sent to the proxy. The caller's request is not modified.
//
// # Proxy answers and Stripe answers
//
// A proxy forwards Stripe's own answers and adds refusals of its own. The
// two are told apart by how the answer is built, never by its status alone:
//
//   - An answer with a Request-Id header starting "req_" is Stripe's and is
//     passed through untouched, whatever its status. Stripe stamps every
//     API response with such an ID; proxies forward it.
//   - Otherwise, an answer of status 400 or more whose body is a JSON
//     object with a string "error" member is the proxy's own. Stripe's
//     error bodies always hold an object under "error" (with a "type").
//   - Anything else (a 2xx, an HTML error page, an unreadable body) passes
//     through untouched.
//
// A proxy refusal with status 402, 412 or 429 (spend cap), 403 (endpoint
// not allowed) or 401 (vault key revoked, unknown, or all keys suspended)
// is returned from RoundTrip as a *[ProxyError] matching
// [ErrSpendCapReached], [ErrEndpointNotAllowed] or [ErrVaultKeyRevoked],
// and the response body is closed. These stop a billing run and are never
// retried. Other proxy answers (a 502 when the proxy could not reach
// Stripe, say) are rewritten into Stripe's error shape (type "api_error"
// for 5xx, "invalid_request_error" otherwise) with the same status, so
// stripe-go and billing.Classify treat them like the same status from Stripe: a
// 5xx means the outcome is unknown and is retried with the same key.
//
// stripe-go retries every transport error it does not recognise, so when
// it is used directly, set its MaxNetworkRetries to 0 (as a billing.Biller does)
// for a refusal to be sent only once; a retried refusal is refused again
// and charges nothing.
//
// A Stripe 429 (rate_limit or lock_timeout) forwarded by the proxy carries
// Stripe's Request-Id and error object, so it reaches the retry layer as a
// *stripe.Error and is retried as usual.
//
// A Transport is safe for concurrent use. Printing it with fmt or slog
// shows the proxy URL and a redacted key; encoding/json sees no field.
type Transport struct {
	base  http.RoundTripper
	proxy url.URL
	key   string
}

// NewTransport validates cfg and returns a transport that routes
// requests through the proxy. The error wraps [ErrInvalid] and says
// what to fix; it never contains the vault key.
func NewTransport(cfg Config) (*Transport, error) {
	if err := checkVaultKey(cfg.VaultKey); err != nil {
		return nil, err
	}
	u, err := checkProxyURL(cfg.ProxyURL, cfg.AllowInsecure)
	if err != nil {
		return nil, err
	}
	base := cfg.Base
	if base != nil && nilness.Is(base) {
		return nil, invalid("Config.Base (Client: base.Transport) is a nil %T: pass a transport, or leave it nil for http.DefaultTransport", base)
	}
	if base == nil {
		base = http.DefaultTransport
	}
	return &Transport{base: base, proxy: *u, key: cfg.VaultKey}, nil
}

// Client returns a copy of base (a new client if nil) whose transport
// sends every request through the proxy at proxyURL with vaultKey (see
// [Transport]); base's Timeout, Jar and CheckRedirect are kept. Use it
// as billing.Config.HTTPClient, or as the HTTPClient of a stripe-go BackendConfig.
// For an http:// proxy on another host, build the transport with
// [NewTransport] and AllowInsecure.
func Client(proxyURL, vaultKey string, base *http.Client) (*http.Client, error) {
	hc := &http.Client{}
	if base != nil {
		*hc = *base
	}
	t, err := NewTransport(Config{ProxyURL: proxyURL, VaultKey: vaultKey, Base: hc.Transport})
	if err != nil {
		return nil, err
	}
	hc.Transport = t
	return hc, nil
}

func checkVaultKey(k string) error {
	switch {
	case k == "":
		return invalid("Config.VaultKey is empty: set the vault key the spend-cap proxy issued for this run")
	case len(k) > maxVaultKeyLen:
		return invalid("Config.VaultKey is %d bytes long; at most %d are accepted: check how it is loaded", len(k), maxVaultKeyLen)
	case strings.ContainsFunc(k, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return invalid("Config.VaultKey contains white space or control characters: check how it is loaded (a trailing newline from a file or secret store is common)")
	}
	return nil
}

func checkProxyURL(raw string, allowInsecure bool) (*url.URL, error) {
	if raw == "" {
		return nil, invalid("Config.ProxyURL is empty: set the spend-cap proxy's base URL, such as https://proxy.example.com/stripe")
	}
	u, err := url.Parse(raw)
	if err != nil {
		// Neither raw nor err may be printed: both quote the user info.
		return nil, invalid("Config.ProxyURL %q (redacted) is not a URL; give scheme, host and an optional path", redact.RawURL(raw))
	}
	if u.User != nil {
		return nil, invalid("Config.ProxyURL carries user info; put credentials in VaultKey, not in the URL")
	}
	safe := redact.URL(u)
	switch {
	case u.Scheme != "https" && u.Scheme != "http":
		return nil, invalid("Config.ProxyURL %q: the scheme must be https (or http on loopback)", safe)
	case u.Host == "" || u.Hostname() == "":
		return nil, invalid("Config.ProxyURL %q has no host", safe)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return nil, invalid("Config.ProxyURL %q has a query or fragment; give only scheme, host and an optional path", safe)
	case u.Scheme == "http" && !allowInsecure && !isLoopbackHost(u.Hostname()):
		return nil, invalid("Config.ProxyURL %q is plain http on a non-loopback host, which would send the vault key in clear text; use https, or set AllowInsecure inside a trusted network", safe)
	}
	u.Path = strings.TrimRight(u.Path, "/")
	u.RawPath = strings.TrimRight(u.RawPath, "/")
	return u, nil
}

func isLoopbackHost(host string) bool {
	if strings.EqualFold(host, "localhost") {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RoundTrip implements [http.RoundTripper].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	if req.Response != nil {
		if req.Body != nil {
			req.Body.Close()
		}
		return nil, fmt.Errorf("spendcap: refusing to follow a redirect to %s: the vault key is sent only to the spend-cap proxy at %s, and Stripe's API does not redirect",
			redact.URL(req.URL), redact.URL(&t.proxy))
	}
	r2 := req.Clone(req.Context())
	u := &url.URL{
		Scheme:   t.proxy.Scheme,
		Host:     t.proxy.Host,
		Path:     t.proxy.Path + req.URL.Path,
		RawQuery: req.URL.RawQuery,
	}
	if req.URL.RawPath != "" || t.proxy.RawPath != "" {
		u.RawPath = t.proxy.EscapedPath() + req.URL.EscapedPath()
	}
	r2.URL, r2.Host = u, ""
	if r2.Header == nil {
		r2.Header = make(http.Header)
	}
	for name := range r2.Header {
		if strings.EqualFold(name, "Authorization") {
			delete(r2.Header, name)
		}
	}
	r2.Header["Authorization"] = []string{"Bearer " + t.key}

	resp, err := t.base.RoundTrip(r2)
	if err != nil {
		return nil, err
	}
	return t.inspect(r2, resp)
}

// inspect takes the request as sent to the proxy, and returns resp, or the *ProxyError it carries, or resp rewritten
// into Stripe's error shape; see the Transport docs.
func (t *Transport) inspect(req *http.Request, resp *http.Response) (*http.Response, error) {
	if resp.StatusCode < 400 || stripeanswer.Stamped(resp) {
		return resp, nil
	}
	buf, readErr := stripeanswer.Peek(resp)
	var ans struct {
		Error            json.RawMessage `json:"error"`
		AllowedEndpoints []string        `json:"allowed_endpoints"`
	}
	var msg string
	if readErr != nil || len(buf) > stripeanswer.MaxBody ||
		json.Unmarshal(buf, &ans) != nil || json.Unmarshal(ans.Error, &msg) != nil {
		// Not a proxy refusal: the body is handed back as it came.
		return resp, nil
	}
	resp.Body.Close()
	msg = t.scrub(msg)

	pe := &ProxyError{Status: resp.StatusCode, Message: msg, Method: req.Method, URL: redact.URL(req.URL)}
	switch resp.StatusCode {
	case http.StatusPaymentRequired, http.StatusPreconditionFailed, http.StatusTooManyRequests:
		pe.kind = ErrSpendCapReached
	case http.StatusForbidden:
		pe.kind = ErrEndpointNotAllowed
		for _, e := range ans.AllowedEndpoints {
			pe.AllowedEndpoints = append(pe.AllowedEndpoints, t.scrub(e))
		}
	case http.StatusUnauthorized:
		pe.kind = ErrVaultKeyRevoked
	default:
		return stripeanswer.Rewrite(resp, resp.StatusCode, "spend-cap proxy: "+msg), nil
	}
	return nil, pe
}

// scrub removes the vault key from text the proxy sent back.
func (t *Transport) scrub(s string) string {
	return strings.ReplaceAll(s, t.key, redactVaultKey(t.key))
}

// Format prints the configuration with the vault key redacted, for every
// verb, so that a Config printed whole, by start-up code or a panic, leaks
// nothing.
func (c Config) Format(f fmt.State, verb rune) { formatString(f, verb, c.describe()) }

// LogValue implements [slog.LogValuer] with the vault key redacted.
func (c Config) LogValue() slog.Value { return slog.StringValue(c.describe()) }

func (c Config) describe() string {
	base := "(default)"
	if c.Base != nil {
		base = fmt.Sprintf("%T", c.Base)
	}
	return fmt.Sprintf("spendcap.Config{ProxyURL: %s, VaultKey: %s, Base: %s, AllowInsecure: %t}",
		redact.RawURL(c.ProxyURL), redactVaultKey(c.VaultKey), base, c.AllowInsecure)
}

// Format prints the transport with the vault key redacted, for every verb,
// so that no verb (%d, %t, %o, …) falls back to printing the fields.
func (t Transport) Format(f fmt.State, verb rune) {
	formatString(f, verb, fmt.Sprintf("spendcap.Transport{proxy: %s, key: %s}", redact.URL(&t.proxy), redactVaultKey(t.key)))
}

// ProxyError is a refusal by a spend-cap proxy: the request did not reach
// Stripe. errors.Is matches it with [ErrSpendCapReached],
// [ErrEndpointNotAllowed] or [ErrVaultKeyRevoked], depending on Status. It
// stops a billing run and is never retried; the claims a run has not sent
// stay pending and are resumed with their keys once the cause is fixed.
type ProxyError struct {
	Status  int    // the proxy's HTTP status
	Message string // the proxy's "error" text, vault key removed
	// AllowedEndpoints is the allowlist the proxy sent with a 403, if any.
	AllowedEndpoints []string
	Method, URL      string // the refused request; URL without user info, query or fragment

	kind error
}

func (e *ProxyError) Error() string {
	var fix string
	switch e.kind {
	case ErrSpendCapReached:
		fix = "the cap of this vault key is spent; find out why the run spent more than planned before raising the cap or issuing a new key"
	case ErrEndpointNotAllowed:
		fix = "add the endpoint to the vault key's allowlist"
		if len(e.AllowedEndpoints) > 0 {
			fix += " (allowed: " + strings.Join(e.AllowedEndpoints, ", ") + ")"
		}
	default:
		fix = "the proxy no longer accepts this vault key; issue a new one"
	}
	return fmt.Sprintf("spendcap: the spend-cap proxy refused %s %s with %d %q: %s; this request did not reach Stripe",
		e.Method, e.URL, e.Status, e.Message, fix)
}

// Unwrap returns the sentinel the refusal matches.
func (e *ProxyError) Unwrap() error { return e.kind }

// redactVaultKey keeps a long key's last four characters, as Stripe's dashboard
// does, and nothing of a short one.
func redactVaultKey(k string) string {
	if len(k) < 20 {
		return "[redacted]"
	}
	return "[redacted …" + k[len(k)-4:] + "]"
}
