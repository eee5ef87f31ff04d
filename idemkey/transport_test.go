package idemkey_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/billonce/billonce/idemkey"
)

// received is what the server saw of one request.
type received struct {
	method string
	keys   []string // every Idempotency-Key value, in any spelling of the name
	body   string
}

// recorder is a real HTTP server on loopback that records what arrives.
// respond, if set, answers the n-th request (0-based); the default is 200.
type recorder struct {
	*httptest.Server
	mu      sync.Mutex
	got     []received
	respond func(n int, w http.ResponseWriter)
}

func newRecorder(t *testing.T, respond func(n int, w http.ResponseWriter)) *recorder {
	t.Helper()
	rec := &recorder{respond: respond}
	rec.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var keys []string
		for name, v := range r.Header {
			if strings.EqualFold(name, idemkey.Header) {
				keys = append(keys, v...)
			}
		}
		rec.mu.Lock()
		n := len(rec.got)
		rec.got = append(rec.got, received{method: r.Method, keys: keys, body: string(body)})
		rec.mu.Unlock()
		if rec.respond != nil {
			rec.respond(n, w)
		}
	}))
	t.Cleanup(rec.Close)
	return rec
}

func (rec *recorder) requests() []received {
	rec.mu.Lock()
	defer rec.mu.Unlock()
	return append([]received(nil), rec.got...)
}

// closeRecorder is a request body that records whether it was closed.
type closeRecorder struct {
	io.Reader
	closed atomic.Bool
}

func (b *closeRecorder) Close() error { b.closed.Store(true); return nil }

func mustFor(tb testing.TB, parts ...string) idemkey.Key {
	tb.Helper()
	k, err := idemkey.For("charge", parts...)
	if err != nil {
		tb.Fatal(err)
	}
	return k
}

// Key from intent, every write carries a key: the key is computed once, outside the retry loop; every attempt,
// including one whose response was lost after the server received it,
// carries that same key.
func TestTransportSameKeyOnEveryRetry(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter) {
		switch n {
		case 0: // the server got the request; the response is lost
			conn, _, err := w.(http.Hijacker).Hijack()
			if err != nil {
				panic(err)
			}
			conn.Close()
		case 1:
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})
	client := &http.Client{Transport: &idemkey.Transport{}}
	key := mustFor(t, "cus_A", "2026-01")
	ctx := idemkey.WithKey(t.Context(), key)

	attempts := 0
	for ; attempts < 5; attempts++ {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader("amount=1000"))
		if err != nil {
			t.Fatal(err)
		}
		resp, err := client.Do(req)
		if err != nil {
			continue // outcome unknown: retry with the same key
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
	}
	if attempts != 2 {
		t.Fatalf("succeeded on attempt %d, want the third (index 2)", attempts)
	}
	got := srv.requests()
	if len(got) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(got))
	}
	for i, r := range got {
		if len(r.keys) != 1 || r.keys[0] != key.String() {
			t.Errorf("attempt %d carried Idempotency-Key %q, want exactly [%s]", i, r.keys, key)
		}
	}
}

// Every write carries a key: a POST without a key is refused before a byte is sent.
func TestTransportRefusesPostWithoutKey(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, nil)
	client := &http.Client{Transport: &idemkey.Transport{}}
	outer := idemkey.WithKey(t.Context(), mustFor(t, "cus_A"))

	for _, tt := range []struct {
		name   string
		ctx    context.Context
		method string
	}{
		{"no key", t.Context(), http.MethodPost},
		{"zero key hides the outer key", idemkey.WithKey(outer, idemkey.Key{}), http.MethodPost},
		{"PATCH", t.Context(), http.MethodPatch},
		{"lower-case post", t.Context(), "post"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := &closeRecorder{Reader: strings.NewReader("amount=1000")}
			req, err := http.NewRequestWithContext(tt.ctx, tt.method, srv.URL+"/v1/charges", body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err == nil {
				resp.Body.Close()
			}
			var missing *idemkey.MissingKeyError
			if !errors.As(err, &missing) {
				t.Fatalf("Do = %v, want a *MissingKeyError", err)
			}
			if missing.Method != tt.method || missing.URL != srv.URL+"/v1/charges" {
				t.Errorf("error names %s %s, want %s %s/v1/charges", missing.Method, missing.URL, tt.method, srv.URL)
			}
			if !body.closed.Load() {
				t.Error("the refused request's body was not closed")
			}
		})
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("server saw %d requests, want none", n)
	}
}

