package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// paymentsOn returns the payments the fake holds for customer on account.
func paymentsOn(e *env, account, customer string) []billingtest.Payment {
	var out []billingtest.Payment
	for _, p := range e.srv.Payments() {
		if p.Account == account && p.Customer == customer && p.Paid {
			out = append(out, p)
		}
	}
	return out
}

func TestChargeOnAConnectedAccountIsMadeThereOnceAndNeverSwitched(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *billing.Config) { c.API = api })
			acct, other := e.srv.CreateAccount(), e.srv.CreateAccount()
			ctx := context.Background()
			on := &billing.ChargeOptions{Account: acct}
			e.srv.FailNext(billingtest.Match{Method: "POST", Account: acct}, billingtest.Fault{Kind: billingtest.FaultCut})
			r, err := e.b.Charge(ctx, "cus_c", period, on)
			wantHow(t, r, err, billing.Replayed)
			platformKey, _ := e.b.Key("cus_c", period, 1)
			if r.Key == platformKey {
				t.Fatal("a connected account's charge has the platform's key")
			}
			again, err := e.b.Charge(ctx, "cus_c", period, on)
			wantHow(t, again, err, billing.AlreadyBilled)
			for _, switched := range []string{"", other} {
				_, err := e.b.Charge(ctx, "cus_c", period, &billing.ChargeOptions{Account: switched})
				var m *claim.MismatchError
				var ce *billing.ChargeError
				if !errors.As(err, &m) || m.Field != "account" || !errors.As(err, &ce) || ce.Account != switched {
					t.Fatalf("charge switched to account %q: %v, want a mismatch on account", switched, err)
				}
			}
			if got := paymentsOn(e, acct, "cus_c"); len(got) != 1 || got[0].ID != r.StripeID {
				t.Fatalf("account %s holds %+v, want the one payment %s", acct, got, r.StripeID)
			}
			if n := len(e.srv.Payments()); n != 1 {
				t.Fatalf("the fake holds %d payments, want 1", n)
			}
			c, err := e.store.Get(ctx, r.Key.String())
			if err != nil || c.Account != acct {
				t.Fatalf("claim %+v, %v; want account %s", c, err, acct)
			}
		})
	}
}

// Past the key's window, Stripe's search for the charge goes to its
// account, where the charge is.
func TestChargeOnAConnectedAccountPastTheWindowIsFoundOnItsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/charges", Account: acct}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/payment_intents/search"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	_, err := b.Charge(ctx, "cus_w", period, &billing.ChargeOptions{Account: acct})
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) || ce.Account != acct || !strings.Contains(err.Error(), "on account "+acct) {
		t.Fatalf("charge with its answer lost: %v, want ErrOutcomeUnknown naming the account", err)
	}
	e.ageClaim(ce.Key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	sum, err := e.b.Reconcile(ctx, nil)
	if err != nil || sum.AlreadyBilled != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the charge found", sum, err)
	}
	if got := paymentsOn(e, acct, "cus_w"); len(got) != 1 {
		t.Fatalf("account holds %+v, want one payment", got)
	}
}

// One Run bills items of several accounts and of the platform, each on
// its own account.
func TestRunBillsItemsOfManyAccountsEachOnItsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a1, a2 := e.srv.CreateAccount(), e.srv.CreateAccount()
	items := func(yield func(billing.Item, error) bool) {
		for _, it := range []billing.Item{{Customer: "cus_1", Account: a1}, {Customer: "cus_2", Account: a2}, {Customer: "cus_3"}} {
			if !yield(it, nil) {
				return
			}
		}
	}
	for range 2 {
		sum, err := e.b.Run(context.Background(), period, items, nil)
		if err != nil || !sum.Complete() {
			t.Fatalf("Run = %+v, %v", sum, err)
		}
	}
	for _, c := range []struct{ account, customer string }{{a1, "cus_1"}, {a2, "cus_2"}, {"", "cus_3"}} {
		if got := paymentsOn(e, c.account, c.customer); len(got) != 1 {
			t.Errorf("account %q holds %d payments of %s, want 1", c.account, len(got), c.customer)
		}
	}
	if n := len(e.srv.Payments()); n != 3 {
		t.Fatalf("the fake holds %d payments, want 3", n)
	}
}

