package billing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// One claim table serves two Stripe accounts (a scope each). A meter
// error report on one account, delivered to its Biller's webhook, names
// the identifier of a report counted on the other account (other code on
// the first account sent an event with that identifier, for a customer it
// does not have). It must not fail the counted report's claim: the
// failed claim frees its window, and an overlapping report is then
// counted too, the overlap twice.
func TestMeterErrorReportFromAnotherAccountLeavesTheCountedReport(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil) // account A, whose webhook this is
	h.srv.CreateMeter("api_calls", "sum", "")
	acctB := &env{tb: t, srv: newServer(t, billingtest.Config{}), pool: h.pool, store: h.store}
	acctB.srv.CreateMeter("api_calls", "sum", "")
	b := acctB.biller(func(c *billing.Config) { c.Scope, c.SecretKey = "account-b", "sk_test_account_b_000000000000000000" })
	ctx := context.Background()
	base := overlapBase()
	counted := window("cus_1", base, 60, 120, 7)
	r, err := b.ReportUsage(ctx, counted)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("account B's report = %+v, %v; want created", r, err)
	}
	acctB.srv.AggregateNow()
	h.srv.RejectUsage("cus_1", "meter_event_customer_not_found")
	events := meterevent.Client{B: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(h.srv.URL), HTTPClient: &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}), Key: secretKey}
	//idemvet:ignore an event sent by other code, which sends no key
	if _, err := events.New(&stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"), Identifier: stripe.String(r.Key.String()),
		Timestamp: stripe.Int64(counted.Start.Unix()), Payload: map[string]string{"stripe_customer_id": "cus_1", "value": "7"}}); err != nil {
		t.Fatal(err)
	}
	h.srv.AggregateNow()
	h.deliverAll()
	if c, err := h.store.Get(ctx, r.Key.String()); err != nil || c.State != claim.StateSucceeded {
		t.Errorf("account B's claim after account A's error report = %s (%s), %v; want succeeded", c.State, c.LastError, err)
	}
	_, err = b.ReportUsage(ctx, window("cus_1", base, 90, 150, 3))
	if !errors.Is(err, billing.ErrInvalid) {
		t.Errorf("overlapping report on account B = %v, want ErrInvalid (overlaps the counted window)", err)
	}
	if n := acctB.srv.MeterEvents("api_calls", "cus_1"); n != 1 {
		t.Errorf("account B counts %d events, %v in all, from %s where 7 was reported; want 1", n,
			acctB.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)), claimedWindow(counted))
	}
}
