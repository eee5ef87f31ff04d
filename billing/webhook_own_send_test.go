package billing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/paymentintent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Which events may move a claim: only those shown to be about the claim's
// own send. A key in an object's metadata is whatever its writer chose.

// otherBackend is a stripe-go backend on the fake for code other than
// billonce's: a support script, a second integration.
func (e *env) otherBackend() stripe.Backend {
	return stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.srv.URL),
		HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
}

// A support script makes a payment of its own for a customer whose charge
// succeeded but whose answer was lost, copying billonce's metadata, and
// the card declines it. Its failure event must not fail the pending claim
// (the Rebill a declined period invites would charge the customer twice):
// until the claim records its payment, no event is shown to be about its
// own send, and its resume with the same key gets Stripe's replay.
func TestWebhookForeignDeclineWithTheClaimsMetadataLeavesThePendingClaim(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, nil)
			ctx := context.Background()
			h.lostAnswer(h.biller(oneAttempt, func(c *billing.Config) { c.API = api }), "cus_1")
			key := h.key("cus_1")
			ours := h.srv.Payments()[0].ID
			meta := map[string]string{billing.MetaKey: key, billing.MetaCustomer: "cus_1", billing.MetaPeriod: period}
			h.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultDecline, DeclineCode: "insufficient_funds"})
			var err error
			if api == billing.Charges {
				p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
				p.Metadata = meta
				//idemvet:ignore a support script's own charge, which sends no key
				_, err = (&charge.Client{B: h.otherBackend(), Key: secretKey}).New(p)
			} else {
				p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String("cus_1"),
					PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
				p.Metadata = meta
				//idemvet:ignore a support script's own payment, which sends no key
				_, err = (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).New(p)
			}
			if se := (*stripe.Error)(nil); !errors.As(err, &se) || se.HTTPStatusCode != http.StatusPaymentRequired {
				t.Fatalf("the support script's payment = %v, want declined", err)
			}
			// The decline's event reaches the webhook first, then ours.
			evs := h.srv.Events()
			for i := len(evs) - 1; i >= 0; i-- {
				if got := h.deliver(evs[i]); got != "unproven" {
					t.Errorf("%s answered %q, want unproven", evs[i].Type, got)
				}
			}
			if c := h.claimOf("cus_1"); c.State != claim.StatePending {
				t.Errorf("claim after another payment's events = %s (%s), want pending: nothing shows they are about its send", c.State, c.LastError)
			}
			r, err := h.b.Charge(ctx, "cus_1", period, nil)
			if errors.Is(err, billing.ErrDeclined) {
				_, _ = h.b.Rebill(ctx, "cus_1", period, 2, nil) // as the decline advises
			} else if err != nil || r.Outcome != billing.Replayed || r.StripeID != ours {
				t.Errorf("Charge = %+v, %v; want Stripe's replay of %s", r, err, ours)
			}
			if n := h.count("cus_1"); n != 1 {
				t.Errorf("%d payments for the period, want 1", n)
			}
		})
	}
}
