package billing_test

import (
	"context"
	"errors"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/paymentintent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
)

// A re-bill and the PaymentIntents of the attempts it follows: a
// PaymentIntent declined off session can still be completed by its
// customer on session, so a re-bill cancels it before its own key is sent.

// cancels returns the requests that canceled PaymentIntent id, in order.
func (e *env) cancels(id string) []billingtest.Entry {
	return slices.DeleteFunc(e.srv.Log(), func(l billingtest.Entry) bool {
		return l.Method != http.MethodPost || l.Path != "/v1/payment_intents/"+id+"/cancel"
	})
}

// sentWith returns the requests that carried key, in order.
func (e *env) sentWith(key string) []billingtest.Entry {
	return slices.DeleteFunc(e.srv.Log(), func(l billingtest.Entry) bool { return l.IdempotencyKey != key })
}

// keyOf returns customer's key of attempt for period.
func (e *env) keyOf(customer string, attempt int) string {
	e.tb.Helper()
	k, err := e.b.Key(customer, period, attempt)
	if err != nil {
		e.tb.Fatal(err)
	}
	return k.String()
}

// cancelKey is the key of the cancel of the PaymentIntent of the attempt
// whose key is key: derived from that key, as invariant "key from intent"
// wants.
func cancelKey(tb testing.TB, key string) string {
	tb.Helper()
	k, err := idemkey.For(billing.DefaultScope, key, "cancel")
	if err != nil {
		tb.Fatal(err)
	}
	return k.String()
}

// Attempts 1 and 2 are declined off session; re-bill 3 pays the period.
// Before each re-bill's key is sent, the PaymentIntent of every attempt
// before it is canceled, under a key derived from that attempt's key (so
// the second cancel of attempt 1's is Stripe's replay of the first), and
// neither can be completed by its customer afterwards. Counted at the fake.
func TestRebillCancelsEveryDeclinedIntentOfThePeriodBeforeItsKeyIsSent(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi1 := h.declinedForAuthentication("cus_1")
	if _, err := h.b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Rebill(2) = %v; want declined", err)
	}
	ps := h.srv.Payments()
	pi2 := ps[len(ps)-1].ID
	h.srv.Honor("cus_1")
	r3, err := h.b.Rebill(ctx, "cus_1", period, 3, nil)
	if err != nil || r3.Outcome != billing.Created {
		t.Fatalf("Rebill(3) = %+v, %v; want created", r3, err)
	}
	log := h.srv.Log()
	for _, tc := range []struct {
		pi      string
		attempt int
		cancels int // one per later re-bill
	}{{pi1, 1, 2}, {pi2, 2, 1}} {
		cs := h.cancels(tc.pi)
		if len(cs) != tc.cancels {
			t.Errorf("attempt %d's PaymentIntent %s was canceled by %d requests, want %d, one per re-bill after it", tc.attempt, tc.pi, len(cs), tc.cancels)
			continue
		}
		want := cancelKey(t, h.keyOf("cus_1", tc.attempt))
		for i, c := range cs {
			if c.IdempotencyKey != want || c.Status != http.StatusOK || c.Replayed != (i > 0) {
				t.Errorf("cancel %d of %s: key %q, HTTP %d, replayed %v; want key %q, 200, a replay after the first", i, tc.pi, c.IdempotencyKey, c.Status, c.Replayed, want)
			}
			// Every cancel comes before the key of the re-bill that made it.
			sent := slices.IndexFunc(log, func(l billingtest.Entry) bool { return l.IdempotencyKey == h.keyOf("cus_1", tc.attempt+1+i) })
			at := slices.IndexFunc(log, func(l billingtest.Entry) bool { return l.RequestID == c.RequestID })
			if sent < 0 || at > sent {
				t.Errorf("cancel %d of %s is request %d of the log, the re-bill it comes before request %d", i, tc.pi, at, sent)
			}
		}
		if got := h.srv.Final()[tc.pi]; got != "canceled" {
			t.Errorf("attempt %d's PaymentIntent %s is %s at Stripe, want canceled", tc.attempt, tc.pi, got)
		}
		h.wantCompletionRefused(tc.pi)
	}
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
	h.wantBilledBy("cus_1", r3.StripeID)
}