// A lower layer that invents its own key (stripe-go does when
// params.IdempotencyKey is nil) must not win silently.
func TestTransportRefusesConflictingKey(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, nil)
	tr := &idemkey.Transport{}
	key := mustFor(t, "cus_A")
	ctx := idemkey.WithKey(t.Context(), key)

	for _, tt := range []struct {
		name   string
		header http.Header
	}{
		{"different key", http.Header{idemkey.Header: {"3f4a9b2c-e1d7-4a8f-b0c3-9e5f2a1d7b6e"}}},
		{"same key then a different one", http.Header{idemkey.Header: {key.String(), "other"}}},
		{"non-canonical header name", http.Header{"idempotency-key": {"other"}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := &closeRecorder{Reader: strings.NewReader("amount=1000")}
			req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header = tt.header
			resp, err := tr.RoundTrip(req)
			if err == nil {
				resp.Body.Close()
			}
			var conflict *idemkey.KeyConflictError
			if !errors.As(err, &conflict) {
				t.Fatalf("RoundTrip = %v, want a *KeyConflictError", err)
			}
			if conflict.Key != key || conflict.Found != "3f4a9b2c-e1d7-4a8f-b0c3-9e5f2a1d7b6e" && conflict.Found != "other" {
				t.Errorf("conflict reports context key %s and found %q", conflict.Key, conflict.Found)
			}
			if !body.closed.Load() {
				t.Error("the refused request's body was not closed")
			}
		})
	}
	if n := len(srv.requests()); n != 0 {
		t.Fatalf("server saw %d requests, want none", n)
	}
}

// The same key set by a lower layer (stripe-go with params.IdempotencyKey)
// is fine and is sent once; the caller's request is left as it was.
func TestTransportAcceptsSameKeyAndLeavesRequestAlone(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, func(n int, w http.ResponseWriter) { w.WriteHeader(http.StatusPaymentRequired) })
	client := &http.Client{Transport: &idemkey.Transport{Base: http.DefaultTransport}}
	key := mustFor(t, "cus_A")
	ctx := idemkey.WithKey(t.Context(), key)

	for _, preset := range [][]string{nil, {key.String()}, {key.String(), key.String()}} {
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL, strings.NewReader("x"))
		if err != nil {
			t.Fatal(err)
		}
		if preset != nil {
			req.Header[idemkey.Header] = preset
		}
		before := req.Header.Clone()
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("preset %q: %v", preset, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusPaymentRequired {
			t.Errorf("status %d: a 4xx must reach the caller as a response", resp.StatusCode)
		}
		if fmt.Sprint(req.Header) != fmt.Sprint(before) {
			t.Errorf("caller's header changed from %v to %v", before, req.Header)
		}
	}
	for i, r := range srv.requests() {
		if len(r.keys) != 1 || r.keys[0] != key.String() {
			t.Errorf("request %d carried %q, want exactly [%s]", i, r.keys, key)
		}
	}
}

// Reads and deletes are not the Transport's business: they pass untouched,
// with or without a key.
func TestTransportPassesOtherMethods(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, nil)
	client := &http.Client{Transport: &idemkey.Transport{}}
	ctx := idemkey.WithKey(t.Context(), mustFor(t, "cus_A"))

	for _, tt := range []struct {
		ctx    context.Context
		method string
		preset string
	}{
		{t.Context(), http.MethodGet, ""},
		{ctx, http.MethodGet, ""},
		{t.Context(), http.MethodDelete, "random-from-a-lower-layer"},
	} {
		req, err := http.NewRequestWithContext(tt.ctx, tt.method, srv.URL, nil)
		if err != nil {
			t.Fatal(err)
		}
		if tt.preset != "" {
			req.Header.Set(idemkey.Header, tt.preset)
		}
		resp, err := client.Do(req)
		if err != nil {
			t.Fatalf("%s: %v", tt.method, err)
		}
		resp.Body.Close()
	}
	got := srv.requests()
	if len(got) != 3 {
		t.Fatalf("server saw %d requests, want 3", len(got))
	}
	if got[0].keys != nil || got[1].keys != nil || len(got[2].keys) != 1 || got[2].keys[0] != "random-from-a-lower-layer" {
		t.Fatalf("keys sent: %q, %q, %q; want none, none, the preset one", got[0].keys, got[1].keys, got[2].keys)
	}
}

