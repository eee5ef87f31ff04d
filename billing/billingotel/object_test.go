package billingotel_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// The outcome of each kind of write is counted under its object (a charge,
// an invoice, a usage report, a refund, a transfer, a payout), its Stripe
// calls are timed under it, its span carries it; and when a webhook
// settles a refund later, the update is the refund's, and the refunded
// payment's update the charge's.
func TestWritesAreToldApartByObject(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel := newTelemetry(t)
	b, srv := newBiller(t, tel)
	srv.CreateMeter("api_calls", "sum", "")
	acct := srv.CreateAccount()
	srv.SetBalance("", "usd", 100_000)
	srv.SetBalance(acct, "usd", 100_000)
	usd := billing.Price{Amount: 5000, Currency: "usd"}
	hour := time.Now().Truncate(time.Hour).Add(-time.Hour)

	pay, err := b.Charge(ctx, "cus_c", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	for what, write := range map[string]func() (billing.Receipt, error){
		"invoice": func() (billing.Receipt, error) {
			return b.Invoice(ctx, "cus_i", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Description: "Plan", Amount: 1000}}})
		},
		"usage report": func() (billing.Receipt, error) {
			return b.ReportUsage(ctx, billing.Usage{Customer: "cus_u", Meter: "api_calls", Kind: billing.Increments, Start: hour, End: hour.Add(time.Hour), Value: 42})
		},
		"transfer": func() (billing.Receipt, error) { return b.Transfer(ctx, acct, period, usd, nil) },
		"payout":   func() (billing.Receipt, error) { return b.Payout(ctx, acct, period, usd, nil) },
	} {
		if _, err := write(); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	srv.SettleLater("cus_c", billingtest.Async{After: time.Hour})
	refund, err := b.Refund(ctx, "cus_c", period, "rma-1", 1000)
	if err != nil || !refund.Processing {
		t.Fatalf("refund %+v, %v; want it processing", refund, err)
	}
	// One of each at Stripe.
	for _, object := range []string{"refund", "transfer", "payout"} {
		if n := len(srv.Movements(object)); n != 1 {
			t.Fatalf("Stripe holds %d %ss; want 1", n, object)
		}
	}
	if n := srv.CountPeriod("cus_c", period); n != 1 {
		t.Fatalf("Stripe holds %d charges of cus_c; want 1", n)
	}

	// Stripe settles the refund; its events are delivered.
	srv.Advance(2 * time.Hour)
	srv.SettleNow()
	handler, err := b.Webhook(billing.WebhookConfig{Secret: whsec})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range srv.Events() {
		if ev.ObjectID != refund.StripeID && ev.ObjectID != pay.StripeID {
			continue
		}
		req := httptest.NewRequest(http.MethodPost, "/webhook", bytes.NewReader(ev.Body))
		req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, whsec, time.Now()))
		w := httptest.NewRecorder()
		handler.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			t.Fatalf("delivering %s %s: %d %s", ev.ID, ev.Type, w.Code, w.Body)
		}
	}

	m := tel.metrics(t)
	api := "billonce.api=charges,billonce.object="
	equal(t, "billonce.writes", sums(t, m["billonce.writes"]), map[string]int64{
		api + "charge,billonce.outcome=created":      1,
		api + "invoice,billonce.outcome=created":     1,
		api + "meter_event,billonce.outcome=created": 1,
		api + "transfer,billonce.outcome=created":    1,
		api + "payout,billonce.outcome=created":      1,
		api + "refund,billonce.outcome=created":      1,
	})
	calls := counts(t, m["billonce.stripe.call.duration"])
	for _, object := range []string{"charge", "invoice", "meter_event", "transfer", "payout", "refund"} {
		if calls[api+object] == 0 {
			t.Errorf("no Stripe call timed under %s: %v", object, calls)
		}
	}
	updates := sums(t, m["billonce.payment.updates"])
	if updates["billonce.object=refund,billonce.state=succeeded,billonce.update=settled"] != 1 {
		t.Errorf("payment updates %v; want the refund settled, as a refund", updates)
	}
	if updates["billonce.object=charge,billonce.update=refunded"] != 1 {
		t.Errorf("payment updates %v; want the charge refunded, as a charge", updates)
	}
	for l := range updates {
		if !strings.Contains(l, "billonce.object=") {
			t.Errorf("payment update %s names no object", l)
		}
	}
	spans := map[string]int{}
	for _, sp := range tel.spans.Ended() {
		for _, kv := range sp.Attributes() {
			if kv.Key == "billonce.object" && hasAttr(sp.Attributes(), "billonce.outcome", "created") {
				spans[kv.Value.AsString()]++
			}
		}
	}
	equal(t, "spans by object", spans, map[string]int{"charge": 1, "invoice": 1, "meter_event": 1, "transfer": 1, "payout": 1, "refund": 1})
}

// An invoice is one span, whose events are the calls of all its steps
// (each step sends a key of its own): a Run of its period leaves no call
// behind as a span without an outcome.
func TestInvoiceSpanHoldsTheCallsOfEveryStep(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	b, srv := newBiller(t, tel)
	inv := &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Description: "Plan", Amount: 1000}, {Description: "Seats", Amount: 250}}}
	items := func(yield func(billing.Item, error) bool) { yield(billing.Item{Customer: "cus_i", Invoice: inv}, nil) }
	sum, err := b.Run(context.Background(), period, items, nil)
	if err != nil || sum.Created != 1 {
		t.Fatalf("Run: %+v, %v; want the invoice created", sum.Progress, err)
	}
	posts := 0
	for _, l := range srv.Log() {
		if l.Method == http.MethodPost {
			posts++
		}
	}
	spans := tel.spans.Ended()
	if len(spans) != 1 {
		for _, sp := range spans {
			t.Logf("span %s, status %v, %d events", sp.Name(), sp.Status(), len(sp.Events()))
		}
		t.Fatalf("%d spans; want the invoice's one", len(spans))
	}
	sp := spans[0]
	if !hasAttr(sp.Attributes(), "billonce.object", "invoice") || sp.Status().Code != 0 || len(sp.Events()) != posts || posts < 4 {
		t.Fatalf("span %s %v, status %v, %d events; want the invoice's, with no error and its %d Stripe calls", sp.Name(), sp.Attributes(), sp.Status(), len(sp.Events()), posts)
	}
}
