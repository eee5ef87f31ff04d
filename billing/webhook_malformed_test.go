package billing_test

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// A correctly signed event of a handled type whose data, or data object,
// is missing or null can never be applied: it is acknowledged with 200 (so
// Stripe stops delivering it), reported as EventNotApplied, and changes
// nothing. It must never panic the handler.
func TestWebhookEventWithoutDataIsAcknowledgedNotApplied(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	types := []string{"charge.succeeded", "charge.failed", "charge.refunded", "charge.dispute.created",
		"payment_intent.succeeded", "payment_intent.payment_failed"}
	datas := map[string]string{"no data": ``, "null data": `,"data":null`, "null object": `,"data":{"object":null}`}
	n := 0
	for _, typ := range types {
		for what, data := range datas {
			n++
			id := fmt.Sprintf("evt_nodata_%d", n)
			body := []byte(fmt.Sprintf(`{"id":%q,"object":"event","type":%q,"created":1%s}`, id, typ, data))
			status, answer := h.post(body, billingtest.Sign(body, whsec, time.Now()))
			want := "not applied"
			if status != http.StatusOK || !strings.HasPrefix(answer, want) {
				t.Errorf("%s with %s: answered %d %q; want 200 %q", typ, what, status, answer, want)
			}
		}
	}
	if h.eventRows() != 0 || h.claimRows() != 0 {
		t.Errorf("%d event rows and %d claims after events without data", h.eventRows(), h.claimRows())
	}
	obs := h.observed()
	for _, e := range obs {
		if e.Kind != billing.EventNotApplied {
			t.Errorf("observed %+v; want only EventNotApplied", e)
		}
	}
	if want := len(datas) * len(types); len(obs) != want {
		t.Errorf("%d events observed; want %d EventNotApplied", len(obs), want)
	}
}
