package billingotel_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

const whsec = "whsec_billonceOtelTestSecret"

// newBiller is a Biller on a fake Stripe and a fresh claim table that
// reports to tel.
func newBiller(t *testing.T, tel *telemetry) (*billing.Biller, *billingtest.Server) {
	t.Helper()
	srv := billingtest.Start(t, billingtest.Config{})
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{
		SecretKey: secretKey,
		StripeURL: srv.URL,
		Claims:    store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 1500, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
		RateLimit:  -1,
		HTTPClient: &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()},
		Retry:      retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2, AttemptTimeout: 5 * time.Second},
		Observe:    tel.obs.Observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	return b, srv
}

// Every delivery to the webhook handler is counted by its result: applied,
// duplicate, ignored, not applied, rejected (a GET, a bad signature) and
// retry (a 503 while Stripe cannot be read).
func TestWebhookResults(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel := newTelemetry(t)
	b, srv := newBiller(t, tel)
	handler, err := b.Webhook(billing.WebhookConfig{Secret: whsec})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(handler)
	t.Cleanup(hs.Close)
	post := func(method string, body []byte, sig string) int {
		t.Helper()
		req, _ := http.NewRequest(method, hs.URL, bytes.NewReader(body))
		if sig != "" {
			req.Header.Set("Stripe-Signature", sig)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	signed := func(body []byte) int { return post(http.MethodPost, body, billingtest.Sign(body, whsec, time.Now())) }

	r, err := b.Charge(ctx, "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Dispute(r.StripeID, "fraudulent"); err != nil {
		t.Fatal(err)
	}
	var dispute billingtest.Event
	for _, ev := range srv.Events() {
		if ev.ObjectID == r.StripeID && ev.Type == "charge.dispute.created" {
			dispute = ev
		}
	}
	if dispute.Body == nil {
		t.Fatalf("no dispute event in %+v", srv.Events())
	}
	srv.FailNext(billingtest.Match{Method: http.MethodGet}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	want := []struct {
		status int
		code   func() int
	}{
		{503, func() int { return signed(dispute.Body) }},                                           // retry
		{200, func() int { return signed(dispute.Body) }},                                           // applied
		{200, func() int { return signed(dispute.Body) }},                                           // duplicate
		{200, func() int { return signed(event("evt_cus", "customer.created", `{"id":"cus_1"}`)) }}, // ignored
		{200, func() int { return signed(event("evt_null", "charge.succeeded", `null`)) }},          // not applied
		{405, func() int { return post(http.MethodGet, nil, "") }},                                  // rejected
		{400, func() int { return post(http.MethodPost, dispute.Body, "t=1,v1=00") }},               // rejected
	}
	for i, w := range want {
		if got := w.code(); got != w.status {
			t.Fatalf("delivery %d answered %d; want %d", i, got, w.status)
		}
	}
	m := tel.metrics(t)
	equal(t, "billonce.webhook.events", sums(t, m["billonce.webhook.events"]), map[string]int64{
		"billonce.result=retry": 1, "billonce.result=applied": 1, "billonce.result=duplicate": 1,
		"billonce.result=ignored": 1, "billonce.result=not_applied": 1, "billonce.result=rejected": 2,
	})
	equal(t, "billonce.payment.updates", sums(t, m["billonce.payment.updates"]), map[string]int64{"billonce.object=charge,billonce.update=disputed": 1})
}

// event is a Stripe event body of type typ about object.
func event(id, typ, object string) []byte {
	return []byte(`{"id":"` + id + `","object":"event","api_version":"` + billingtest.APIVersion +
		`","created":1,"type":"` + typ + `","data":{"object":` + object + `}}`)
}

// A Run that cannot start (a bad period) and one stopped by its context
// are counted as stopped, without waiting for anyone to report them.
func TestStoppedRuns(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	b, _ := newBiller(t, tel)
	if _, err := b.Run(context.Background(), "not a period", billing.Customers("cus_1"), nil); err == nil {
		t.Fatal("Run with a bad period returned no error")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Run(ctx, period, billing.Customers("cus_1", "cus_2"), nil); err == nil {
		t.Fatal("Run with a canceled context returned no error")
	}
	if _, err := b.Run(context.Background(), period, billing.Customers("cus_3"), nil); err != nil {
		t.Fatal(err)
	}
	m := tel.metrics(t)
	api := "billonce.api=charges"
	equal(t, "billonce.runs", sums(t, m["billonce.runs"]), map[string]int64{
		api + ",billonce.result=stopped": 2, api + ",billonce.result=complete": 1,
	})
	equal(t, "billonce.run.customers", sums(t, m["billonce.run.customers"]), map[string]int64{
		api + ",billonce.outcome=created": 1,
	})
}
