package billing_test

// Attacks on payments that settle later, webhooks, the batching recorder
// and re-bills. The oracle is the fake Stripe's ledger.

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// chargeEvent builds a signable event about a charge, as Stripe would send it.
func chargeEvent(t *testing.T, id, typ, chargeID, status, key, customer string, created time.Time) billingtest.Event {
	t.Helper()
	obj := map[string]any{"id": chargeID, "object": "charge", "amount": amount, "amount_refunded": 0, "status": status,
		"currency": "usd", "customer": customer, "created": created.Unix(), "failure_code": "insufficient_funds",
		"metadata": map[string]string{billing.MetaKey: key, billing.MetaCustomer: customer, billing.MetaPeriod: period}}
	body, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": billingtest.APIVersion,
		"created": created.Unix(), "type": typ, "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": obj}})
	if err != nil {
		t.Fatal(err)
	}
	return billingtest.Event{ID: id, Type: typ, ObjectID: chargeID, Created: created, Body: body}
}

func (h *hookEnv) deliverAll() {
	h.tb.Helper()
	for _, ev := range h.srv.Events() {
		h.deliver(ev)
	}
}

// A charge.failed delivered after charge.succeeded for the same payment
// (out of order, or a forged-but-signed replay) must not reopen the period.
func TestAttack3FailedAfterSucceeded(t *testing.T) {
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	r, err := h.b.Charge(ctx, "cus_a", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.deliverAll()
	h.deliver(chargeEvent(t, "evt_attack3_failed", "charge.failed", r.StripeID, "failed", h.key("cus_a"), "cus_a", time.Now().Add(time.Minute)))
	if c := h.claimOf("cus_a"); c.State != claim.StateSucceeded {
		t.Fatalf("claim is %s after a late charge.failed", c.State)
	}
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_a"), nil); err != nil {
		t.Fatal(err)
	}
	r2, err2 := h.b.Rebill(ctx, "cus_a", period, 2, nil)
	if n := h.count("cus_a"); n != 1 {
		t.Fatalf("cus_a charged %d times; Rebill = %+v, %v", n, r2, err2)
	}
}

// A full refund, its events delivered, then Charge, Run and Reconcile
// again: a refund is never a reason to bill again.
func TestAttack3RefundThenRunAgain(t *testing.T) {
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			h := newHookEnv(t, api, nil)
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_r", period, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.srv.Refund(r.StripeID, amount); err != nil {
				t.Fatal(err)
			}
			h.deliverAll()
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_r"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Charge(ctx, "cus_r", period, nil); err != nil {
				t.Fatal(err)
			}
			if n := len(h.srv.Payments()); n != 1 {
				t.Fatalf("%d payments at Stripe after a refund and runs, want 1", n)
			}
		})
	}
}

// Attempt 1 is processing; a dunning process calls Rebill(2) at once and
// again after the payment settles. Nothing but attempt 1 may be charged.
func TestAttack3RebillWhileProcessing(t *testing.T) {
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			h := newHookEnv(t, api, map[string]billingtest.Async{"cus_p": {After: time.Hour}})
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_p", period, nil)
			if err != nil || !r.Processing {
				t.Fatalf("Charge = %+v, %v; want processing", r, err)
			}
			r2, err2 := h.b.Rebill(ctx, "cus_p", period, 2, nil)
			if n := len(h.srv.Payments()); n != 1 {
				t.Fatalf("%d payments after Rebill(2) while attempt 1 processes: %+v, %v", n, r2, err2)
			}
			h.srv.Advance(2 * time.Hour)
			h.deliverAll()
			r3, err3 := h.b.Rebill(ctx, "cus_p", period, 2, nil)
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_p"), nil); err != nil {
				t.Fatal(err)
			}
			if n := len(h.srv.Payments()); n != 1 || h.count("cus_p") != 1 {
				t.Fatalf("%d payments (%d counted) after settling; Rebill = %+v, %v", n, h.count("cus_p"), r3, err3)
			}
		})
	}
}

