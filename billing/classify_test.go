package billing_test

import (
	"context"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/retry"
)

// stripeClient is a plain stripe-go client on url, without retries of its
// own, as a team with its own calls would build it.
func stripeClient(url, key string) charge.Client {
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(url),
		HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	return charge.Client{B: backend, Key: key}
}

func chargeParams(ctx context.Context, customer, key, currency string, amt int64) *stripe.ChargeParams {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amt), Currency: stripe.String(currency), Customer: stripe.String(customer)}
	p.Context = ctx
	if key != "" {
		p.IdempotencyKey = stripe.String(key)
	}
	return p
}

// TestClassify checks every row of the classification table against errors
// that stripe-go returned from the fake (real status codes, bodies and
// Stripe-Should-Retry headers), plus network failures and the few answers
// the fake never gives, built by hand and marked so.
func TestClassify(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	c := stripeClient(srv.URL, secretKey)
	bg := context.Background()
	send := func(ctx context.Context, customer, key string) error {
		_, err := c.New(chargeParams(ctx, customer, key, "usd", amount))
		return err
	}
	fault := func(customer string, kind billingtest.FaultKind) error {
		srv.FailNext(billingtest.Match{Customer: customer}, billingtest.Fault{Kind: kind})
		return send(bg, customer, "key_"+customer)
	}
	again, stop := retry.After(0), retry.Stop()
	after := retry.After

	type row struct {
		name string
		err  func(t *testing.T) error
		want retry.Decision
	}
	rows := []row{
		{"500 before commit, Stripe-Should-Retry: true", func(*testing.T) error { return fault("c500b", billingtest.FaultErrorBefore) }, again},
		{"500 stored after commit, Stripe-Should-Retry: false", func(*testing.T) error { return fault("c500a", billingtest.FaultErrorAfter) }, stop},
		{"409 idempotency_key_in_use (injected)", func(*testing.T) error { return fault("c409", billingtest.FaultInFlight) }, after(time.Second)},
		{"409 idempotency_key_in_use (first request executing)", func(t *testing.T) error {
			release, arrived := make(chan struct{}), make(chan struct{})
			srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Customer == "c409r" && r.Attempt == 1 {
					close(arrived)
					return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
				}
				return billingtest.Fault{}
			})
			defer srv.SetScript(nil)
			first := make(chan error, 1)
			go func() { first <- send(bg, "c409r", "key_c409r") }()
			<-arrived
			// The script answers as the request arrives, before the fake
			// stores its charge and holds the answer: wait for the charge.
			waitFor(t, func() bool { return srv.Count("c409r") > 0 })
			err := send(bg, "c409r", "key_c409r")
			close(release)
			if ferr := <-first; ferr != nil {
				t.Errorf("first request: %v", ferr)
			}
			return err
		}, after(time.Second)},
		{"429 lock_timeout, Stripe-Should-Retry: true", func(*testing.T) error { return fault("c429l", billingtest.FaultLockTimeout) }, again},
		{"429 rate_limit (injected)", func(*testing.T) error { return fault("c429r", billingtest.FaultRateLimit) }, after(2 * time.Second)},
		{"429 rate_limit (the fake's limiter)", func(t *testing.T) error {
			limited := newServer(t, billingtest.Config{RateLimit: 0.001, RateBurst: 1})
			lc := stripeClient(limited.URL, secretKey)
			if _, err := lc.New(chargeParams(bg, "c429", "k1", "usd", amount)); err != nil {
				t.Fatalf("first request: %v", err)
			}
			_, err := lc.New(chargeParams(bg, "c429", "k2", "usd", amount))
			return err
		}, after(2 * time.Second)},
		{"400 idempotency_error", func(t *testing.T) error {
			if err := send(bg, "cidem", "key_cidem"); err != nil {
				t.Fatal(err)
			}
			_, err := c.New(chargeParams(bg, "cidem", "key_cidem", "usd", amount+1))
			return err
		}, stop},
		{"402 card_error decline", func(*testing.T) error {
			srv.Decline("cdecl", "insufficient_funds")
			return send(bg, "cdecl", "key_cdecl")
		}, stop},
		{"400 invalid_request_error", func(*testing.T) error {
			_, err := c.New(chargeParams(bg, "cbad", "key_cbad", "zzz", amount))
			return err
		}, stop},
		{"401 unknown API key", func(t *testing.T) error {
			strict := newServer(t, billingtest.Config{APIKeys: []string{"sk_test_someone_else_entirely_0000"}})
			_, err := stripeClient(strict.URL, secretKey).New(chargeParams(bg, "c401", "k", "usd", amount))
			return err
		}, stop},
		{"404 no such object", func(*testing.T) error {
			_, err := c.Get("ch_does_not_exist", nil)
			return err
		}, stop},
		{"connection cut after commit", func(*testing.T) error { return fault("ccut", billingtest.FaultCut) }, again},
		{"connection refused", func(t *testing.T) error {
			gone := billingtest.NewServer(billingtest.Config{})
			gone.Close()
			_, err := stripeClient(gone.URL, secretKey).New(chargeParams(bg, "cref", "k", "usd", amount))
			return err
		}, again},
		{"attempt timeout", func(*testing.T) error {
			release := make(chan struct{})
			defer close(release)
			srv.FailNext(billingtest.Match{Customer: "cslow"}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
			ctx, cancel := context.WithTimeout(bg, 100*time.Millisecond)
			defer cancel()
			return send(ctx, "cslow", "key_cslow")
		}, again},
		{"caller cancelled", func(*testing.T) error {
			ctx, cancel := context.WithCancel(bg)
			cancel()
			return send(ctx, "ccancel", "key_ccancel")
		}, stop},
		{"spend cap reached", func(*testing.T) error { return fmt.Errorf("proxy: %w", spendcap.ErrSpendCapReached) }, stop},
		{"vault key revoked", func(*testing.T) error { return fmt.Errorf("proxy: %w", spendcap.ErrVaultKeyRevoked) }, stop},
		{"endpoint not allowed", func(*testing.T) error { return fmt.Errorf("proxy: %w", spendcap.ErrEndpointNotAllowed) }, stop},
		{"Stripe auth", func(*testing.T) error { return fmt.Errorf("run: %w", billing.ErrStripeAuth) }, stop},
		{"nil", func(*testing.T) error { return nil }, stop},
		{"hand-built: 503 without header", func(*testing.T) error { return handBuilt(503, "api_error", "") }, again},
		{"hand-built: 400 with Stripe-Should-Retry: true is obeyed", func(*testing.T) error { return handBuilt(400, "invalid_request_error", "true") }, again},
		{"hand-built: 409 with Stripe-Should-Retry: false is obeyed", func(*testing.T) error { return handBuilt(409, "invalid_request_error", "false") }, stop},
		{"hand-built: 402 card_error with Stripe-Should-Retry: true is still final", func(*testing.T) error { return handBuilt(402, "card_error", "true") }, stop},
	}
	for _, r := range rows {
		t.Run(r.name, func(t *testing.T) {
			err := r.err(t)
			if r.name != "nil" && err == nil {
				t.Fatal("the fake gave no error")
			}
			got := billing.Classify(err)
			if got.Retry() != r.want.Retry() || got.Wait() != r.want.Wait() {
				t.Fatalf("Classify(%v) = %v, want %v", err, got, r.want)
			}
			// The same decision must hold through wrapping, as retry.Do
			// and callers wrap errors.
			if err != nil {
				if w := billing.Classify(fmt.Errorf("wrapped: %w", err)); w != got {
					t.Fatalf("wrapped: %v, unwrapped: %v", w, got)
				}
			}
		})
	}
}

