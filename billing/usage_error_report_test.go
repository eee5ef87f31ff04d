package billing_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Meter error reports: Stripe's later rejection of a usage event it had
// accepted, delivered to the webhook handler.

// Stripe rejects an accepted event later, in a meter error report: the
// webhook fails its claim, and only the next attempt reports it again.
func TestMeterErrorReportFailsTheClaim(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	h.srv.CreateMeter("api_calls", "sum", "")
	h.srv.RejectUsage("cus_1", "meter_event_customer_not_found")
	ctx := context.Background()
	u := usage("cus_1", 9)
	r, err := h.b.ReportUsage(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.AggregateNow()
	h.deliverAll()
	h.deliverAll() // a redelivery changes nothing
	c, err := h.store.Get(ctx, r.Key.String())
	if err != nil || c.State != claim.StateFailed || c.FailureCode != "meter_event_customer_not_found" {
		t.Fatalf("claim after the error report = %+v, %v; want failed with the report's code", c, err)
	}
	if _, err := h.b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrDeclined) {
		t.Errorf("report after rejection = %v, want ErrDeclined", err)
	}
	h.srv.RejectUsage("cus_1", "")
	u.Attempt = 2
	if r, err := h.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
		t.Errorf("second attempt = %+v, %v; want created", r, err)
	}
	requireCounted(t, h.srv, u)
}

// A meter error report about the event sent before the report's window
// was reopened must not fail the claim of the resend, which counted:
// whether Stripe made the report before the reopening (and it is
// delivered late: Stripe retries webhooks for days) or after it (its
// validation began before). The next attempt, sent because of a failed
// claim, would count the usage twice.
func TestMeterErrorReportAboutAnEarlierSendLeavesTheResend(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		late bool // Stripe processes the first event only after the resend
	}{{"report made before the reopening", false}, {"report made after the reopening", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.Charges, nil)
			h.srv.CreateMeter("api_calls", "sum", "")
			b := h.biller(oneAttempt)
			ctx := context.Background()
			u := usage("cus_1", 9)
			h.srv.RejectUsage("cus_1", "meter_event_customer_not_found")
			h.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
			if _, err := b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
				t.Fatalf("report with a lost answer = %v, want ErrOutcomeUnknown", err)
			}
			if !tc.late {
				h.srv.AggregateNow() // Stripe rejects the event: an error report, not delivered yet
			}
			h.srv.RejectUsage("cus_1", "")
			h.advance(25 * time.Hour)
			r, err := b.ReportUsage(ctx, u)
			if err != nil || r.Outcome != billing.Created {
				t.Fatalf("report past the deadline = %+v, %v; want created (the summary is empty)", r, err)
			}
			h.srv.AggregateNow()
			requireCounted(t, h.srv, u)
			h.deliverAll() // the report about the first event arrives
			c, err := h.store.Get(ctx, r.Key.String())
			if err != nil || c.State != claim.StateSucceeded {
				t.Errorf("claim after a report about the earlier send = %+v, %v; want succeeded", c, err)
			}
			u.Attempt = 2
			_, _ = b.ReportUsage(ctx, u)
			requireCounted(t, h.srv, u)
		})
	}
}

// A meter error report fails usage claims only. A meter event whose
// identifier is a charge's key (anyone with the account's API key can send
// one, and keys are in every charge's metadata) must not fail the charge's
// pending claim: the charge went through, and the re-bill a failed claim
// invites would charge the customer twice.
func TestMeterErrorReportNamingAChargeLeavesIt(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	h.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	h.lostAnswer(h.biller(oneAttempt), "cus_1")
	key := h.key("cus_1")
	// A meter event named by the charge's key, for a customer Stripe
	// does not know: Stripe rejects it later, in an error report.
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(h.srv.URL),
		HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	h.srv.RejectUsage("cus_nobody", "meter_event_customer_not_found")
	events := meterevent.Client{B: backend, Key: secretKey}
	//idemvet:ignore an event forged by other code, which sends no key
	if _, err := events.New(&stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"), Identifier: stripe.String(key),
		Payload: map[string]string{"stripe_customer_id": "cus_nobody", "value": "1"}}); err != nil {
		t.Fatal(err)
	}
	h.srv.AggregateNow()
	for _, ev := range h.srv.Events() {
		if ev.Type == "v1.billing.meter.error_report_triggered" { // before the charge's own events
			h.deliver(ev)
		}
	}
	if c := h.claimOf("cus_1"); c.State == claim.StateFailed {
		t.Errorf("charge claim after a meter error report naming its key = %s (%s), want it left pending", c.State, c.LastError)
	}
	// The dunning process re-bills a declined period.
	if _, err := h.b.Charge(ctx, "cus_1", period, nil); errors.Is(err, billing.ErrDeclined) {
		_, _ = h.b.Rebill(ctx, "cus_1", period, 2, nil)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d charges for the period, want 1", n)
	}
}

