package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A support script's declined charge of its own amount that copies a
// claim's metadata is what Stripe's search shows first, while the claim's own charge, made but
// its answer lost, is not indexed yet. The decline is not the claim's: the
// claim stays pending, and its next resume gets Stripe's own answer to its
// key, so the period is charged once, counted at the fake.
func TestSearchHitOfAnotherWritersDeclineLeavesAPendingClaim(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{SearchDelay: time.Minute}, oneAttempt)
	ctx := context.Background()
	key := e.key("cus_1")
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultDecline, DeclineCode: "insufficient_funds"})
	p := &stripe.ChargeParams{Amount: stripe.Int64(4242), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
	p.Metadata = map[string]string{billing.MetaKey: key, billing.MetaCustomer: "cus_1", billing.MetaPeriod: period}
	//idemvet:ignore a support script's own charge, which sends no key
	if _, err := (&charge.Client{B: e.otherBackend(), Key: secretKey}).New(p); err == nil {
		t.Fatal("the support script's charge went through; want it declined")
	}
	e.srv.Advance(2 * time.Minute) // the script's decline is searchable now
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	_, err := e.b.Charge(ctx, "cus_1", period, nil)
	if errors.Is(err, billing.ErrDeclined) {
		_, _ = e.b.Rebill(ctx, "cus_1", period, 2, nil) // as the decline advises
	} else if !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Errorf("Charge with its answer lost = %v; want ErrOutcomeUnknown", err)
	}
	if c := e.claimOf("cus_1"); c.State != claim.StatePending {
		t.Errorf("claim = %s (%s); want pending: the only decline search found is another writer's", c.State, c.LastError)
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Outcome != billing.Replayed {
		t.Errorf("second Charge = %+v, %v; want Stripe's replay of the claim's own charge", r, err)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Errorf("cus_1 charged %d times for %s; want exactly once", n, period)
	}
}