// A re-bill whose runner died just after its claim is resumed past its
// key's deadline: Stripe's search finds no payment for the key, which
// reopens its window, and the declined attempt's PaymentIntent is canceled
// before the key is sent, as on a first send.
func TestRebillResumedPastItsKeysWindowCancelsTheDeclinedIntentBeforeItSends(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	crash := h.biller(func(c *billing.Config) { c.API, c.Claims = billing.PaymentIntents, crashAfterClaim{wrapStore(h.store)} })
	if _, err := crash.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, errCrashed) {
		t.Fatalf("crashing re-bill: %v", err)
	}
	h.advance(25 * time.Hour)
	r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("the resumed Rebill = %+v, %v; want created", r, err)
	}
	if cs := h.cancels(pi); len(cs) != 1 || cs[0].Status != http.StatusOK {
		t.Errorf("cancels of the declined PaymentIntent: %+v; want one, 200", cs)
	}
	h.wantCompletionRefused(pi)
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
}

// A declined charge cannot be completed later: a re-bill with the Charges
// API cancels nothing.
func TestRebillOfADeclinedChargeCancelsNothing(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	h.srv.Decline("cus_1", "insufficient_funds")
	if _, err := h.b.Charge(ctx, "cus_1", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Charge = %v; want declined", err)
	}
	h.srv.Honor("cus_1")
	if r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil); err != nil || r.Outcome != billing.Created {
		t.Fatalf("Rebill(2) = %+v, %v; want created", r, err)
	}
	for _, l := range h.srv.Log() {
		if l.Method == http.MethodPost && l.Path != "/v1/charges" {
			t.Errorf("a re-bill of a declined charge sent %s %s", l.Method, l.Path)
		}
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
}

// The customer completed the declined attempt's PaymentIntent on session
// before the period was re-billed, and no webhook told billonce: the
// re-bill's cancel is refused, since the PaymentIntent succeeded (or is
// processing, a bank debit), so it pays the period. The re-bill sends
// nothing and answers attempt 1's receipt, already billed; a succeeded
// PaymentIntent is recorded on attempt 1's claim, a processing one by its
// success event once it settles. Counted at the fake.
func TestRebillOfAPeriodWhoseDeclinedIntentWasCompletedMeanwhileSendsNothing(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		processing bool
	}{{"succeeded", false}, {"processing", true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.PaymentIntents, nil)
			ctx := context.Background()
			pi := h.declinedForAuthentication("cus_1")
			h.srv.Honor("cus_1")
			if tc.processing {
				h.srv.SettleLater("cus_1", billingtest.Async{After: time.Hour})
			}
			if got, err := h.confirmOnSession(pi); err != nil || (got.Status == stripe.PaymentIntentStatusProcessing) != tc.processing {
				t.Fatalf("the customer completing %s on session = %+v, %v", pi, got, err)
			}
			for range 2 {
				r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
				if err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != pi || r.Attempt != 1 || r.Processing != tc.processing {
					t.Errorf("Rebill(2) = %+v, %v; want attempt 1's receipt, already billed by %s, processing %v", r, err, pi, tc.processing)
				}
			}
			if sent := h.sentWith(h.keyOf("cus_1", 2)); len(sent) != 0 {
				t.Errorf("the re-bill's key was sent: %+v", sent)
			}
			if cs := h.cancels(pi); len(cs) == 0 || cs[0].Status != http.StatusBadRequest {
				t.Errorf("cancels of the completed PaymentIntent: %+v; want refused", cs)
			}
			if _, err := h.store.Get(ctx, h.keyOf("cus_1", 2)); !errors.Is(err, claim.ErrNotFound) {
				t.Errorf("the re-bill's claim, whose key was never sent: %v; want it abandoned", err)
			}
			if tc.processing {
				if n := h.count("cus_1"); n != 0 {
					t.Errorf("%d payments for the period before the PaymentIntent settled, want 0", n)
				}
				h.srv.Advance(time.Hour)
			}
			h.deliverAll()
			if c := h.claimOf("cus_1"); c.State != claim.StateSucceeded || c.StripeID != pi {
				t.Errorf("attempt 1 = %s %s (%s), want succeeded by %s", c.State, c.StripeID, c.LastError, pi)
			}
			for _, e := range h.observed() {
				if e.Kind == billing.EventNotApplied {
					t.Errorf("an event was not applied: %v", e.Err)
				}
			}
			h.wantBilledBy("cus_1", pi)
			if n := h.count("cus_1"); n != 1 {
				t.Errorf("%d payments for the period, want 1", n)
			}
		})
	}
}

