package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// refuseAll makes the fake refuse every create request with status and the
// error object r until the test removes the script.
func refuseAll(srv *billingtest.Server, status int, r billingtest.Refusal) {
	srv.SetScript(func(req billingtest.Request) billingtest.Fault {
		if req.Method == http.MethodPost {
			return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: status, Refusal: r}
		}
		return billingtest.Fault{}
	})
}

// countingServer is a web server that is not Stripe: it answers every
// request with status and body, and counts them.
func countingServer(t *testing.T, status int, contentType, body string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	n := new(atomic.Int64)
	s := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(s.Close)
	return s, n
}

// Outcomes are final, stop on refusals: an answer that says the request could never work, for any
// customer, stops the run and decides nothing. A wrong URL, an unknown
// parameter, a key in the wrong mode or expired, an API version Stripe does
// not take, a proxy or web server that is not Stripe: every claim the run
// touched stays pending (not failed: failed is terminal and would need a
// re-bill per customer), the run returns the sentinel, and once the
// configuration is fixed the next Run bills everyone exactly once.
func TestConfigErrorStopsRunAndLeavesClaimsPending(t *testing.T) {
	t.Parallel()
	const workers = 3
	refusal := func(status int, r billingtest.Refusal) func(*testing.T, *env) (*billing.Biller, func() int64) {
		return func(t *testing.T, e *env) (*billing.Biller, func() int64) {
			refuseAll(e.srv, status, r)
			return e.biller(), func() int64 { return e.srv.Stats().Faults[billingtest.FaultRefuse] }
		}
	}
	cases := []struct {
		name string
		// bad returns a Biller with the bad configuration, and a count of
		// the requests that reached whatever answered them.
		bad  func(*testing.T, *env) (*billing.Biller, func() int64)
		want error
		// stripeErr: the error carries the *stripe.Error Stripe answered.
		stripeErr bool
	}{
		{"wrong StripeURL path: 404 Unrecognized request URL", func(t *testing.T, e *env) (*billing.Biller, func() int64) {
			b := e.biller(func(c *billing.Config) { c.StripeURL = e.srv.URL + "/stripe" })
			return b, func() int64 { return int64(len(e.srv.Log())) }
		}, billing.ErrStripeRequest, true},
		{"400 parameter_unknown", refusal(400, billingtest.Refusal{Code: "parameter_unknown", Param: "colour",
			Message: "Received unknown parameter: colour"}), billing.ErrStripeRequest, true},
		{"400 parameter_invalid_string, a parameter of the request", refusal(400, billingtest.Refusal{Code: "parameter_invalid_string",
			Param: "statement_descriptor", Message: "Invalid string: a statement descriptor"}), billing.ErrStripeRequest, true},
		{"400 parameter_missing", refusal(400, billingtest.Refusal{Code: "parameter_missing", Param: "payment_method_types"}), billing.ErrStripeRequest, true},
		{"400 livemode_mismatch", refusal(400, billingtest.Refusal{Code: "livemode_mismatch",
			Message: "Test and live mode API keys, requests, and objects are only available within the mode they are in."}), billing.ErrStripeRequest, true},
		{"400 testmode_charges_only", refusal(400, billingtest.Refusal{Code: "testmode_charges_only",
			Message: "This account has not been activated and can only make test charges."}), billing.ErrStripeRequest, true},
		{"400 secret_key_required", refusal(400, billingtest.Refusal{Code: "secret_key_required"}), billing.ErrStripeRequest, true},
		{"400 API version", refusal(400, billingtest.Refusal{Message: "Invalid Stripe API version: 2099-01-01"}), billing.ErrStripeRequest, true},
		{"400 resource_missing without a parameter", refusal(400, billingtest.Refusal{Code: "resource_missing"}), billing.ErrStripeRequest, true},
		{"400 resource_missing of another parameter", refusal(400, billingtest.Refusal{Code: "resource_missing", Param: "on_behalf_of"}), billing.ErrStripeRequest, true},
		{"400 an unknown code", refusal(400, billingtest.Refusal{Code: "some_code_from_the_future"}), billing.ErrStripeRequest, true},
		{"404 without a code", refusal(404, billingtest.Refusal{Message: "Unrecognized request URL (POST: /v1/charge)."}), billing.ErrStripeRequest, true},
		{"402 that is not a card error", refusal(402, billingtest.Refusal{Code: "some_code_from_the_future"}), billing.ErrStripeRequest, true},
		{"401 api_key_expired", refusal(401, billingtest.Refusal{Code: "api_key_expired", Message: "Expired API Key provided: sk_test_****0000"}), billing.ErrStripeAuth, true},
		{"403 permission", refusal(403, billingtest.Refusal{Message: "The provided key does not have the required permissions for this endpoint."}), billing.ErrStripeAuth, true},
		{"a web server's HTML 404", func(t *testing.T, e *env) (*billing.Biller, func() int64) {
			web, n := countingServer(t, 404, "text/html", "<html><body><h1>404 Not Found</h1></body></html>")
			return e.biller(func(c *billing.Config) { c.StripeURL = web.URL }), n.Load
		}, billing.ErrStripeRequest, false},
		{"a spend-cap proxy's own 404", func(t *testing.T, e *env) (*billing.Biller, func() int64) {
			px, n := countingServer(t, 404, "application/json", `{"error":"no route for this path"}`)
			hc, err := spendcap.Client(px.URL, "vault_key_for_this_run_0001", &http.Client{Transport: testTransport})
			if err != nil {
				t.Fatal(err)
			}
			return e.biller(func(c *billing.Config) { c.HTTPClient = hc }), n.Load
		}, billing.ErrStripeRequest, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ids := customers(20)
			ctx := context.Background()
			bad, requests := c.bad(t, e)

			sum, err := bad.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: workers, BatchSize: 5})
			if !errors.Is(err, c.want) {
				t.Errorf("Run: %v; want an error wrapping %v", err, c.want)
			}
			var se *stripe.Error
			if c.stripeErr && !errors.As(err, &se) {
				t.Errorf("Run: %v; want the *stripe.Error in the chain", err)
			}
			if n := requests(); n > workers {
				t.Errorf("%d requests refused; the first refusal must stop the run (at most one per worker in flight)", n)
			}
			if sum.Declined != 0 || sum.Created != 0 {
				t.Errorf("summary %+v; want nothing failed or created", sum.Progress)
			}
			wantAllPending(t, e)
			if _, err := bad.Charge(ctx, "cus_single", period, nil); !errors.Is(err, c.want) {
				t.Errorf("Charge: %v; want an error wrapping %v", err, c.want)
			}
			wantAllPending(t, e)
			if st := e.srv.Stats(); st.Paid != 0 {
				t.Fatalf("Stripe moved money %d times with a bad configuration", st.Paid)
			}

			// The configuration is fixed: one Run bills everyone once.
			e.srv.SetScript(nil)
			all := append(ids, "cus_single")
			sum, err = e.biller().Run(ctx, period, billing.Customers(all...), nil)
			if err != nil || sum.Created != len(all) {
				t.Fatalf("Run after the fix: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, all)
		})
	}
}