// Attempt 1 fails after processing; attempt 2 is created and succeeds; then
// attempt 1's events arrive late (redelivered, and a forged success for a
// new id). The period is billed once and stays so.
func TestAttack3LateEventsForAttempt1(t *testing.T) {
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_l": {After: time.Hour, FailureCode: "account_closed"}})
	ctx := context.Background()
	r1, err := h.b.Charge(ctx, "cus_l", period, nil)
	if err != nil || !r1.Processing {
		t.Fatalf("Charge = %+v, %v", r1, err)
	}
	h.srv.Advance(2 * time.Hour)
	events := h.srv.Events()
	for _, ev := range events {
		h.deliver(ev)
	}
	if c := h.claimOf("cus_l"); c.State != claim.StateFailed {
		t.Fatalf("attempt 1 is %s, want failed", c.State)
	}
	h.srv.SettleLater("cus_l", billingtest.Async{})
	if _, err := h.b.Rebill(ctx, "cus_l", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	h.srv.Advance(time.Minute)
	for _, ev := range h.srv.Events()[len(events):] {
		h.deliver(ev)
	}
	if c2 := h.claimOf2("cus_l", 2); c2.State != claim.StateSucceeded {
		t.Fatalf("attempt 2 is %s, want succeeded", c2.State)
	}
	// Redeliver attempt 1's events in reverse, then a success about it.
	for i := len(events) - 1; i >= 0; i-- {
		h.post(events[i].Body, billingtest.Sign(events[i].Body, whsec, time.Now()))
	}
	h.deliver(chargeEvent(t, "evt_attack3_late", "charge.succeeded", r1.StripeID, "succeeded", h.key("cus_l"), "cus_l", time.Now()))
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_l"), nil); err != nil {
		t.Fatal(err)
	}
	_, err3 := h.b.Rebill(ctx, "cus_l", period, 3, nil)
	if n := h.count("cus_l"); n != 1 {
		t.Fatalf("cus_l charged %d times; Rebill(3) = %v", n, err3)
	}
}

func (h *hookEnv) claimOf2(customer string, attempt int) claim.Claim {
	h.tb.Helper()
	k, err := h.b.Key(customer, period, attempt)
	if err != nil {
		h.tb.Fatal(err)
	}
	c, err := h.store.Get(context.Background(), k.String())
	if err != nil {
		h.tb.Fatal(err)
	}
	return c
}

// A Run dies between Stripe's answer (a bank debit, pending) and its
// write; the payment settles, its webhook events arrive while the claim is
// still pending, 25 hours pass on both clocks, and runs come back.
func TestAttack3CrashAfterAnswerWebhookThen25h(t *testing.T) {
	for _, fail := range []string{"", "insufficient_funds"} {
		t.Run("failure="+fail, func(t *testing.T) {
			h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_c": {After: time.Hour, FailureCode: fail}})
			ctx := context.Background()
			key := h.crashedClaim("cus_c", amount)
			h.chargeDirect("cus_c", key, amount)
			h.srv.Advance(25 * time.Hour)
			// Concurrent deliveries of every event, twice each.
			evs := h.srv.Events()
			done := make(chan struct{})
			for i := 0; i < 2; i++ {
				for _, ev := range evs {
					go func() {
						defer func() { done <- struct{}{} }()
						h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
					}()
				}
			}
			for i := 0; i < 2*len(evs); i++ {
				<-done
			}
			h.ageClaim(key, 25*time.Hour)
			sum, err := h.b.Run(ctx, period, billing.Customers("cus_c"), nil)
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			want := 1
			if fail != "" {
				want = 0
			}
			if n, p := h.count("cus_c"), len(h.srv.Payments()); n != want || p != 1 {
				t.Fatalf("cus_c: %d payments, %d counted, want 1 and %d; Run = %+v, %v; claim %+v", p, n, want, sum, err, h.claimOf("cus_c"))
			}
		})
	}
}

// A Run's first send of a claim it has just won trusts the claim's own
// lease instead of asking the store again. Here the database clock jumps
// forward (by more than the lease and a day, as a restored or re-synced
// database server's would) between the claim and that send: the lease
// ends early on the database's clock and another replica, on the other
// API, takes the claim over. Stripe refuses the key on the other endpoint,
// so the customer is charged once.
func TestAttack3FirstSendSafeDBClockJump(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*billing.Config)
	}{
		// A replica with a rotated secret key is not in this table: it
		// searches, finds nothing (the Run has not sent yet) and, with the
		// claim 25 hours old on the database clock, sends under its own
		// key, while the Run's first send goes out under the old one. A
		// database clock that jumps forward by a day breaks the deadline
		// whatever the shortcut (a request in flight at the jump meets the
		// same replica); billonce assumes the database clock does not jump
		// (see the package documentation, "Clocks").
		{"payment intents", func(c *billing.Config) { c.API = billing.PaymentIntents }},
	} {
		t.Run(tc.name, func(t *testing.T) { firstSendSafeDBClockJump(t, tc.change) })
	}
}

func firstSendSafeDBClockJump(t *testing.T, change func(*billing.Config)) {
	e := newEnv(t)
	ctx := context.Background()
	rotated := e.biller(change)
	var once bool
	var bErr error
	a := e.biller(func(c *billing.Config) {
		c.Observe = func(ev billing.Event) {
			if ev.Kind != billing.EventStripeCall || ev.Customer != "cus_1" || once {
				return
			}
			once = true
			// The database's clock jumps 25 hours: cus_2's lease and
			// window are over as the database sees them.
			e.exec(`UPDATE billonce_claims SET lease_until = now() - interval '1 second',
				first_sent_at = first_sent_at - interval '25 hours', created_at = created_at - interval '25 hours'
				WHERE key = $1`, e.key("cus_2"))
			_, bErr = rotated.Charge(ctx, "cus_2", period, nil)
		}
	})
	sum, err := a.Run(ctx, period, billing.Customers("cus_1", "cus_2"), &billing.RunOptions{Concurrency: 1, BatchSize: 2})
	if !once {
		t.Fatal("setup: the intrusion never ran")
	}
	if n := e.count("cus_2"); n != 1 {
		t.Fatalf("cus_2 charged %d times; the rotated replica's Charge = %v; Run = %+v, %v", n, bErr, sum, err)
	}
}