// The cancel of the declined attempt's PaymentIntent gets no answer (cut
// after Stripe canceled it, or a 5xx before it did): whether the
// PaymentIntent can still be completed is unknown, so the re-bill's key is
// not sent and the re-bill is ErrOutcomeUnknown. The next Rebill cancels
// again with the same key, and then bills the period. Counted at the fake.
func TestRebillWhoseCancelOfTheDeclinedIntentIsUnknownSendsNothing(t *testing.T) {
	t.Parallel()
	for _, fault := range []billingtest.FaultKind{billingtest.FaultCut, billingtest.FaultErrorBefore} {
		t.Run(string(fault), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.PaymentIntents, nil)
			ctx := context.Background()
			pi := h.declinedForAuthentication("cus_1")
			h.srv.Honor("cus_1")
			h.srv.FailNext(billingtest.Match{Path: "/v1/payment_intents/" + pi + "/cancel"}, billingtest.Fault{Kind: fault})
			b := h.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
			if _, err := b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
				t.Fatalf("Rebill with the cancel's answer lost = %v; want ErrOutcomeUnknown", err)
			}
			if sent := h.sentWith(h.keyOf("cus_1", 2)); len(sent) != 0 {
				t.Errorf("the re-bill's key was sent: %+v", sent)
			}
			if n := h.count("cus_1"); n != 0 {
				t.Errorf("%d payments for the period, want 0", n)
			}
			r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
			if err != nil || r.Outcome != billing.Created {
				t.Fatalf("Rebill again = %+v, %v; want created", r, err)
			}
			want := cancelKey(t, h.key("cus_1"))
			for _, c := range h.cancels(pi) {
				if c.IdempotencyKey != want {
					t.Errorf("a cancel of %s carried key %q, want %q", pi, c.IdempotencyKey, want)
				}
			}
			h.wantCompletionRefused(pi)
			if n := h.count("cus_1"); n != 1 {
				t.Errorf("%d payments for the period, want 1", n)
			}
		})
	}
}

// A person canceled the declined attempt's PaymentIntent in Stripe's
// dashboard: the re-bill's own cancel is refused, since it is canceled
// already, and that is what the re-bill needs; it bills the period.
func TestRebillAfterTheDeclinedIntentWasCanceledByHandBillsThePeriod(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	p := &stripe.PaymentIntentCancelParams{}
	p.SetIdempotencyKey("dashboard-cancel")
	if got, err := (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).Cancel(pi, p); err != nil || got.Status != stripe.PaymentIntentStatusCanceled {
		t.Fatalf("canceling %s by hand = %+v, %v", pi, got, err)
	}
	r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("Rebill(2) = %+v, %v; want created", r, err)
	}
	if cs := h.cancels(pi); len(cs) != 2 || cs[1].Status != http.StatusBadRequest || cs[1].IdempotencyKey != cancelKey(t, h.key("cus_1")) {
		t.Errorf("cancels of %s: %+v; want the person's, then the re-bill's, refused", pi, cs)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d payments for the period, want 1", n)
	}
}
