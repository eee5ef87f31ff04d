package billing_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// stopBefore makes the first request of step fail before Stripe executes
// it, while every read fails: with one attempt the call ends with an
// unknown outcome and leaves the claim pending at the step before, as a
// runner that crashed between two steps.
func (e *env) stopBefore(b *billing.Biller, customer, step string, inv *billing.Invoice) {
	e.tb.Helper()
	match := stepMatcher(step)
	var once sync.Once
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		hit := false
		if match(r) {
			once.Do(func() { hit = true })
		}
		if hit || r.Method == http.MethodGet {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	defer e.srv.SetScript(nil)
	if _, err := b.Invoice(context.Background(), customer, period, inv); !errors.Is(err, billing.ErrOutcomeUnknown) {
		e.tb.Fatalf("invoice stopped before %s = %v, want ErrOutcomeUnknown", step, err)
	}
}

// An invoice resumed with other lines of the same total (Config.Invoice
// changed between two runs) is not finished as a mix of both: the lines
// the first run added stay, so adding the new run's remaining lines bills
// an invoice that is neither, whose total is not the receipt's. Nothing is
// finalized or paid; the claim waits for a person. A flow that checks only
// the total before resuming finalizes and pays the mix.
func TestInvoiceResumedWithOtherLinesIsNotFinishedAsAMix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	first := threeLines() // 1000 + 250 + 40
	e.stopBefore(e.b, "cus_1", "line 2", first)
	if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending || c.Step != "line 1" {
		t.Fatalf("claim %s at %q, want pending at line 1", c.State, c.Step)
	}
	changed := threeLines()
	changed.Lines[1].Amount, changed.Lines[2].Amount = 200, 90 // 1000 + 200 + 90: the same total
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, changed)
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices", len(all))
	}
	got := all[0]
	var total int64
	for _, l := range got.Lines {
		total += l.Amount
	}
	if err == nil {
		t.Fatalf("receipt %+v for invoice %s %s with lines %+v (total %d): the invoice is neither the first run's nor the second's", r, got.ID, got.Status, got.Lines, total)
	}
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Fatalf("err = %v, want ErrNeedsReconciliation", err)
	}
	if got.Status != "draft" || got.Finalizations != 0 || got.Payments != 0 {
		t.Fatalf("invoice %s is %s (%d finalizations, %d payments), want a draft left as it is", got.ID, got.Status, got.Finalizations, got.Payments)
	}
	if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending {
		t.Fatalf("claim %s, want pending", c.State)
	}
}

// A draft sent late in its claim's window (its first tries failed before
// Stripe executed anything), then resumed with a rotated key while
// Stripe's search lags by a quarter of an hour: a day has passed since the
// claim's window started, but the draft is only twelve minutes old, so the
// search's "nothing" proves nothing, and the new key's requests do not
// meet the old key's at Stripe. A flow that trusts the search once a day
// has passed since the window started makes a second invoice. (With the
// default WindowMargin the same happens when search lags by over an hour.)
func TestInvoiceRotatedKeyAfterALateDraftMakesNoSecondInvoice(t *testing.T) {
	t.Parallel()
	margin := func(c *billing.Config) { c.WindowMargin = 23*time.Hour + 54*time.Minute }
	e := newEnvWith(t, billingtest.Config{SearchDelay: 15 * time.Minute}, oneAttempt, margin)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv) // the claim's window starts; nothing at Stripe
	e.advance(23*time.Hour + 50*time.Minute)
	e.crashAt(e.b, "cus_1", "draft", inv) // the draft, late in the window, its answer lost
	e.advance(12 * time.Minute)
	rotated := e.biller(oneAttempt, margin, func(c *billing.Config) { c.SecretKey = "sk_test_51BillonceRotatedKey000000000000000000wxyz" })
	_, err := rotated.Invoice(context.Background(), "cus_1", period, inv)
	if n := len(e.srv.Invoices("cus_1")); n != 1 {
		t.Fatalf("%d invoices after the rotated key's call (err %v), want 1", n, err)
	}
	if err == nil {
		t.Fatal("the rotated key's call succeeded while the draft was not searchable yet")
	}
}
