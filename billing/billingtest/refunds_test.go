package billingtest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing/billingtest"
)

func refundParams(charge string, amount int64, key string) *stripe.RefundParams {
	p := &stripe.RefundParams{Charge: stripe.String(charge)}
	if amount > 0 {
		p.Amount = stripe.Int64(amount)
	}
	p.AddMetadata("billonce_period", "2026-09")
	p.SetIdempotencyKey(key)
	return p
}

// A payment takes partial refunds, two of the same amount included, until
// its refunded total reaches its amount; then a refund is refused, and so
// is one over what is left. Each key's refund is made once.
func TestPartialRefundsUpToThePayment(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for i, step := range []struct {
		amount int64
		key    string
	}{{1000, "r1"}, {1000, "r2"}, {1000, "r1"}} {
		r, err := api.Refunds.New(refundParams(ch.ID, step.amount, step.key))
		if err != nil || r.Status != stripe.RefundStatusSucceeded || r.Amount != step.amount || r.Charge.ID != ch.ID {
			t.Fatalf("refund %d = %+v, %v; want %d succeeded", i, r, err, step.amount)
		}
		ids = append(ids, r.ID)
	}
	if ids[0] == ids[1] || ids[2] != ids[0] {
		t.Fatalf("refund ids %v; want two refunds of the same amount, the first key's replayed", ids)
	}
	_, err = api.Refunds.New(refundParams(ch.ID, 2201, "r3"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest || se.Code != stripe.ErrorCodeAmountTooLarge {
		t.Fatalf("refund over what is left: %+v; want 400 amount_too_large", se)
	}
	last, err := api.Refunds.New(refundParams(ch.ID, 0, "r3")) // the same key, now for what is left
	if err != nil || last.Amount != 2200 {
		t.Fatalf("refund of what is left = %+v, %v; want 2200", last, err)
	}
	_, err = api.Refunds.New(refundParams(ch.ID, 0, "r4"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Code != stripe.ErrorCodeChargeAlreadyRefunded {
		t.Fatalf("refund of a refunded charge: %+v; want 400 charge_already_refunded", se)
	}
	got, err := api.Charges.Get(ch.ID, nil)
	if err != nil || got.AmountRefunded != 4200 || !got.Refunded {
		t.Fatalf("charge = %+v, %v; want 4200 refunded", got, err)
	}
	list := api.Refunds.List(&stripe.RefundListParams{Charge: stripe.String(ch.ID)})
	var listed []string
	for list.Next() {
		listed = append(listed, list.Refund().ID)
	}
	if err := list.Err(); err != nil || len(listed) != 3 || listed[0] != last.ID || listed[2] != ids[0] {
		t.Fatalf("listed %v, %v; want the 3 refunds, newest first", listed, err)
	}
	if r, err := api.Refunds.Get(ids[1], nil); err != nil || r.Amount != 1000 || r.Metadata["billonce_period"] != "2026-09" {
		t.Fatalf("GET refund = %+v, %v", r, err)
	}
	var total int64
	for _, m := range srv.Movements("refund") {
		if m.Of != ch.ID || m.Customer != "cus_1" || m.Period != "2026-09" {
			t.Errorf("movement %+v; want a refund of %s for cus_1 in 2026-09", m, ch.ID)
		}
		total += m.Amount
	}
	if n := len(srv.Movements("refund")); n != 3 || total != 4200 {
		t.Fatalf("ledger: %d refunds, %d refunded; want 3 and 4200", n, total)
	}
	if srv.Count("cus_1") != 1 {
		t.Fatal("a refunded payment left the ledger; it was made")
	}
}

// A payment intent is refunded as a charge is, by payment_intent; its
// refunds list by payment_intent, and a refund names it.
func TestRefundAPaymentIntent(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	pi, err := api.PaymentIntents.New(withKey(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"),
		Customer: stripe.String("cus_1"), PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true)}, "pi"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := api.Refunds.New(withKey(&stripe.RefundParams{PaymentIntent: stripe.String(pi.ID), Amount: stripe.Int64(400),
		Reason: stripe.String("requested_by_customer")}, "r1"))
	if err != nil || r.PaymentIntent == nil || r.PaymentIntent.ID != pi.ID || r.Charge != nil || r.Reason != "requested_by_customer" {
		t.Fatalf("refund = %+v, %v", r, err)
	}
	list := api.Refunds.List(&stripe.RefundListParams{PaymentIntent: stripe.String(pi.ID)})
	n := 0
	for list.Next() {
		n++
	}
	if list.Err() != nil || n != 1 {
		t.Fatalf("listed %d, %v; want 1", n, list.Err())
	}
	for _, bad := range []url.Values{
		{"amount": {"100"}},
		{"charge": {"ch_1"}, "payment_intent": {pi.ID}},
		{"payment_intent": {pi.ID}, "reason": {"because"}},
		{"payment_intent": {pi.ID}, "amount": {"0"}},
		{"payment_intent": {pi.ID}, "customer": {"cus_1"}},
	} {
		resp, body := do(t, srv, http.MethodPost, "/v1/refunds", "bad-"+bad.Encode(), bad)
		if e := errorOf(body); resp.StatusCode != 400 || e.Type != "invalid_request_error" || e.Param == "" {
			t.Errorf("refund %v: %d %s; want 400 naming the parameter", bad, resp.StatusCode, body)
		}
	}
	if n := len(srv.Movements("refund")); n != 1 {
		t.Fatalf("ledger: %d refunds; want 1", n)
	}
}

// A refund of a customer who settles later is pending; it succeeds or
// fails when its time comes, or when a test settles it, and a failed or
// canceled refund gives its amount back to the payment. Each change is a
// charge.refund.updated event, as Stripe sends for API 2024-06-20.
func TestPendingRefundsSettleLater(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	srv.SettleLater("cus_1", billingtest.Async{After: time.Hour})
	r1, err := api.Refunds.New(refundParams(ch.ID, 1000, "r1"))
	if err != nil || r1.Status != stripe.RefundStatusPending {
		t.Fatalf("refund = %+v, %v; want pending", r1, err)
	}
	srv.SettleLater("cus_1", billingtest.Async{After: time.Hour, FailureCode: "expired_or_canceled_card"})
	r2, err := api.Refunds.New(refundParams(ch.ID, 1000, "r2"))
	if err != nil {
		t.Fatal(err)
	}
	r3, err := api.Refunds.New(refundParams(ch.ID, 1000, "r3"))
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := api.Charges.Get(ch.ID, nil); got.AmountRefunded != 3000 {
		t.Fatalf("amount refunded with three pending refunds = %d; want 3000", got.AmountRefunded)
	}
	if err := srv.Settle(r3.ID, "canceled", ""); err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(r3.ID, "succeeded", ""); err == nil {
		t.Fatal("a canceled refund settled again")
	}
	srv.Advance(time.Hour)
	want := map[string]stripe.RefundStatus{r1.ID: "succeeded", r2.ID: "failed", r3.ID: "canceled"}
	for id, st := range want {
		r, err := api.Refunds.Get(id, nil)
		if err != nil || r.Status != st {
			t.Errorf("refund %s = %+v, %v; want %s", id, r, err, st)
		}
		if st == "failed" && r.FailureReason != "expired_or_canceled_card" {
			t.Errorf("failed refund's reason = %q", r.FailureReason)
		}
	}
	if got, _ := api.Charges.Get(ch.ID, nil); got.AmountRefunded != 1000 || got.Refunded {
		t.Fatalf("charge after settlement: %d refunded, refunded=%v; want 1000 and false", got.AmountRefunded, got.Refunded)
	}
	// What failed can be refunded again.
	if _, err := api.Refunds.New(refundParams(ch.ID, 3200, "r4")); err != nil {
		t.Fatalf("refund of what failed: %v", err)
	}
	var types []string
	for _, e := range srv.Events() {
		if e.Type == "charge.refunded" || e.Type == "charge.refund.updated" {
			types = append(types, e.Type)
			var ev struct {
				Data struct {
					Object struct{ Object, Status string }
				}
			}
			json.Unmarshal(e.Body, &ev)
			if e.Type == "charge.refund.updated" && ev.Data.Object.Object != "refund" {
				t.Errorf("charge.refund.updated carries a %s; want the refund", ev.Data.Object.Object)
			}
		}
	}
	wantTypes := "[charge.refunded charge.refunded charge.refunded charge.refund.updated charge.refund.updated charge.refund.updated charge.refunded]"
	if got := stringsOf(types); got != wantTypes {
		t.Fatalf("events %s; want %s", got, wantTypes)
	}
}

// A refund names a payment of its own account: another account's charge
// is missing there, to refund or to list by.
func TestRefundOfAnotherAccountsPaymentIsMissing(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	acct := srv.CreateAccount()
	resp, body := doAs(t, srv, acct, http.MethodPost, "/v1/charges", "c", url.Values{"amount": {"500"}, "currency": {"usd"}, "customer": {"cus_a"}})
	if resp.StatusCode != 200 {
		t.Fatalf("charge: %d %s", resp.StatusCode, body)
	}
	ch := idOf(body)
	resp, body = do(t, srv, http.MethodPost, "/v1/refunds", "r", url.Values{"charge": {ch}})
	if e := errorOf(body); resp.StatusCode != 404 || e.Code != "resource_missing" || e.Param != "charge" {
		t.Fatalf("refund on the platform: %d %s; want 404 resource_missing", resp.StatusCode, body)
	}
	if resp, body := do(t, srv, http.MethodGet, "/v1/refunds", "", url.Values{"charge": {ch}}); resp.StatusCode != 404 {
		t.Fatalf("list on the platform: %d %s; want 404", resp.StatusCode, body)
	}
	resp, body = doAs(t, srv, acct, http.MethodPost, "/v1/refunds", "r", url.Values{"charge": {ch}})
	if resp.StatusCode != 200 {
		t.Fatalf("refund on its account: %d %s", resp.StatusCode, body)
	}
	rid := idOf(body)
	if resp, _ := do(t, srv, http.MethodGet, "/v1/refunds/"+rid, "", nil); resp.StatusCode != 404 {
		t.Fatalf("GET refund on the platform: %d; want 404", resp.StatusCode)
	}
	ms := srv.Movements("refund")
	if len(ms) != 1 || ms[0].Account != acct {
		t.Fatalf("refunds = %+v; want one on %s", ms, acct)
	}
	var refunded []string
	for _, e := range srv.Events() {
		if e.Type == "charge.refunded" {
			refunded = append(refunded, e.Account)
		}
	}
	if len(refunded) != 1 || refunded[0] != acct {
		t.Fatalf("charge.refunded events on %v; want one on %s", refunded, acct)
	}
}

// Server.Refund, a refund made in the Dashboard, is a refund like any
// other: listed, counted, and limited to what is left.
func TestDashboardRefundIsARefund(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Refund(ch.ID, 4000); err != nil {
		t.Fatal(err)
	}
	if err := srv.Refund(ch.ID, 201); err == nil {
		t.Fatal("a refund over what is left was made")
	}
	if _, err := api.Refunds.New(refundParams(ch.ID, 201, "r1")); err == nil {
		t.Fatal("an API refund over what is left was made")
	}
	if err := srv.Refund(ch.ID, 0); err != nil {
		t.Fatal(err)
	}
	ms := srv.Movements("refund")
	if len(ms) != 2 || ms[0].Amount != 4000 || ms[1].Amount != 200 || ms[0].IdempotencyKey != "" {
		t.Fatalf("refunds = %+v; want 4000 then 200, with no key", ms)
	}
}

// A refund reported succeeded can fail later, as Stripe's can: its amount
// is refundable again.
func TestSucceededRefundCanFailLater(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	r, err := api.Refunds.New(refundParams(ch.ID, 2000, "r1"))
	if err != nil || r.Status != "succeeded" {
		t.Fatalf("refund = %+v, %v", r, err)
	}
	if err := srv.Settle(r.ID, "failed", "lost_or_stolen_card"); err != nil {
		t.Fatal(err)
	}
	if got, _ := api.Refunds.Get(r.ID, nil); got.Status != "failed" || got.FailureReason != "lost_or_stolen_card" {
		t.Fatalf("refund after failing = %+v", got)
	}
	if got, _ := api.Charges.Get(ch.ID, nil); got.AmountRefunded != 0 {
		t.Fatalf("amount refunded after the refund failed = %d; want 0", got.AmountRefunded)
	}
	if err := srv.Settle(r.ID, "succeeded", ""); err == nil {
		t.Fatal("a failed refund settled again")
	}
}

// A disputed payment is refunded neither by the API nor in the Dashboard.
func TestDisputedPaymentIsNotRefunded(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Dispute(ch.ID, "fraudulent"); err != nil {
		t.Fatal(err)
	}
	_, err = api.Refunds.New(refundParams(ch.ID, 1000, "r1"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Code != stripe.ErrorCodeChargeDisputed {
		t.Fatalf("refund of a disputed charge: %+v; want 400 charge_disputed", se)
	}
	if err := srv.Refund(ch.ID, 1000); err == nil {
		t.Fatal("a disputed charge was refunded in the Dashboard")
	}
	if n := len(srv.Movements("refund")); n != 0 {
		t.Fatalf("%d refunds of a disputed charge", n)
	}
}
