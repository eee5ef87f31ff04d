package billing_test

// Attacks that once charged twice through a deleted claim. The oracle is
// the fake Stripe's ledger.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// dropThenRefuse is a fault script for customer's key: its first POST is
// committed and the connection closed before a byte of the answer (a load
// balancer closing a keep-alive connection); net/http resends the POST by
// itself, as it does for any request with an Idempotency-Key on a reused
// connection, and that resend is refused with refusal before execution.
// Searches are down.
func dropThenRefuse(key string, refusal billingtest.Fault) func(billingtest.Request) billingtest.Fault {
	return func(r billingtest.Request) billingtest.Fault {
		switch {
		case strings.HasSuffix(r.Path, "/search"):
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		case r.Method == http.MethodPost && r.IdempotencyKey == key && r.Attempt == 1:
			return billingtest.Fault{Kind: billingtest.FaultDrop}
		case r.Method == http.MethodPost && r.IdempotencyKey == key:
			return refusal
		}
		return billingtest.Fault{}
	}
}

// A double charge through Abandon, now guarded.
//
// send decides "nothing executed" from the errors stripe-go returns, one
// per b.create call. But one b.create can be several HTTP requests:
// net/http transparently resends a POST carrying an Idempotency-Key when a
// reused keep-alive connection closes before any byte of the answer. The
// first request executed (the charge exists); the Biller sees only the
// resend's 429 rate_limit, calls it refusedBeforeExecution, and Abandon
// DELETES the claim. The next Biller (rotated key) wins a fresh claim and
// charges again.
func TestAttack2TransparentResendHidesExecutedAttempt(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault billingtest.Fault
	}{
		{"rate_limit", billingtest.Fault{Kind: billingtest.FaultRateLimit}},
		{"401", billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized,
			Refusal: billingtest.Refusal{Message: "Invalid API Key provided: sk_test_***"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
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
func TestAttack2TransparentResendThenNextDay(t *testing.T) {
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
