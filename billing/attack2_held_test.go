package billing_test

// Attacks on abandoning unsent claims and on the 24-hour rule for claims
// sent elsewhere, each counting payments at the fake Stripe.

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// An executed attempt (committed, answer cut) followed by retries that are
// all refused before execution (401, 429, 403, 400): the claim is kept, not
// abandoned, and a rotated Biller within the window sends nothing; after
// the window its search finds the payment.
func TestAttack2HeldCutThenRefusals(t *testing.T) {
	for _, refusal := range []billingtest.Fault{
		{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized},
		{Kind: billingtest.FaultRefuse, Status: http.StatusForbidden},
		{Kind: billingtest.FaultRefuse, Status: http.StatusBadRequest, Refusal: billingtest.Refusal{Code: "parameter_unknown"}},
		{Kind: billingtest.FaultRateLimit},
	} {
		t.Run(string(refusal.Kind)+"/"+http.StatusText(refusal.Status), func(t *testing.T) {
			e := newEnv(t)
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
func TestAttack2HeldStoppedRunThenRotatedRun(t *testing.T) {
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