// Every event of one payment (processing, settled, a partial refund, a
// dispute) delivered to several replicas at once, three times each and in
// both orders: the claim ends succeeded with the refund and the dispute,
// and later runs bill nothing.
func TestAttack3ConcurrentEventsOneObject(t *testing.T) {
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			h := newHookEnv(t, api, map[string]billingtest.Async{"cus_e": {After: time.Hour}})
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_e", period, nil)
			if err != nil || !r.Processing {
				t.Fatalf("Charge = %+v, %v", r, err)
			}
			h.srv.Advance(2 * time.Hour)
			if err := h.srv.Refund(r.StripeID, 1000); err != nil {
				t.Fatal(err)
			}
			if _, err := h.srv.Dispute(r.StripeID, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			evs := h.srv.Events()
			done := make(chan int)
			n := 0
			for round := 0; round < 3; round++ {
				for i := range evs {
					ev := evs[i]
					if round == 1 {
						ev = evs[len(evs)-1-i]
					}
					n++
					go func() {
						status, _ := h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
						done <- status
					}()
				}
			}
			for i := 0; i < n; i++ {
				if s := <-done; s != 200 {
					t.Errorf("a delivery was answered %d", s)
				}
			}
			c := h.claimOf("cus_e")
			if c.State != claim.StateSucceeded || c.Refunded != 1000 || c.Dispute == "" {
				t.Fatalf("claim after the events: state %s, refunded %d, dispute %q", c.State, c.Refunded, c.Dispute)
			}
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_e"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if p := len(h.srv.Payments()); p != 1 || h.count("cus_e") != 1 {
				t.Fatalf("%d payments, %d counted; want 1", p, h.count("cus_e"))
			}
			if rows := h.eventRows(); rows != len(evs) {
				t.Fatalf("%d event rows for %d events", rows, len(evs))
			}
		})
	}
}

// The webhook secret and the Stripe key appear in no error, answer or log
// line, whatever is wrong: a secret with white space, a delivery signed
// with another secret, a dispute whose payment cannot be read.
func TestAttack3WebhookSecretsNeverShown(t *testing.T) {
	h := newHookEnv(t, billing.Charges, nil)
	bad := "whsec_" + "leakme0123456789 x"
	_, err := h.b.Webhook(billing.WebhookConfig{Secret: bad, Tolerance: -1})
	if err == nil || strings.Contains(err.Error(), "leakme") {
		t.Fatalf("Webhook with a bad secret: %v", err)
	}
	r, err := h.b.Charge(context.Background(), "cus_s", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := chargeEvent(t, "evt_attack3_secret", "charge.succeeded", r.StripeID, "succeeded", h.key("cus_s"), "cus_s", time.Now())
	_, body1 := h.post(ev.Body, billingtest.Sign(ev.Body, "whsec_other0123456789", time.Now()))
	// A dispute about a payment the fake does not know: reading it fails.
	disp := []byte(`{"id":"evt_attack3_disp","object":"event","api_version":"` + billingtest.APIVersion + `","created":1,"type":"charge.dispute.created","data":{"object":{"id":"dp_x","object":"dispute","charge":"ch_nosuch","reason":"fraudulent"}}}`)
	_, body2 := h.post(disp, billingtest.Sign(disp, whsec, time.Now()))
	// An event the claim table cannot take: acknowledged, logged and
	// observed as not applied.
	long := chargeEvent(t, "evt_attack3_long", "charge.succeeded", "ch_long", "succeeded", strings.Repeat("k", 300), "cus_s", time.Now())
	_, body3 := h.post(long.Body, billingtest.Sign(long.Body, whsec, time.Now()))
	var observed []string
	for _, e := range h.observed() {
		observed = append(observed, fmt.Sprintf("%v %+v", e.Err, e))
	}
	for _, s := range append([]string{body1, body2, body3, h.logs.String()}, observed...) {
		for _, secret := range []string{whsec, secretKey, "whsec_other", secretKey[len(secretKey)-8:]} {
			if strings.Contains(s, secret) {
				t.Fatalf("%q shows a secret: %s", secret, s)
			}
		}
	}
	if len(observed) != 2 {
		t.Errorf("observed %d events, want the two not applied", len(observed))
	}
	t.Logf("answers: %q, %q, %q", body1, body2, body3)
}
