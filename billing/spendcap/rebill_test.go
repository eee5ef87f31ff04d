package spendcap_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/paymentintent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// A Rebill behind the proxy cancels the declined attempt's PaymentIntent
// before it pays, with a vault key that allows canceling a PaymentIntent
// and not confirming one: the declined PaymentIntent can no longer be
// completed, and the period is paid once.
func TestRebillThroughTheProxyCancelsTheDeclinedIntent(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, px := newProxy(t, spendcaptest.Config{})
	allowed := []string{"POST /v1/payment_intents", "POST /v1/payment_intents/*/cancel", "GET /v1/payment_intents/*"}
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 10000, AllowedEndpoints: allowed})
	hc, err := spendcap.Client(px.URL, vaultKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{
		SecretKey: vaultKey, HTTPClient: hc, StripeURL: px.URL, API: billing.PaymentIntents, Claims: store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.Decline("cus_1", "authentication_required")
	if _, err := b.Charge(ctx, "cus_1", "2026-09", nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Charge = %v, want declined", err)
	}
	declined := srv.Payments()[0].ID
	srv.Honor("cus_1")
	if _, err := b.Rebill(ctx, "cus_1", "2026-09", 2, nil); err != nil {
		t.Fatalf("Rebill(2) through the proxy = %v, want it paid", err)
	}

	// The customer tries to complete the declined PaymentIntent, with the
	// real secret (through the vault key, confirming is not allowed).
	p := &stripe.PaymentIntentConfirmParams{}
	p.SetIdempotencyKey("on-session-" + declined)
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(srv.URL), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
	_, err = (&paymentintent.Client{B: backend, Key: upstreamKey}).Confirm(declined, p)
	if se := (*stripe.Error)(nil); !errors.As(err, &se) || se.Code != "payment_intent_unexpected_state" {
		t.Errorf("completing %s after the re-bill = %v, want it refused: canceled by the re-bill", declined, err)
	}
	if n := srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Errorf("cus_1 paid %d times for 2026-09, want once", n)
	}
	confirm := &stripe.PaymentIntentConfirmParams{}
	confirm.SetIdempotencyKey("through-the-proxy")
	vb := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(px.URL), HTTPClient: hc, LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
	if _, err := (&paymentintent.Client{B: vb, Key: vaultKey}).Confirm(declined, confirm); !errors.Is(err, spendcap.ErrEndpointNotAllowed) {
		t.Errorf("confirming a PaymentIntent with the vault key = %v, want ErrEndpointNotAllowed", err)
	}
}
