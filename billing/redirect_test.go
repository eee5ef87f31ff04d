package billing_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/billonce/billonce/billing"
)

// Stripe's API never redirects. A redirect from whatever answers at
// Config.StripeURL (a gateway, a misconfigured proxy) is refused: the
// secret key goes nowhere but StripeURL, the run stops with
// ErrStripeRequest, the claims stay pending, and once the URL is fixed the
// next Run bills everyone once. net/http alone would re-POST a 307 or 308
// to the new address with the Authorization header whenever the host name
// is the same (it compares names, not ports), and turn a 301, 302 or 303
// into a GET whose answer stripe-go decodes as an empty charge.
func TestRedirectIsRefusedAndTheSecretStaysAtStripeURL(t *testing.T) {
	t.Parallel()
	for _, status := range []int{301, 302, 303, 307, 308} {
		t.Run(http.StatusText(status), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			// The redirect points at the fake itself, on its own port: a
			// followed redirect would charge there.
			var redirected atomic.Int64
			gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				redirected.Add(1)
				http.Redirect(w, r, e.srv.URL+r.URL.RequestURI(), status)
			}))
			t.Cleanup(gw.Close)

			ids := customers(6)
			ctx := context.Background()
			bad := e.biller(func(c *billing.Config) { c.StripeURL = gw.URL })
			_, err := bad.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 2})
			if !errors.Is(err, billing.ErrStripeRequest) {
				t.Fatalf("Run: %v; want ErrStripeRequest", err)
			}
			if !strings.Contains(err.Error(), "redirect") {
				t.Errorf("Run: %v; want the error to say a redirect was refused", err)
			}
			if strings.Contains(err.Error(), secretKey) {
				t.Fatalf("the error carries the secret key: %v", err)
			}
			if n := len(e.srv.Log()); n != 0 {
				t.Fatalf("the redirect target got %d requests; want none (the secret key and the charge stay at StripeURL)", n)
			}
			if st := e.srv.Stats(); st.Paid != 0 {
				t.Fatalf("Stripe moved money %d times through a redirect", st.Paid)
			}
			if n := redirected.Load(); n > 2 {
				t.Errorf("%d requests reached the redirecting gateway; the first refusal must stop the run (at most one per worker)", n)
			}
			wantAllPending(t, e)

			// A single Charge is refused the same way.
			if _, err := bad.Charge(ctx, "cus_single", period, nil); !errors.Is(err, billing.ErrStripeRequest) {
				t.Fatalf("Charge: %v; want ErrStripeRequest", err)
			}
			if n := len(e.srv.Log()); n != 0 {
				t.Fatalf("the redirect target got %d requests", n)
			}
			wantAllPending(t, e)

			// Fixed: every customer is billed once.
			all := append(ids, "cus_single")
			sum, err := e.biller().Run(ctx, period, billing.Customers(all...), nil)
			if err != nil || sum.Created != len(all) {
				t.Fatalf("Run after the fix: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, all)
		})
	}
}

// An answer that is not a payment (no id, no status: a list, an empty
// object, a GET's answer after a redirect) is never recorded as a charge:
// the run stops with ErrStripeRequest and the claims stay pending.
func TestAnswerWithoutPaymentIsNotACharge(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"object":"list","data":[],"has_more":false,"url":"/v1/charges"}`} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			web, n := countingServer(t, 200, "application/json", body)
			ids := customers(4)
			bad := e.biller(func(c *billing.Config) { c.StripeURL = web.URL })
			sum, err := bad.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 2})
			if !errors.Is(err, billing.ErrStripeRequest) {
				t.Fatalf("Run: %v (summary %+v); want ErrStripeRequest", err, sum.Progress)
			}
			if sum.Created != 0 || sum.AlreadyBilled != 0 {
				t.Fatalf("summary %+v; an answer without a payment counted as a charge", sum.Progress)
			}
			if got := n.Load(); got > 2 {
				t.Errorf("%d requests; the first answer must stop the run (at most one per worker)", got)
			}
			wantAllPending(t, e)
			sum, err = e.biller().Run(context.Background(), period, billing.Customers(ids...), nil)
			if err != nil || sum.Created != len(ids) {
				t.Fatalf("Run after the fix: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, ids)
		})
	}
}