// handBuilt is a *stripe.Error as stripe-go builds it, for answers the fake
// never gives.
func handBuilt(status int, typ stripe.ErrorType, shouldRetry string) error {
	h := http.Header{}
	if shouldRetry != "" {
		h.Set("Stripe-Should-Retry", shouldRetry)
	}
	return &stripe.Error{HTTPStatusCode: status, Type: typ, Msg: "hand-built",
		APIResource: stripe.APIResource{LastResponse: &stripe.APIResponse{Header: h, StatusCode: status}}}
}

// Classify plugs into retry.Do for a team's own stripe-go calls: a lost
// response and a lock_timeout are retried with the same key, one charge.
func TestClassifyWithRetryDo(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	c := stripeClient(srv.URL, secretKey)
	srv.FailNext(billingtest.Match{Customer: "cus_own"},
		billingtest.Fault{Kind: billingtest.FaultCut}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	key, err := idemkey.For("own-calls", "cus_own", period)
	if err != nil {
		t.Fatal(err)
	}
	p := retry.Policy{Classify: billing.Classify, InitialInterval: time.Millisecond, MaxInterval: time.Millisecond}
	ch, err := retry.Do(context.Background(), key, p, func(ctx context.Context, key idemkey.Key) (*stripe.Charge, error) {
		return c.New(chargeParams(ctx, "cus_own", key.String(), "usd", amount))
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.Count("cus_own"); n != 1 || ch.ID != srv.Payments()[0].ID {
		t.Fatalf("%d charges; want 1, the one returned", n)
	}
	if st := srv.Stats(); st.Requests != 3 {
		t.Fatalf("%d requests; want 3 (cut, lock_timeout, replay)", st.Requests)
	}
}
