package billingtest_test

import (
	"fmt"
	"net/url"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

// declinedIntent makes an off-session PaymentIntent for customer that
// Stripe declines with authentication_required, and returns its id.
func declinedIntent(tb testing.TB, srv *billingtest.Server, api *client.API, customer string) string {
	tb.Helper()
	srv.Decline(customer, "authentication_required")
	p := &stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"), Customer: stripe.String(customer),
		PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
	p.SetIdempotencyKey("create-" + customer)
	_, err := api.PaymentIntents.New(p)
	se := stripeErr(tb, err)
	if se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		tb.Fatalf("off session: %+v; want declined, requiring a payment method", se)
	}
	srv.Honor(customer)
	return se.PaymentIntent.ID
}

// A declined PaymentIntent is canceled once: the cancel replays under its
// key, and nothing completes the PaymentIntent afterwards, on session or
// by Server.ConfirmIntent. A PaymentIntent that succeeded, is processing
// or is canceled already is refused with payment_intent_unexpected_state,
// which stores nothing under the key; an unknown id is a 404 and an
// unknown reason a 400.
func TestCanceledIntentCannotBeCompleted(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	cancel := func(id, key, reason string) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentCancelParams{}
		if reason != "" {
			p.CancellationReason = stripe.String(reason)
		}
		p.SetIdempotencyKey(key)
		return api.PaymentIntents.Cancel(id, p)
	}
	id := declinedIntent(t, srv, api, "cus_3ds")
	pi, err := cancel(id, "cancel-1", "abandoned")
	if err != nil || pi.ID != id || pi.Status != stripe.PaymentIntentStatusCanceled {
		t.Fatalf("cancel = %+v, %v; want %s canceled", pi, err, id)
	}
	again, err := cancel(id, "cancel-1", "abandoned")
	if err != nil || again.Status != stripe.PaymentIntentStatusCanceled || again.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Errorf("the same cancel again = %+v, %v; want its replay", again, err)
	}
	if _, err := cancel(id, "cancel-1", "duplicate"); stripeErr(t, err).Type != stripe.ErrorTypeIdempotency {
		t.Errorf("the key with another reason = %v; want idempotency_error", err)
	}
	if _, err := cancel(id, "cancel-2", ""); stripeErr(t, err).Code != "payment_intent_unexpected_state" {
		t.Errorf("a canceled PaymentIntent canceled again = %v; want payment_intent_unexpected_state", err)
	}
	p := &stripe.PaymentIntentConfirmParams{}
	p.SetIdempotencyKey("on-session")
	if _, err := api.PaymentIntents.Confirm(id, p); stripeErr(t, err).Code != "payment_intent_unexpected_state" {
		t.Errorf("a canceled PaymentIntent confirmed on session = %v; want payment_intent_unexpected_state", err)
	}
	if err := srv.ConfirmIntent(id); err == nil {
		t.Error("Server.ConfirmIntent completed a canceled PaymentIntent")
	}
	if n := srv.Count("cus_3ds"); n != 0 {
		t.Errorf("cus_3ds paid %d times, want 0", n)
	}
	var types []string
	for _, ev := range srv.Events() {
		if ev.ObjectID == id {
			types = append(types, ev.Type)
		}
	}
	if want := "[payment_intent.payment_failed payment_intent.canceled]"; fmt.Sprint(types) != want {
		t.Errorf("events of %s = %v, want %s", id, types, want)
	}

	paid := declinedIntent(t, srv, api, "cus_paid")
	if err := srv.ConfirmIntent(paid); err != nil {
		t.Fatal(err)
	}
	srv.SettleLater("cus_slow", billingtest.Async{After: time.Hour})
	slow := declinedIntent(t, srv, api, "cus_slow")
	if pi, err := api.PaymentIntents.Confirm(slow, &stripe.PaymentIntentConfirmParams{Params: stripe.Params{IdempotencyKey: stripe.String("slow-on-session")}}); err != nil ||
		pi.Status != stripe.PaymentIntentStatusProcessing {
		t.Fatalf("a customer who settles later confirms on session: %+v, %v; want processing", pi, err)
	}
	for _, id := range []string{paid, slow} {
		for range 2 { // a refusal stores nothing: the same key is refused again
			if _, err := cancel(id, "cancel-"+id, "abandoned"); stripeErr(t, err).Code != "payment_intent_unexpected_state" {
				t.Errorf("cancel of %s = %v; want payment_intent_unexpected_state", id, err)
			}
		}
	}
	srv.Advance(time.Hour)
	if got, err := api.PaymentIntents.Get(slow, nil); err != nil || got.Status != stripe.PaymentIntentStatusSucceeded || srv.Count("cus_slow") != 1 {
		t.Errorf("the processing PaymentIntent an hour later = %+v, %v, counted %d; want succeeded, counted once", got, err, srv.Count("cus_slow"))
	}
	if _, err := cancel("pi_missing", "cancel-missing", ""); stripeErr(t, err).Code != stripe.ErrorCodeResourceMissing {
		t.Errorf("cancel of an unknown id = %v; want resource_missing", err)
	}
	resp, _ := do(t, srv, "POST", "/v1/payment_intents/"+paid+"/cancel", "cancel-bad", url.Values{"cancellation_reason": {"bored"}})
	if resp.StatusCode != 400 {
		t.Errorf("an unknown cancellation_reason = %d; want 400", resp.StatusCode)
	}
}