// wantAllPending fails unless every claim row is pending.
// wantAllPending checks that a refusal of the request itself decided
// nothing for any customer: no claim is failed or succeeded. Claims this
// run made and never got executed at Stripe are abandoned (deleted), so
// the next run claims them afresh; any other stays pending.
func wantAllPending(t *testing.T, e *env) {
	t.Helper()
	var notPending int
	err := e.pool.QueryRow(context.Background(), "SELECT count(*) FILTER (WHERE state <> 'pending') FROM billonce_claims").Scan(&notPending)
	if err != nil {
		t.Fatal(err)
	}
	if notPending != 0 {
		t.Fatalf("%d claims are not pending; a refusal of the request itself decides nothing for the customer", notPending)
	}
}

// Outcomes are final: a refusal that is about one customer's own account or payment method
// (a decline, a missing customer or payment method, a payment method in the
// wrong state, an amount the currency does not allow) fails that customer's
// claim and only that one; the run goes on and bills everyone else once.
func TestCustomerRefusalFailsOnlyThatClaim(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		status  int
		refusal billingtest.Refusal
	}{
		{"402 card_declined", 402, billingtest.Refusal{Type: "card_error", Code: "card_declined", DeclineCode: "insufficient_funds"}},
		{"402 authentication_required", 402, billingtest.Refusal{Type: "card_error", Code: "authentication_required"}},
		{"400 card error without a 402", 400, billingtest.Refusal{Type: "card_error", Code: "expired_card"}},
		{"400 resource_missing customer", 400, billingtest.Refusal{Code: "resource_missing", Param: "customer", Message: "No such customer: 'cus_bad'"}},
		{"404 resource_missing customer", 404, billingtest.Refusal{Code: "resource_missing", Param: "customer"}},
		{"400 resource_missing payment_method", 400, billingtest.Refusal{Code: "resource_missing", Param: "payment_method"}},
		{"400 resource_missing source", 400, billingtest.Refusal{Code: "resource_missing", Param: "source"}},
		{"400 missing", 400, billingtest.Refusal{Code: "missing", Param: "source",
			Message: "Cannot charge a customer that has no active card"}},
		{"400 payment_method_unexpected_state", 400, billingtest.Refusal{Code: "payment_method_unexpected_state", Param: "payment_method"}},
		{"400 payment_intent_incompatible_payment_method", 400, billingtest.Refusal{Code: "payment_intent_incompatible_payment_method"}},
		{"400 invalid_source_usage", 400, billingtest.Refusal{Code: "invalid_source_usage"}},
		{"400 bank_account_unusable", 400, billingtest.Refusal{Code: "bank_account_unusable"}},
		{"400 amount_too_small", 400, billingtest.Refusal{Code: "amount_too_small", Param: "amount"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method == http.MethodPost && r.Customer == "cus_bad" {
					return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: c.status, Refusal: c.refusal}
				}
				return billingtest.Fault{}
			})
			ids := append(customers(10), "cus_bad")
			sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 3, BatchSize: 4})
			if err != nil || sum.Declined != 1 || sum.Created != len(ids)-1 {
				t.Fatalf("Run: %+v, %v; want one failure and the rest billed", sum.Progress, err)
			}
			var fe *billing.ChargeError
			if !(errors.As(sum.Failures[0], &fe) && errors.Is(sum.Failures[0], billing.ErrDeclined)) || fe.Customer != "cus_bad" || fe.Code != c.refusal.Code {
				t.Fatalf("failure %v; want ErrDeclined for cus_bad with code %q", sum.Failures[0], c.refusal.Code)
			}
			if st := e.claimOf("cus_bad").State; st != claim.StateFailed {
				t.Fatalf("cus_bad's claim is %s; want failed", st)
			}
			wantAllOnce(t, e.srv, ids[:len(ids)-1])
		})
	}
}