// A meter error report about an event another writer sent with a counted
// report's identifier must not fail the report's claim: the next attempt,
// sent because of a failed claim, would count the window twice. Stripe
// takes the identifier again once it has forgotten it (a day after the
// counted event), and on another meter if it keeps identifiers per meter;
// a report can be about the claim's event only if its validation window
// covers the time the claim could send it, on the claim's meter.
func TestMeterErrorReportAboutAnotherWritersEventLeavesTheCountedReport(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after time.Duration // how long after the counted event the other one is sent
		meter string        // the other event's meter
		table bool          // sent by a second claim table of the same scope, not by other code
	}{
		{"a second claim table, a day later", 25 * time.Hour, "api_calls", true},
		{"other code with the account's key, a day later", 25 * time.Hour, "api_calls", false},
		{"other code, on another meter, within the day", 2 * time.Minute, "other_calls", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			// Identifiers are kept a minute only, so that the same
			// identifier can be taken on another meter within the day.
			h := newHookEnvWith(t, billing.Charges, billingtest.Config{IdentifierWindow: time.Minute})
			h.srv.CreateMeter("api_calls", "sum", "")
			h.srv.CreateMeter("other_calls", "sum", "")
			ctx := context.Background()
			u := usage("cus_1", 9)
			r, err := h.b.ReportUsage(ctx, u)
			if err != nil || r.Outcome != billing.Created {
				t.Fatalf("report = %+v, %v; want created", r, err)
			}
			h.srv.AggregateNow()
			requireCounted(t, h.srv, u)
			h.advance(tc.after)
			h.srv.RejectUsage("cus_1", "meter_event_customer_not_found") // the other event is rejected as Stripe aggregates it
			if tc.table {
				if r, err := h.otherTable().ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
					t.Fatalf("the second table's report = %+v, %v; want created (Stripe has forgotten the identifier)", r, err)
				}
			} else {
				events := meterevent.Client{B: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
					URL:               stripe.String(h.srv.URL),
					HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
					MaxNetworkRetries: stripe.Int64(0),
					LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
				}), Key: secretKey}
				//idemvet:ignore an event sent by other code, which sends no key
				if _, err := events.New(&stripe.BillingMeterEventParams{EventName: stripe.String(tc.meter), Identifier: stripe.String(r.Key.String()),
					Payload: map[string]string{"stripe_customer_id": "cus_1", "value": "9"}}); err != nil {
					t.Fatal(err)
				}
			}
			h.srv.AggregateNow()
			h.deliverAll()
			c, err := h.store.Get(ctx, r.Key.String())
			if err != nil || c.State != claim.StateSucceeded {
				t.Errorf("claim after a report about another writer's event = %s (%s), %v; want succeeded", c.State, c.LastError, err)
			}
			if !strings.Contains(h.logs.String(), "cannot be about this claim's usage event") {
				t.Errorf("no warning about the report in the log:\n%s", h.logs)
			}
			// Whoever reads a failed claim reports the window again.
			h.srv.RejectUsage("cus_1", "")
			if _, err := h.b.ReportUsage(ctx, u); errors.Is(err, billing.ErrDeclined) {
				u2 := u
				u2.Attempt = 2
				_, _ = h.b.ReportUsage(ctx, u2)
			}
			requireCounted(t, h.srv, u)
		})
	}
}
