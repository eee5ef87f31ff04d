package billing_test

import (
	"context"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/idemkey"
)

// A usage report of a window that ended more than a day ago, whose
// identifier other code took minutes before for another customer's event:
// the meter's summary for the report's customer shows nothing, so the
// key's window is reopened and the event sent, and Stripe refuses the
// identifier; that answer is lost. The next call cannot tell its own
// event from the other code's, and must not record the report as
// delivered: the report's customer has nothing counted. Counted at the
// fake.
func TestUsageReportResentAfterAReopeningWhoseAnswerWasLostIsNotTakenAsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	start := hourAgo().Add(-30 * time.Hour)
	u := billing.Usage{Customer: "cus_1", Meter: "api_calls", Kind: billing.Increments, Start: start, End: start.Add(time.Hour), Value: 7}
	key, err := idemkey.For(billing.DefaultScope, "usage", u.Meter, u.Customer, u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339), u.Kind.String(), strconv.Itoa(1))
	if err != nil {
		t.Fatal(err)
	}
	// Other code with the account's key sends an event with the report's
	// identifier, for another customer.
	form := url.Values{"event_name": {"api_calls"}, "identifier": {key.String()}, "payload[stripe_customer_id]": {"cus_other"}, "payload[value]": {"1"}}
	req, _ := http.NewRequest(http.MethodPost, e.srv.URL+meterEvents, strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer "+secretKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("the other code's meter event: %v %v", resp, err)
	}
	resp.Body.Close()

	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
	lost := e.biller(oneAttempt)
	_, err = lost.ReportUsage(ctx, u)
	t.Logf("the report with its answer lost: %v", err)
	r, err := e.b.ReportUsage(ctx, u)
	t.Logf("the report again: %+v, %v", r, err)
	got := e.srv.MeterTotal(u.Meter, u.Customer, u.Start, u.End)
	if err == nil && got != float64(u.Value) {
		t.Errorf("ReportUsage = %+v, delivered; the meter counts %v for cus_1, want %d or an error", r, got, u.Value)
	}
	if err != nil && !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("ReportUsage = %v; want ErrNeedsReconciliation", err)
	}
}

// The same report when nothing else took its identifier: the resend after
// the reopening was counted and its answer lost. The next call, whether
// the summary shows the event yet or not, records the report delivered
// (from the summary, or from Stripe's replay of the key's answer), and the
// event is counted once. Counted at the fake.
func TestUsageReportResentAfterAReopeningWhoseAnswerWasLostIsCountedOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	start := hourAgo().Add(-30 * time.Hour)
	u := billing.Usage{Customer: "cus_1", Meter: "api_calls", Kind: billing.Increments, Start: start, End: start.Add(time.Hour), Value: 7}
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err := e.biller(oneAttempt).ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("the report with its answer lost = %v; want ErrOutcomeUnknown", err)
	}
	r, err := e.b.ReportUsage(ctx, u)
	if err != nil || (r.Outcome != billing.Reconciled && r.Outcome != billing.Replayed) {
		t.Errorf("the report again = %+v, %v; want it recorded delivered", r, err)
	}
	requireCounted(t, e.srv, u)
}
