package riverbilling

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// Every outcome of Charge, Rebill and ReportUsage, and what River is told.
func TestDecide(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	wrap := func(err error) error { return fmt.Errorf("billing: customer cus_1: %w", err) }
	tests := []struct {
		name string
		err  error
		want action
	}{
		{"charged, replayed, already recorded or reconciled", nil, action{kind: complete}},
		{"declined", &billing.ChargeError{Customer: "cus_1", Err: fmt.Errorf("%w: card_declined", billing.ErrDeclined)}, action{kind: cancel}},
		{"spend cap", wrap(spendcap.ErrSpendCapReached), action{kind: cancel, stop: true}},
		{"vault key revoked", wrap(spendcap.ErrVaultKeyRevoked), action{kind: cancel, stop: true}},
		{"endpoint not allowed", wrap(spendcap.ErrEndpointNotAllowed), action{kind: cancel, stop: true}},
		{"Stripe refused the API key", wrap(billing.ErrStripeAuth), action{kind: cancel, stop: true}},
		{"Stripe refused the request", wrap(billing.ErrStripeRequest), action{kind: cancel, stop: true}},
		{"failed after processing", &billing.ChargeError{Customer: "cus_1", Err: billing.ErrDeclined, Code: "account_closed", AfterProcessing: true}, action{kind: cancel}},
		{"in progress elsewhere", &billing.ChargeError{Err: billing.ErrInProgress, Until: now.Add(40 * time.Second)}, action{kind: snooze, snooze: 40 * time.Second}},
		{"in progress, lease just over", &billing.ChargeError{Err: billing.ErrInProgress, Until: now.Add(-time.Second)}, action{kind: snooze, snooze: minSnooze}},
		{"in progress, long lease", &billing.ChargeError{Err: billing.ErrInProgress, Until: now.Add(time.Hour)}, action{kind: snooze, snooze: maxSnooze}},
		{"key went elsewhere", &billing.ChargeError{Err: billing.ErrSentElsewhere, Until: now.Add(3 * time.Hour)}, action{kind: snooze, snooze: 3 * time.Hour}},
		{"key went elsewhere, window over", &billing.ChargeError{Err: billing.ErrSentElsewhere, Until: now}, action{kind: snooze, snooze: time.Minute}},
		{"invalid input", wrap(fmt.Errorf("%w: bad period", billing.ErrInvalid)), action{kind: cancel}},
		{"key reused with other parameters", &billing.ChargeError{Err: billing.ErrKeyReused}, action{kind: cancel}},
		{"amount changed under a claim", &billing.ChargeError{Err: fmt.Errorf("nothing sent: %w", &claim.MismatchError{})}, action{kind: cancel}},
		{"outcome unknown", &billing.ChargeError{Err: fmt.Errorf("%w: %w", billing.ErrOutcomeUnknown, errors.New("EOF"))}, action{kind: retry}},
		{"charged, not recorded", &billing.ChargeError{Err: fmt.Errorf("%w: %w", billing.ErrNotRecorded, errors.New("db down")), StripeID: "ch_1"}, action{kind: retry}},
		{"past the deadline, search down", &billing.ChargeError{Err: billing.ErrNeedsReconciliation}, action{kind: retry}},
		{"usage rejected in a meter error report", &billing.ChargeError{Customer: "cus_1", Err: billing.ErrDeclined, Code: "meter_event_customer_not_found"}, action{kind: cancel}},
		{"usage of the wrong kind for its meter", &billing.ChargeError{Err: fmt.Errorf("%w: meter api_calls has event_time_window hour", billing.ErrInvalid)}, action{kind: cancel}},
		{"usage identifier taken by an event never sent from here", &billing.ChargeError{Err: billing.ErrNeedsReconciliation}, action{kind: retry}},
		{"claim store down", errors.New("billing: claiming customer cus_1: connection refused"), action{kind: retry}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := decide(tt.err, now); got != tt.want {
				t.Errorf("decide(%v) = %+v, want %+v", tt.err, got, tt.want)
			}
		})
	}
}

// The default retry schedule of an unknown outcome, at its longest (full
// jitter, every run taking the whole job timeout), ends well before the
// key's deadline, even twice over (a job of several customers, then the
// job of one a customer is handed on to): retries within it resend the
// key while Stripe still knows it.
func TestDefaultRetryBudgetFitsKeyWindow(t *testing.T) {
	t.Parallel()
	w, err := NewWorker(&billing.Biller{}, WorkerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	var total time.Duration
	for attempt := 1; attempt < DefaultMaxAttempts; attempt++ {
		base := min(DefaultRetryInterval<<(attempt-1), DefaultMaxRetryInterval)
		for range 50 {
			if d := w.retryWait(attempt); d < base || d > base+base/10 {
				t.Fatalf("wait after run %d = %v, want %v plus up to 10%%", attempt, d, base)
			}
		}
		total += base + base/10
	}
	total += DefaultMaxAttempts * DefaultJobTimeout
	t.Logf("first run to last, at most: %v", total)
	if total > 4*time.Hour+15*time.Minute || total >= billing.DefaultWindowMargin {
		t.Errorf("the default retry budget is %v; the documented figure is about 4 h 12 min, within the %v deadline", total, billing.DefaultWindowMargin)
	}
	// A customer of a job of several: that job's runs, then those of the
	// job of its own it is handed on to.
	if 2*total >= billing.DefaultWindowMargin {
		t.Errorf("twice the default retry budget is %v, not within the %v deadline", 2*total, billing.DefaultWindowMargin)
	}
}
