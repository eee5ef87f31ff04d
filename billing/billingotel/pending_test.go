package billingotel_test

import (
	"fmt"
	"testing"
	"time"

	"go.opentelemetry.io/otel/codes"

	"github.com/billonce/billonce/billing"
)

// Calls whose outcome never comes are kept for at most 10,000 charges: the
// charge waiting longest is ended as a span without an outcome, and
// the end of a Run ends those of its period.
func TestPendingChargesAreBounded(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	call := func(customer, period string) billing.Event {
		return billing.Event{Kind: billing.EventStripeCall, Customer: customer, Period: period,
			Key: "key-" + period + "-" + customer, Attempt: 1, Duration: time.Millisecond}
	}
	tel.obs.Observe(call("cus_first", "2026-08"))
	for i := range 10_000 {
		tel.obs.Observe(call(fmt.Sprintf("cus_%d", i), "2026-09"))
	}
	ended := tel.spans.Ended()
	if len(ended) != 1 || ended[0].Status().Code != codes.Error || len(ended[0].Events()) != 1 {
		t.Fatalf("%d spans ended past the bound; want the oldest charge's, with its call and an error status", len(ended))
	}
	if got := ended[0].Attributes(); !hasAttr(got, "billonce.customer", "cus_first") {
		t.Fatalf("ended span %v; want cus_first's", got)
	}
	tel.obs.Observe(billing.Event{Kind: billing.EventRun, Period: "2026-09", Summary: &billing.Summary{Period: "2026-09"}})
	if n := len(tel.spans.Ended()); n != 10_001 {
		t.Fatalf("%d spans after the run's event; want every pending charge of the period ended (10,001)", n)
	}
	// Nothing is left: an outcome now is a span of its own, without calls.
	tel.obs.Observe(billing.Event{Kind: billing.EventOutcome, Customer: "cus_1", Period: "2026-09", Key: "key-2026-09-cus_1", Outcome: billing.Created})
	if last := tel.spans.Ended()[10_001]; len(last.Events()) != 0 || last.Status().Code == codes.Error {
		t.Fatalf("outcome after the run's event: %d events, status %v; want none and no error", len(last.Events()), last.Status())
	}
}

// Payment updates and webhook deliveries are counted by what they
// report, without customers or ids; EventNotApplied is not counted again
// besides its delivery's EventWebhook.
func TestUpdatesAndWebhookEvents(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	for _, e := range []billing.Event{
		{Kind: billing.EventSettled, Customer: "cus_1", StripeID: "ch_1", State: "succeeded"},
		{Kind: billing.EventSettled, Customer: "cus_2", StripeID: "ch_2", State: "succeeded"},
		{Kind: billing.EventRefunded, Customer: "cus_1", StripeID: "ch_1", Refunded: 100},
		{Kind: billing.EventDisputed, Customer: "cus_1", StripeID: "ch_1", Dispute: "dp_1 fraudulent"},
		{Kind: billing.EventNotApplied, EventID: "evt_1", StripeID: "ch_9"},
		{Kind: billing.EventWebhook, EventID: "evt_1", StripeID: "ch_9", Result: "not_applied"},
	} {
		tel.obs.Observe(e)
	}
	m := tel.metrics(t)
	equal(t, "billonce.payment.updates", sums(t, m["billonce.payment.updates"]), map[string]int64{
		"billonce.state=succeeded,billonce.update=settled": 2,
		"billonce.update=refunded":                         1,
		"billonce.update=disputed":                         1,
	})
	equal(t, "billonce.webhook.events", sums(t, m["billonce.webhook.events"]), map[string]int64{"billonce.result=not_applied": 1})
	if n := len(tel.spans.Ended()); n != 0 {
		t.Fatalf("%d spans for payment updates; want none", n)
	}
}
