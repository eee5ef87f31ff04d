package billing_test

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// rotated makes a Biller send with rotatedKey, another credential, whose
// requests Stripe's replays do not meet.
func rotated(c *billing.Config) { c.SecretKey = rotatedKey }

// stopAtFinalize makes b's call fail before Stripe executes the first
// finalization it sends, and every request after it: the call ends with an
// unknown outcome, as a runner that died after adding the lines.
func (e *env) stopAtFinalize(b *billing.Biller, customer string, inv *billing.Invoice) {
	e.tb.Helper()
	match := stepMatcher("finalize")
	var stopped atomic.Bool
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if stopped.Load() || match(r) {
			stopped.Store(true)
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	defer e.srv.SetScript(nil)
	if _, err := b.Invoice(context.Background(), customer, period, inv); !errors.Is(err, billing.ErrOutcomeUnknown) {
		e.tb.Fatalf("invoice stopped at its finalization = %v, want ErrOutcomeUnknown", err)
	}
}

// A runner that gives up after Stripe added line 1 of 3 leaves the claim
// pending with its draft: the steps are not recorded one by one. Resumed by the same
// key or a rotated one, within the key's window or a day later, each line
// is added once, counted at the fake: a line Stripe made is replayed by
// its key or found by listing the draft's lines, never added again, and
// a line the dead runner may still have on its way is never added by
// another credential until that runner's window has passed. A call that
// finds the lines by listing and then stops before finalizing records
// them, so the next call, which has a fresh window, does not send them
// again with keys Stripe has forgotten (or never saw with its
// credential). A flow that resumes from the draft by sending every line
// again with its key duplicates a line in each of these cases but the
// first; one that trusts a listing that misses a line within the other
// key's window duplicates the line on its way.
func TestInvoiceLinesResumedFromTheDraftAreAddedOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		rotated bool
		after   time.Duration
		// stopped: the first resume stops before the finalization, and a
		// second call of the same Biller finishes the invoice.
		stopped bool
	}{
		{name: "same key within the window", after: time.Hour},
		{name: "same key a day later", after: 25 * time.Hour},
		{name: "same key a day later stopped before finalizing", after: 25 * time.Hour, stopped: true},
		{name: "rotated key within the window", rotated: true, after: time.Hour},
		{name: "rotated key a day later", rotated: true, after: 25 * time.Hour},
		{name: "rotated key a day later stopped before finalizing", rotated: true, after: 25 * time.Hour, stopped: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.crashAt(e.b, "cus_1", "line 1", inv)
			e.wantHeldDraft("claim after the crash")
			if got := e.srv.Invoices("cus_1"); len(got) != 1 || len(got[0].Lines) != 2 {
				t.Fatalf("after the crash the fake has %+v, want one draft with lines 0 and 1", got)
			}
			opts := []func(*billing.Config){oneAttempt}
			if tc.rotated {
				opts = append(opts, rotated)
			}
			b := e.biller(opts...)
			e.advance(tc.after)
			if tc.rotated && tc.after < 24*time.Hour {
				// Line 2 may be on its way under the old key: nothing is
				// sent until its window has passed.
				posts := invoicePosts(e.srv.Log())
				_, err := b.Invoice(context.Background(), "cus_1", period, inv)
				if !errors.Is(err, billing.ErrSentElsewhere) {
					t.Fatalf("rotated key within the window = %v, want ErrSentElsewhere", err)
				}
				if now := invoicePosts(e.srv.Log()); now["line"] != posts["line"] || now["finalize"] != posts["finalize"] {
					t.Fatalf("the rotated key's call sent %v, before it %v; want nothing sent", now, posts)
				}
				e.advance(24 * time.Hour)
			}
			if tc.stopped {
				e.stopAtFinalize(b, "cus_1", inv)
				if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending || c.Step != "line 1" {
					t.Fatalf("claim after the lines were found and the finalization failed: %s at %q, want pending at line 1", c.State, c.Step)
				}
			}
			if _, err := b.Invoice(context.Background(), "cus_1", period, inv); err != nil {
				t.Fatal(err)
			}
			e.wantOneInvoice("cus_1", inv, "paid", 1)
			// The dead runner's lines 0 and 1, and line 2, each once.
			made := map[string]bool{}
			for _, en := range e.srv.Log() {
				if en.Method == http.MethodPost && en.Path == "/v1/invoiceitems" && en.ObjectID != "" {
					made[en.ObjectID] = true
				}
			}
			if len(made) != 3 {
				t.Fatalf("Stripe made the invoice items %v, want 3", made)
			}
		})
	}
}