// A load balancer's own 502 page in front of Stripe says nothing about
// whether Stripe charged: it is retried with the same key like Stripe's 5xx,
// and when retries run out the claim stays pending.
func TestForeignServerErrorIsRetriedWithTheSameKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lb, n := countingServer(t, 502, "text/html", "<html><body>502 Bad Gateway</body></html>")
	b := e.biller(func(c *billing.Config) { c.StripeURL = lb.URL; c.Retry.MaxAttempts = 3 })
	_, err := b.Charge(context.Background(), "cus_lb", period, nil)
	var unknown *billing.ChargeError
	if !(errors.As(err, &unknown) && errors.Is(err, billing.ErrOutcomeUnknown)) {
		t.Fatalf("Charge: %v; want ErrOutcomeUnknown", err)
	}
	if got := n.Load(); got < 3 {
		t.Fatalf("%d requests; want the 3 attempts of the policy (and a search)", got)
	}
	wantAllPending(t, e)
}

// After a Run stopped by ErrStripeAuth, a Run with a fixed key bills
// everyone at once, as ErrStripeAuth's documented recovery says.
//
// Scenario: the Stripe key has expired. A Run claims its first batch, the
// first send gets 401, the run stops with ErrStripeAuth and leaves the
// claims pending "to be resumed with the same keys once the cause is
// fixed" (errors.go). The operator fixes the cause the only way there is:
// a new key. Stripe stored nothing for any of these keys (a 401 is refused
// before execution), so sending them is safe.
//
// Expected: the next Run bills everyone once. A claim that recorded the
// expired key's fingerprint, although no request under it ever executed,
// would leave every claimed customer with ErrSentElsewhere, unbilled until
// 23 h after the claim.
func TestRunWithFixedKeyAfter401BillsEveryoneOnce(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{APIKeys: []string{rotatedKey}})
	ctx := context.Background()
	cs := customers(5)
	_, err := e.b.Run(ctx, period, billing.Customers(cs...), nil)
	if !errors.Is(err, billing.ErrStripeAuth) {
		t.Fatalf("Run with the expired key = %v, want ErrStripeAuth", err)
	}
	fixed := e.biller(func(c *billing.Config) { c.SecretKey = rotatedKey })
	sum, err := fixed.Run(ctx, period, billing.Customers(cs...), nil)
	for _, c := range cs {
		if n := e.count(c); n != 1 {
			t.Errorf("%s charged %d times after the key was fixed, want 1", c, n)
		}
	}
	if err != nil || !sum.Complete() {
		var idErr *billing.ChargeError
		if len(sum.Failures) > 0 && errors.As(sum.Failures[0], &idErr) && errors.Is(sum.Failures[0], billing.ErrSentElsewhere) {
			t.Logf("first failure: %v", sum.Failures[0])
		}
		t.Errorf("Run with the fixed key = %+v, %v; want complete", sum.Progress, err)
	}
}
