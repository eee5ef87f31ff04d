package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// A pending refund's claim whose refund_of was lost (edited by hand, or
// written back by a tool that does not know the column) is still a
// refund's claim, by its endpoint: Reconcile never resumes it as a charge
// of its customer, whatever time has passed.
func TestRefundClaimWithoutItsPaymentIsNeverResumedAsACharge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_q")
	b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/refunds"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/refunds"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	_, err := b.Refund(context.Background(), "cus_q", period, "rma-q", 900)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) {
		t.Fatalf("refund with its outcome unknown: %v, want ErrOutcomeUnknown", err)
	}
	e.exec("UPDATE billonce_claims SET refund_of = NULL WHERE key = $1", ce.Key)
	e.ageClaim(ce.Key, 50*time.Hour)
	e.srv.Advance(50 * time.Hour)
	sum, rerr := e.b.Reconcile(context.Background(), nil)
	var charges int
	for _, p := range e.srv.Payments() {
		if p.Customer == "cus_q" {
			charges++
		}
	}
	if charges != 1 || len(refundsOf(e, pay)) != 0 {
		t.Fatalf("Stripe holds %d payments of cus_q (want the one) and refunds %+v; Reconcile = %+v, %v", charges, refundsOf(e, pay), sum, rerr)
	}
}
