package billing_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
)

// An attempt that Stripe executed (its answer lost) followed by a redirect
// on the retry leaves the claim pending, never abandoned: fixed 25 hours
// later, after Stripe has forgotten the key, search finds the payment and
// nothing is charged again.
func TestRedirectAfterExecutedAttemptLeavesClaimForSearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const c = "cus_cut_then_redirected"
	e.srv.FailNext(billingtest.Match{Method: http.MethodPost, Customer: c}, billingtest.Fault{Kind: billingtest.FaultCut})
	target, _ := url.Parse(e.srv.URL)
	proxy := httputil.NewSingleHostReverseProxy(target)
	var n atomic.Int64
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			proxy.ServeHTTP(w, r) // the first attempt reaches Stripe, which commits and cuts the answer
			return
		}
		http.Redirect(w, r, e.srv.URL+r.URL.RequestURI(), http.StatusTemporaryRedirect)
	}))
	t.Cleanup(gw.Close)

	bad := e.biller(func(cfg *billing.Config) { cfg.StripeURL = gw.URL })
	if _, err := bad.Charge(ctx, c, period, nil); !errors.Is(err, billing.ErrStripeRequest) {
		t.Fatalf("Charge: %v; want ErrStripeRequest", err)
	}
	if got := e.claimOf(c); got.State != "pending" {
		t.Fatalf("claim %s; want pending: the first attempt executed", got.State)
	}
	if n := e.count(c); n != 1 {
		t.Fatalf("Stripe holds %d charges; want the 1 of the cut attempt", n)
	}

	e.ageClaim(e.key(c), 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	r, err := e.biller().Charge(ctx, c, period, nil)
	if err != nil || r.Outcome != billing.Reconciled {
		t.Fatalf("Charge after the fix: %+v, %v; want the payment reconciled by search", r, err)
	}
	wantAllOnce(t, e.srv, []string{c})
}

// The refusal of a redirect names where it pointed without its user info
// or query, and neither the error nor the log carries the secret key,
// whatever the status (304 included) and even with Stripe's Request-Id.
func TestRedirectRefusalRedactsLocation(t *testing.T) {
	t.Parallel()
	for _, status := range []int{301, 304, 307, 308} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			var logs bytes.Buffer
			e := newEnv(t)
			host := strings.TrimPrefix(e.srv.URL, "http://")
			gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Request-Id", "req_redirecting")
				w.Header().Set("Location", "http://opsuser:"+secretKey+"@"+host+"/v1/charges?token="+secretKey+"#"+secretKey)
				w.WriteHeader(status)
			}))
			t.Cleanup(gw.Close)
			bad := e.biller(func(cfg *billing.Config) {
				cfg.StripeURL = gw.URL
				cfg.Logger = slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			})
			ids := customers(3)
			_, err := bad.Run(context.Background(), period, billing.Customers(ids...), nil)
			if !errors.Is(err, billing.ErrStripeRequest) {
				t.Fatalf("Run: %v; want ErrStripeRequest", err)
			}
			for what, s := range map[string]string{"error": err.Error(), "log": logs.String()} {
				if strings.Contains(s, secretKey) || strings.Contains(s, "opsuser") || strings.Contains(s, "token") {
					t.Errorf("the %s carries the redirect's user info or query: %s", what, s)
				}
			}
			if n := len(e.srv.Log()); n != 0 {
				t.Fatalf("the redirect target got %d requests", n)
			}
			wantAllPending(t, e)
			if _, err := e.biller().Run(context.Background(), period, billing.Customers(ids...), nil); err != nil {
				t.Fatal(err)
			}
			wantAllOnce(t, e.srv, ids)
		})
	}
}

// Behind a spend-cap proxy that redirects, with a caller's client whose
// own CheckRedirect follows every redirect, the vault key goes to the
// proxy only: the run stops with ErrStripeRequest and nothing is charged
// until the proxy is fixed.
func TestRedirectingSpendCapProxyKeepsVaultKeyAtProxy(t *testing.T) {
	t.Parallel()
	const vault = "vault_key_for_this_run_0001"
	e := newEnv(t)
	var mu sync.Mutex
	var elsewhere []string
	other := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		elsewhere = append(elsewhere, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization"))
		mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"id":"ch_elsewhere","object":"charge","status":"succeeded"}`))
	}))
	t.Cleanup(other.Close)
	for _, status := range []int{302, 307, 308} {
		px := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, other.URL+r.URL.RequestURI(), status)
		}))
		t.Cleanup(px.Close)
		follow := &http.Client{Transport: testTransport, CheckRedirect: func(*http.Request, []*http.Request) error { return nil }}
		hc, err := spendcap.Client(px.URL, vault, follow)
		if err != nil {
			t.Fatal(err)
		}
		bad := e.biller(func(cfg *billing.Config) { cfg.HTTPClient = hc })
		_, err = bad.Run(context.Background(), period, billing.Customers(customers(3)...), nil)
		if !errors.Is(err, billing.ErrStripeRequest) {
			t.Fatalf("%d: Run: %v; want ErrStripeRequest", status, err)
		}
		if strings.Contains(err.Error(), vault) || strings.Contains(err.Error(), secretKey) {
			t.Fatalf("%d: the error carries a key: %v", status, err)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if len(elsewhere) != 0 {
		t.Fatalf("the redirect target got %v", elsewhere)
	}
	wantAllPending(t, e)
	if st := e.srv.Stats(); st.Paid != 0 {
		t.Fatalf("Stripe moved money %d times", st.Paid)
	}
}
