package idemkey

import (
	"fmt"
	"net/http"
	"strings"

	"github.com/billonce/billonce/internal/redact"
)

// header is the name of the HTTP header that carries the key.
const header = "Idempotency-Key"

// Transport is an [http.RoundTripper] that sets the Idempotency-Key header
// of every POST and PATCH request (the methods HTTP does not define as
// idempotent) to the key the request's context carries (see [WithKey]). It
// never makes a key:
//
//   - a POST or PATCH whose context carries no key is refused with
//     *[MissingKeyError];
//   - a request that already carries a different key (stripe-go, for one,
//     invents a random key when params.IdempotencyKey is nil) is refused with
//     *[KeyConflictError]. The same key is accepted and sent once.
//
// A refused request is never sent and its body is closed. Every POST
// through the Transport needs a key, so use it on the client that talks to
// Stripe (or another API with idempotency keys), not as a general client.
// Other methods pass through untouched.
//
// The Transport does not modify the caller's request, and is safe for
// concurrent use.
type Transport struct {
	// Base sends the request once the key is set. Defaults to
	// http.DefaultTransport.
	Base http.RoundTripper
}

// RoundTrip implements [http.RoundTripper].
func (t *Transport) RoundTrip(req *http.Request) (*http.Response, error) {
	base := t.Base
	if base == nil {
		base = http.DefaultTransport
	}
	if !strings.EqualFold(req.Method, http.MethodPost) && !strings.EqualFold(req.Method, http.MethodPatch) {
		return base.RoundTrip(req)
	}

	key, ok := FromContext(req.Context())
	if !ok {
		closeBody(req)
		return nil, &MissingKeyError{Method: req.Method, URL: redact.URL(req.URL)}
	}
	// Look at every spelling of the header name: a non-canonical map entry
	// would still be sent.
	for name, values := range req.Header {
		if !strings.EqualFold(name, header) {
			continue
		}
		for _, v := range values {
			if v != key.s {
				closeBody(req)
				return nil, &KeyConflictError{Method: req.Method, URL: redact.URL(req.URL), Key: key, Found: v}
			}
		}
	}

	r2 := req.Clone(req.Context())
	if r2.Header == nil {
		r2.Header = make(http.Header)
	}
	for name := range r2.Header {
		if strings.EqualFold(name, header) {
			delete(r2.Header, name)
		}
	}
	r2.Header[header] = []string{key.s}
	return base.RoundTrip(r2)
}

func closeBody(req *http.Request) {
	if req.Body != nil {
		req.Body.Close()
	}
}

// MissingKeyError is returned by [Transport] for a POST or PATCH whose
// context carries no key. Nothing was sent. It is a bug in the caller:
// compute the key with [For] and attach it with [WithKey] before the
// request, outside any retry loop.
type MissingKeyError struct {
	Method string
	URL    string // without user info, query or fragment
}

func (e *MissingKeyError) Error() string {
	return fmt.Sprintf("idemkey: refusing %s %s: its context carries no idempotency key; attach one with idemkey.WithKey before the request (nothing was sent)", e.Method, e.URL)
}

// KeyConflictError is returned by [Transport] for a request that already
// carries an Idempotency-Key different from its context's key. Nothing was
// sent. Some lower layer invented or fixed its own key; with stripe-go, set
// params.IdempotencyKey to Key.String().
type KeyConflictError struct {
	Method string
	URL    string // without user info, query or fragment
	Key    Key    // the context's key
	Found  string // the key the request already carried
}

func (e *KeyConflictError) Error() string {
	return fmt.Sprintf("idemkey: refusing %s %s: it carries Idempotency-Key %q but its context's key is %q; make every layer use the context's key (nothing was sent)", e.Method, e.URL, e.Found, e.Key.s)
}