// Errors may be logged: they carry no credentials from the URL.
func TestTransportErrorsRedactURL(t *testing.T) {
	t.Parallel()
	tr := &idemkey.Transport{}
	for _, tt := range []struct {
		ctx    context.Context
		header http.Header
	}{
		{t.Context(), nil},
		{idemkey.WithKey(t.Context(), mustFor(t, "cus_A")), http.Header{idemkey.Header: {"other"}}},
	} {
		req, err := http.NewRequestWithContext(tt.ctx, http.MethodPost, "https://user:pa55word@api.example.com/v1/charges?api_key=sk_live_s3cret#frag", nil)
		if err != nil {
			t.Fatal(err)
		}
		req.Header = tt.header
		_, err = tr.RoundTrip(req)
		if err == nil {
			t.Fatal("RoundTrip sent a request it should refuse")
		}
		msg := err.Error()
		for _, secret := range []string{"pa55word", "user", "sk_live_s3cret", "api_key", "frag"} {
			if strings.Contains(msg, secret) {
				t.Errorf("error %q contains %q", msg, secret)
			}
		}
		if !strings.Contains(msg, "https://api.example.com/v1/charges") {
			t.Errorf("error %q does not name the endpoint", msg)
		}
	}
}

// Many goroutines share one client; each request must carry its own
// operation's key, never another's.
func TestTransportConcurrent(t *testing.T) {
	t.Parallel()
	srv := newRecorder(t, nil)
	client := &http.Client{Transport: &idemkey.Transport{}}
	const workers, each = 32, 20

	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				key := mustFor(t, fmt.Sprintf("cus_%d", w), fmt.Sprintf("2026-%02d", i%12+1), fmt.Sprint(i))
				req, err := http.NewRequestWithContext(idemkey.WithKey(t.Context(), key), http.MethodPost, srv.URL, strings.NewReader(key.String()))
				if err != nil {
					errs <- err
					return
				}
				resp, err := client.Do(req)
				if err != nil {
					errs <- err
					return
				}
				resp.Body.Close()
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	got := srv.requests()
	if len(got) != workers*each {
		t.Fatalf("server saw %d requests, want %d", len(got), workers*each)
	}
	seen := map[string]bool{}
	for _, r := range got {
		if len(r.keys) != 1 || r.keys[0] != r.body {
			t.Errorf("request for %s carried %q", r.body, r.keys)
		}
		seen[r.body] = true
	}
	if len(seen) != workers*each {
		t.Errorf("%d distinct keys, want %d", len(seen), workers*each)
	}
}

func TestContextCarrier(t *testing.T) {
	t.Parallel()
	if k, ok := idemkey.FromContext(t.Context()); ok || !k.IsZero() {
		t.Fatalf("empty context gave %q, %v", k, ok)
	}
	a, b := mustFor(t, "cus_A"), mustFor(t, "cus_B")
	ctxA := idemkey.WithKey(t.Context(), a)
	ctxB := idemkey.WithKey(ctxA, b)
	if k, ok := idemkey.FromContext(ctxA); !ok || k != a {
		t.Errorf("FromContext(ctxA) = %s, %v; want %s", k, ok, a)
	}
	if k, ok := idemkey.FromContext(ctxB); !ok || k != b {
		t.Errorf("inner key must win: got %s, %v; want %s", k, ok, b)
	}
	if k, ok := idemkey.FromContext(idemkey.WithKey(ctxA, idemkey.Key{})); ok {
		t.Errorf("a zero key must hide the outer one; got %s", k)
	}
}
