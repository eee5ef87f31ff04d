package billingtest_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/billonce/billonce/billing/billingtest"
)

// An asynchronous customer's charge is pending and out of the ledger until
// its time comes on the server's clock; then it succeeds (counted) or fails
// (not counted), and each step is an event.
func TestAsyncSettlement(t *testing.T) {
	srv := newServer(t, billingtest.Config{Async: map[string]billingtest.Async{
		"cus_ok":   {After: time.Hour},
		"cus_fail": {After: time.Hour, FailureCode: "account_closed"},
	}})
	api := newAPI(t, srv, testKey, nil)
	var ids []string
	for _, c := range []string{"cus_ok", "cus_fail"} {
		//idemvet:ignore settlement and webhooks do not depend on the key; each call is one charge on purpose
		ch, err := api.Charges.New(&stripe.ChargeParams{Amount: stripe.Int64(500), Currency: stripe.String("usd"), Customer: stripe.String(c)})
		if err != nil || ch.Status != "pending" {
			t.Fatalf("charge for %s = %+v, %v; want pending", c, ch, err)
		}
		ids = append(ids, ch.ID)
	}
	if srv.Count("cus_ok") != 0 || srv.SettleNow() != 0 {
		t.Fatal("a pending charge is counted or settled early")
	}
	srv.Advance(time.Hour)
	if srv.Count("cus_ok") != 1 || srv.Count("cus_fail") != 0 {
		t.Fatalf("after settlement: counts %d, %d", srv.Count("cus_ok"), srv.Count("cus_fail"))
	}
	ch, err := api.Charges.Get(ids[1], nil)
	if err != nil || ch.Status != "failed" || ch.FailureCode != "account_closed" {
		t.Fatalf("failed charge = %+v, %v", ch, err)
	}
	var types []string
	for _, e := range srv.Events() {
		types = append(types, e.Type)
	}
	want := "[charge.pending charge.pending charge.succeeded charge.failed]"
	if got := stringsOf(types); got != want {
		t.Fatalf("events = %s, want %s", got, want)
	}
	if f := srv.Final(); f[ids[0]] != "succeeded" || f[ids[1]] != "failed" {
		t.Fatalf("final = %v", f)
	}
}

func stringsOf(s []string) string {
	out := "["
	for i, x := range s {
		if i > 0 {
			out += " "
		}
		out += x
	}
	return out + "]"
}

// The sender signs as Stripe does (stripe-go's webhook package accepts
// it), duplicates as asked, and retries an endpoint that answers 500.
func TestSenderSignsDuplicatesAndRetries(t *testing.T) {
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	for range 10 {
		//idemvet:ignore settlement and webhooks do not depend on the key; each call is one charge on purpose
		if _, err := api.Charges.New(&stripe.ChargeParams{Amount: stripe.Int64(500), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}); err != nil {
			t.Fatal(err)
		}
	}
	const secret = "whsec_sender_test"
	var mu sync.Mutex
	seen := map[string]int{}
	failed := map[string]bool{}
	endpoint := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		ev, err := webhook.ConstructEventWithOptions(body, r.Header.Get("Stripe-Signature"), secret, webhook.ConstructEventOptions{IgnoreAPIVersionMismatch: true})
		if err != nil {
			t.Errorf("stripe-go refused the signature: %v", err)
			w.WriteHeader(400)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !failed[ev.ID] { // the first delivery of each event fails
			failed[ev.ID] = true
			w.WriteHeader(500)
			return
		}
		seen[ev.ID]++
	}))
	defer endpoint.Close()
	s, err := billingtest.NewSender(billingtest.SenderConfig{URL: endpoint.URL, Secret: secret, Seed: 3, Duplicate: 0.5, Reorder: true})
	if err != nil {
		t.Fatal(err)
	}
	rep := s.Send(context.Background(), srv.Events())
	if rep.Events != 10 || rep.Deliveries != 10+rep.Duplicates || rep.Duplicates == 0 || len(rep.Undelivered) != 0 || rep.Retries < 10 {
		t.Fatalf("report = %+v", rep)
	}
	total := 0
	for _, n := range seen {
		total += n
	}
	if len(seen) != 10 || total != rep.Deliveries {
		t.Fatalf("endpoint saw %d events, %d accepted deliveries; report %+v", len(seen), total, rep)
	}
	if _, err := billingtest.NewSender(billingtest.SenderConfig{URL: endpoint.URL}); err == nil {
		t.Error("a sender without a secret was accepted")
	}
}

// A payment intent declined off-session and completed later on-session by
// its customer succeeds, counts once in the ledger and is an event; its
// key still replays the decline, and a paid one cannot be confirmed again.
func TestConfirmIntentAfterDecline(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Declines: map[string]string{"cus_3ds": "authentication_required"}})
	api := newAPI(t, srv, testKey, nil)
	params := func() *stripe.PaymentIntentParams {
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("eur"), Customer: stripe.String("cus_3ds"),
			PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
		p.AddMetadata("billonce_period", "2026-09")
		p.SetIdempotencyKey("pi-key-1")
		return p
	}
	_, err := api.PaymentIntents.New(params())
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 402 || se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("off-session confirmation: %+v; want a 402 with the payment intent requiring a payment method", se)
	}
	id := se.PaymentIntent.ID
	if err := srv.ConfirmIntent(id); err != nil {
		t.Fatal(err)
	}
	if srv.CountPeriod("cus_3ds", "2026-09") != 1 {
		t.Fatalf("ledger counts %d payments after the confirmation; want 1", srv.CountPeriod("cus_3ds", "2026-09"))
	}
	if got, err := api.PaymentIntents.Get(id, nil); err != nil || got.Status != stripe.PaymentIntentStatusSucceeded || got.LastPaymentError != nil {
		t.Fatalf("after the confirmation: %+v, %v; want succeeded without an error", got, err)
	}
	if _, err := api.PaymentIntents.New(params()); stripeErr(t, err).HTTPStatusCode != 402 {
		t.Fatal("the key no longer replays its stored decline")
	}
	if err := srv.ConfirmIntent(id); err == nil {
		t.Error("a succeeded payment intent was confirmed again")
	}
	if err := srv.ConfirmIntent("ch_none"); err == nil {
		t.Error("an unknown id was confirmed")
	}
	var types []string
	for _, e := range srv.Events() {
		types = append(types, e.Type)
	}
	if got, want := stringsOf(types), "[payment_intent.payment_failed payment_intent.succeeded]"; got != want {
		t.Fatalf("events = %s, want %s", got, want)
	}
}