// Events are applied by their account: an event about a payment, its key
// in the metadata, that says it is on another account moves nothing.
func TestWebhookAppliesEventsByTheirAccount(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_b": {After: time.Hour}})
	acct := h.srv.CreateAccount()
	ctx := context.Background()
	r, err := h.b.Charge(ctx, "cus_b", period, &billing.ChargeOptions{Account: acct})
	wantHow(t, r, err, billing.Created)
	if !r.Processing {
		t.Fatalf("receipt %+v, want processing", r)
	}
	h.srv.Advance(2 * time.Hour)
	h.srv.SettleNow()
	var settled []billingtest.Event
	for _, ev := range h.eventsOf(r.StripeID) {
		if ev.Type == "charge.succeeded" {
			settled = append(settled, ev)
		}
	}
	if len(settled) != 1 || settled[0].Account != acct {
		t.Fatalf("events %+v, want one charge.succeeded on %s", settled, acct)
	}
	// The same event as the platform's, and as another account's.
	for _, other := range []string{"", h.srv.CreateAccount()} {
		ev := settled[0]
		ev.ID += "_as_" + other
		ev.Body = []byte(strings.Replace(strings.Replace(string(ev.Body), `"account":"`+acct+`"`, `"account":"`+other+`"`, 1), settled[0].ID, ev.ID, 1))
		if body := h.deliver(ev); body != "otherpayment" {
			t.Fatalf("event on account %q: answered %q, want otherpayment", other, body)
		}
		if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateProcessing {
			t.Fatalf("claim %s after an event of account %q, want processing", c.State, other)
		}
	}
	h.deliver(settled[0])
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
		t.Fatalf("claim %s after its own account's event, want succeeded", c.State)
	}
}

// A refund of a connected account's payment is made on that account.
func TestRefundOfAConnectedAccountsPaymentIsMadeOnItsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	r, err := e.b.Charge(ctx, "cus_r", period, &billing.ChargeOptions{Account: acct})
	wantHow(t, r, err, billing.Created)
	rf, err := e.b.Refund(ctx, "cus_r", period, "rma-1", 1000)
	wantHow(t, rf, err, billing.Created)
	got := refundsOf(e, r.StripeID)
	if len(got) != 1 || got[0].Account != acct {
		t.Fatalf("refunds %+v, want one on %s", got, acct)
	}
	again, err := e.b.Refund(ctx, "cus_r", period, "rma-1", 1000)
	wantHow(t, again, err, billing.AlreadyBilled)
}

func TestInvoiceOnAConnectedAccountIsMadeThere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	inv := &billing.Invoice{Currency: "usd", Account: acct, Lines: []billing.InvoiceLine{{Description: "Plan", Amount: 3000}}}
	r, err := e.b.Invoice(ctx, "cus_i", period, inv)
	wantHow(t, r, err, billing.Created)
	again, err := e.b.Invoice(ctx, "cus_i", period, inv)
	wantHow(t, again, err, billing.AlreadyBilled)
	var on int
	for _, i := range e.srv.Invoices("cus_i") {
		if i.Status == "paid" && i.Account == acct {
			on++
		}
	}
	if on != 1 || len(e.srv.Invoices("cus_i")) != 1 {
		t.Fatalf("invoices %+v, want one paid on %s", e.srv.Invoices("cus_i"), acct)
	}
}

func TestBadAccountIsInvalidBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, acct := range []string{"cus_x", "acct x", "acct_", strings.Repeat("a", 300)} {
		_, err := e.b.Charge(context.Background(), "cus_a", period, &billing.ChargeOptions{Account: acct})
		if !errors.Is(err, billing.ErrInvalid) {
			t.Fatalf("account %q: %v, want ErrInvalid", acct, err)
		}
	}
	if n := len(e.srv.Log()); n != 0 || e.claimRows() != 0 {
		t.Fatalf("%d requests sent, %d claims written for bad accounts", n, e.claimRows())
	}
}

// Usage on a connected account goes to that account's meter, and the
// account's meter error report (a v2 event whose context is the account)
// fails the claim; the same report as the platform's moves nothing.
func TestUsageOnAConnectedAccountIsFailedByItsAccountsErrorReport(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	acct := h.srv.CreateAccount()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(h.srv.URL),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}})
	mp := &stripe.BillingMeterParams{DisplayName: stripe.String("API calls"), EventName: stripe.String("api_calls"),
		DefaultAggregation: &stripe.BillingMeterDefaultAggregationParams{Formula: stripe.String("sum")}}
	mp.SetStripeAccount(acct)
	if _, err := (&meter.Client{B: backend, Key: secretKey}).New(mp); err != nil {
		t.Fatal(err)
	}
	h.srv.RejectUsage("cus_1", "meter_event_customer_not_found")
	ctx := context.Background()
	u := usage("cus_1", 9)
	u.Account = acct
	r, err := h.b.ReportUsage(ctx, u)
	wantHow(t, r, err, billing.Created)
	h.srv.AggregateNow()
	var reports []billingtest.Event
	for _, ev := range h.srv.Events() {
		if ev.Type == "v1.billing.meter.error_report_triggered" {
			reports = append(reports, ev)
		}
	}
	if len(reports) != 1 || reports[0].Account != acct {
		t.Fatalf("error reports %+v, want one on %s", reports, acct)
	}
	platform := reports[0]
	platform.ID += "_platform"
	platform.Body = []byte(strings.Replace(strings.Replace(string(platform.Body), `"context":"`+acct+`",`, "", 1), reports[0].ID, platform.ID, 1))
	h.deliver(platform)
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
		t.Fatalf("claim %s after the platform's report, want succeeded", c.State)
	}
	body := h.deliver(reports[0])
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateFailed {
		t.Fatalf("claim %s after its account's report (answered %q; %s), want failed", c.State, body, reports[0].Body)
	}
}
