package billing_test

// Unsent claims are abandoned (deleted); a claim whose key may have
// executed at Stripe never is. The oracle is the fake Stripe's ledger.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// A claim whose key executed is never abandoned, even when the last
// answer says the request was refused before execution.
//
// send decides "nothing executed" from the errors stripe-go returns, one
// per b.create call. But one b.create can be several HTTP requests:
// net/http transparently resends a POST carrying an Idempotency-Key when a
// reused keep-alive connection closes before any byte of the answer. The
// first request executed (the charge exists); the Biller sees only the
// resend's 429 rate_limit, calls it refusedBeforeExecution, and, were it to
// Abandon, the claim would be deleted and the next Biller (rotated key)
// would win a fresh claim and charge again.
func TestTransparentResendKeepsClaimOfExecutedAttempt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		fault billingtest.Fault
	}{
		{"rate_limit", billingtest.Fault{Kind: billingtest.FaultRateLimit}},
		{"401", billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized,
			Refusal: billingtest.Refusal{Message: "Invalid API Key provided: sk_test_***"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			ctx := context.Background()
			// A first charge leaves a keep-alive connection in the pool.
			if _, err := e.b.Charge(ctx, "cus_0", period, nil); err != nil {
				t.Fatal(err)
			}
			e.srv.SetScript(dropThenRefuse(e.key("cus_1"), tc.fault))
			_, err1 := e.b.Charge(ctx, "cus_1", period, nil)
			e.srv.SetScript(nil)
			if n := e.count("cus_1"); n != 1 {
				t.Fatalf("setup: %d charges after the dropped answer, want 1 (%v)", n, err1)
			}
			rows := e.claimRows()

			rotated := e.biller(func(c *billing.Config) { c.SecretKey = rotatedKey })
			r, err2 := rotated.Charge(ctx, "cus_1", period, nil)
			if n := e.count("cus_1"); n != 1 {
				t.Fatalf("cus_1 charged %d times, want 1: first Charge = %v (claim rows after it: %d); rotated Charge = %+v, %v",
					n, err1, rows, r, err2)
			}
		})
	}
}

// The same, without any reconfiguration: the same deleted claim, and the
// next day's run with the same Biller. Stripe has forgotten the key, and no
// claim remembers it was ever sent.
func TestTransparentResendThenNextDayChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	if _, err := e.b.Charge(ctx, "cus_0", period, nil); err != nil {
		t.Fatal(err)
	}
	e.srv.SetScript(dropThenRefuse(e.key("cus_1"), billingtest.Fault{Kind: billingtest.FaultRateLimit}))
	_, err1 := e.b.Charge(ctx, "cus_1", period, nil)
	e.srv.SetScript(nil)
	e.advance(25 * time.Hour)
	sum, err2 := e.b.Run(ctx, period, billing.Customers("cus_0", "cus_1"), nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1: first Charge = %v; next day's Run = %+v, %v", n, err1, sum.Progress, err2)
	}
}

// An executed attempt (committed, answer cut) followed by retries that are
// all refused before execution (401, 429, 403, 400): the claim is kept, not
// abandoned, and a rotated Biller within the window sends nothing; after
// the window its search finds the payment.
func TestAnswerCutThenRefusalsKeepsClaim(t *testing.T) {
	t.Parallel()
	for _, refusal := range []billingtest.Fault{
		{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized},
		{Kind: billingtest.FaultRefuse, Status: http.StatusForbidden},
		{Kind: billingtest.FaultRefuse, Status: http.StatusBadRequest, Refusal: billingtest.Refusal{Code: "parameter_unknown"}},
		{Kind: billingtest.FaultRateLimit},
	} {
		t.Run(string(refusal.Kind)+"/"+http.StatusText(refusal.Status), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, serverWaitsSkipped)
			ctx := context.Background()
			key := e.key("cus_1")
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				switch {
				case strings.HasSuffix(r.Path, "/search"):
					return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
				case r.Method == http.MethodPost && r.IdempotencyKey == key && r.Attempt == 1:
					return billingtest.Fault{Kind: billingtest.FaultCut}
				case r.Method == http.MethodPost && r.IdempotencyKey == key:
					return refusal
				}
				return billingtest.Fault{}
			})
			_, err1 := e.b.Charge(ctx, "cus_1", period, nil)
			e.srv.SetScript(nil)
			if e.claimRows() != 1 {
				t.Fatalf("claim gone after an executed attempt (%v)", err1)
			}
			rotated := e.biller(func(c *billing.Config) { c.SecretKey = rotatedKey })
			_, err2 := rotated.Charge(ctx, "cus_1", period, nil)
			e.advance(24*time.Hour + time.Minute)
			_, err3 := rotated.Charge(ctx, "cus_1", period, nil)
			if n := e.count("cus_1"); n != 1 {
				t.Fatalf("cus_1 charged %d times, want 1 (%v; %v; %v)", n, err1, err2, err3)
			}
		})
	}
}

// A Run stopped by a 401 abandons the claims it never sent; a Run with the
// rotated key then bills each customer once, including the one whose
// attempt executed before the stop.
func TestRunStoppedBy401ThenRotatedRunBillsEachOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ids := customers(20)
	stopKey := e.key(ids[3])
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.Method == http.MethodPost && r.IdempotencyKey == stopKey {
			return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized}
		}
		return billingtest.Fault{}
	})
	_, err1 := e.b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 2, BatchSize: 5})
	e.srv.SetScript(nil)
	rotated := e.biller(func(c *billing.Config) { c.SecretKey = rotatedKey })
	e.advance(25 * time.Hour)
	sum, err2 := rotated.Run(ctx, period, billing.Customers(ids...), nil)
	for _, id := range ids {
		if n := e.srv.CountPeriod(id, period); n != 1 {
			t.Errorf("%s charged %d times, want 1 (%v; %+v, %v)", id, n, err1, sum.Progress, err2)
		}
	}
}
