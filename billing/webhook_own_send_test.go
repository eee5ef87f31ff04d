package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/paymentintent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Which events may move a claim: only those shown to be about the claim's
// own send. A key in an object's metadata is whatever its writer chose.

// otherBackend is a stripe-go backend on the fake for code other than
// billonce's: a support script, a second integration.
func (e *env) otherBackend() stripe.Backend {
	return stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.srv.URL),
		HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
}

// A support script makes a payment of its own for a customer whose charge
// succeeded but whose answer was lost, copying billonce's metadata, and
// the card declines it. Its failure event must not fail the pending claim
// (the Rebill a declined period invites would charge the customer twice):
// until the claim records its payment, no event is shown to be about its
// own send, and its resume with the same key gets Stripe's replay.
func TestWebhookForeignDeclineWithTheClaimsMetadataLeavesThePendingClaim(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, nil)
			ctx := context.Background()
			h.lostAnswer(h.biller(oneAttempt, func(c *billing.Config) { c.API = api }), "cus_1")
			key := h.key("cus_1")
			ours := h.srv.Payments()[0].ID
			meta := map[string]string{billing.MetaKey: key, billing.MetaCustomer: "cus_1", billing.MetaPeriod: period}
			h.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultDecline, DeclineCode: "insufficient_funds"})
			var err error
			if api == billing.Charges {
				p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
				p.Metadata = meta
				//idemvet:ignore a support script's own charge, which sends no key
				_, err = (&charge.Client{B: h.otherBackend(), Key: secretKey}).New(p)
			} else {
				p := &stripe.PaymentIntentParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String("cus_1"),
					PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
				p.Metadata = meta
				//idemvet:ignore a support script's own payment, which sends no key
				_, err = (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).New(p)
			}
			if se := (*stripe.Error)(nil); !errors.As(err, &se) || se.HTTPStatusCode != http.StatusPaymentRequired {
				t.Fatalf("the support script's payment = %v, want declined", err)
			}
			// The decline's event reaches the webhook first, then ours.
			evs := h.srv.Events()
			for i := len(evs) - 1; i >= 0; i-- {
				if got := h.deliver(evs[i]); got != "unproven" {
					t.Errorf("%s answered %q, want unproven", evs[i].Type, got)
				}
			}
			if c := h.claimOf("cus_1"); c.State != claim.StatePending {
				t.Errorf("claim after another payment's events = %s (%s), want pending: nothing shows they are about its send", c.State, c.LastError)
			}
			r, err := h.b.Charge(ctx, "cus_1", period, nil)
			if errors.Is(err, billing.ErrDeclined) {
				_, _ = h.b.Rebill(ctx, "cus_1", period, 2, nil) // as the decline advises
			} else if err != nil || r.Outcome != billing.Replayed || r.StripeID != ours {
				t.Errorf("Charge = %+v, %v; want Stripe's replay of %s", r, err, ours)
			}
			if n := h.count("cus_1"); n != 1 {
				t.Errorf("%d payments for the period, want 1", n)
			}
		})
	}
}

// confirmOnSession confirms PaymentIntent id again on session, as its
// customer does to authenticate a payment declined off session, and
// returns Stripe's answer.
func (h *hookEnv) confirmOnSession(id string) (*stripe.PaymentIntent, error) {
	p := &stripe.PaymentIntentConfirmParams{}
	p.SetIdempotencyKey("on-session-" + id)
	return (&paymentintent.Client{B: h.otherBackend(), Key: secretKey}).Confirm(id, p)
}

// completeOnSession confirms PaymentIntent id again on session, and wants
// it to succeed.
func (h *hookEnv) completeOnSession(id string) {
	h.tb.Helper()
	if pi, err := h.confirmOnSession(id); err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded {
		h.tb.Fatalf("confirming %s on session = %+v, %v; want succeeded", id, pi, err)
	}
}

// wantCompletionRefused wants its customer's completion of PaymentIntent
// id on session refused, as Stripe refuses a canceled PaymentIntent's.
func (h *hookEnv) wantCompletionRefused(id string) {
	h.tb.Helper()
	pi, err := h.confirmOnSession(id)
	if se := (*stripe.Error)(nil); !errors.As(err, &se) || se.Code != "payment_intent_unexpected_state" {
		h.tb.Errorf("the customer completing %s on session = %+v, %v; want it refused, the PaymentIntent canceled", id, pi, err)
	}
}

// declinedForAuthentication charges customer off session and wants the
// decline Stripe gives a card whose bank asks its holder to authenticate;
// it returns the declined PaymentIntent.
func (h *hookEnv) declinedForAuthentication(customer string) string {
	h.tb.Helper()
	h.srv.Decline(customer, "authentication_required")
	_, err := h.b.Charge(context.Background(), customer, period, nil)
	var ce *billing.ChargeError
	if !errors.As(err, &ce) || !errors.Is(err, billing.ErrDeclined) || ce.Code != "authentication_required" {
		h.tb.Fatalf("Charge = %v, want declined with authentication_required", err)
	}
	ps := h.srv.Payments()
	return ps[len(ps)-1].ID
}

// An off-session PaymentIntent declined with authentication_required is
// completed by its customer on session, Stripe's documented recovery: the
// claim that the decline failed is succeeded by its own PaymentIntent's
// success, so the period is billed, and the Rebill a declined period
// invites is refused without a second payment.
// Its two events, in either order and each delivered twice, are applied
// once each and leave the claim succeeded.
func TestWebhookOwnPaymentIntentCompletedAfterItsDeclineBillsThePeriod(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		reverse bool
		want    string
	}{
		{"in order", false, "[payment_intent.payment_failed unchanged payment_intent.payment_failed duplicate payment_intent.succeeded changed payment_intent.succeeded duplicate]"},
		{"success first", true, "[payment_intent.succeeded changed payment_intent.succeeded duplicate payment_intent.payment_failed unchanged payment_intent.payment_failed duplicate]"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.PaymentIntents, nil)
			ctx := context.Background()
			pi := h.declinedForAuthentication("cus_1")
			h.completeOnSession(pi)
			h.srv.Honor("cus_1") // authenticated, the card goes through off session too
			evs := h.srv.Events()
			if tc.reverse {
				evs[0], evs[1] = evs[1], evs[0]
			}
			var answers []string
			for _, ev := range evs {
				for range 2 {
					answers = append(answers, ev.Type+" "+h.deliver(ev))
				}
			}
			if fmt.Sprint(answers) != tc.want {
				t.Errorf("answers = %v, want %s", answers, tc.want)
			}
			if c := h.claimOf("cus_1"); c.State != claim.StateSucceeded || c.StripeID != pi {
				t.Errorf("claim after its PaymentIntent succeeded = %s %s (%s), want succeeded %s", c.State, c.StripeID, c.LastError, pi)
			}
			if _, err := h.b.Charge(ctx, "cus_1", period, nil); errors.Is(err, billing.ErrDeclined) {
				_, _ = h.b.Rebill(ctx, "cus_1", period, 2, nil) // as the decline advises
			}
			if r, err := h.b.Rebill(ctx, "cus_1", period, 2, nil); err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != pi {
				t.Errorf("Rebill of the paid period = %+v, %v; want already billed by %s", r, err, pi)
			}
			if n := h.count("cus_1"); n != 1 {
				t.Errorf("%d payments for the period, want 1", n)
			}
		})
	}
}

// beforeSend is a claim store that runs hook once, before the send check of
// key: what happens between a claim and its first send.
type beforeSend struct {
	testStore
	key  string
	once sync.Once
	hook func()
}

func (s *beforeSend) CheckSend(ctx context.Context, key, owner string, window time.Duration) error {
	if key == s.key {
		s.once.Do(s.hook)
	}
	return s.testStore.CheckSend(ctx, key, owner, window)
}

// The PaymentIntent's success arrives while a re-bill of the period is
// claimed and not sent yet: the re-bill is refused before it sends, and
// the period is billed once, by the PaymentIntent.
func TestWebhookOwnPaymentIntentCompletedDuringAReBillRefusesItUnsent(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.completeOnSession(pi)
	h.srv.Honor("cus_1")
	k2, err := h.b.Key("cus_1", period, 2)
	if err != nil {
		t.Fatal(err)
	}
	store := &beforeSend{testStore: wrapStore(h.store), key: k2.String(), hook: h.deliverAll}
	b := h.biller(func(c *billing.Config) { c.API, c.Claims = billing.PaymentIntents, store })
	r, err := b.Rebill(ctx, "cus_1", period, 2, nil)
	if n := h.count("cus_1"); n != 1 {
		t.Fatalf("%d payments for the period after a re-bill during its PaymentIntent's success (Rebill = %+v, %v), want 1", n, r, err)
	}
	if err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != pi || r.Attempt != 1 {
		t.Errorf("the stopped Rebill = %+v, %v; want attempt 1's receipt, already billed by %s", r, err, pi)
	}
	if c2 := h.claimOf2("cus_1", 2); c2.State != claim.StateFailed || c2.FailureCode != claim.FailureSuperseded {
		t.Errorf("the stopped re-bill's claim = %s %q, want failed %q", c2.State, c2.FailureCode, claim.FailureSuperseded)
	}
	if !strings.Contains(h.logs.String(), "a re-bill of the period was stopped") {
		t.Errorf("the stopped re-bill is not in the log:\n%s", h.logs)
	}
	if c := h.claimOf("cus_1"); c.State != claim.StateSucceeded || c.StripeID != pi {
		t.Errorf("attempt 1 = %s %s, want succeeded %s", c.State, c.StripeID, pi)
	}
	h.wantBilledBy("cus_1", pi)
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d payments for the period, want 1", n)
	}
}

// A period whose charge was declined off session is invoiced instead,
// and the invoice is paid; then the customer completes the declined
// PaymentIntent on session. An invoice does not cancel the declined
// PaymentIntent (a re-bill does), so two payments exist, and nothing
// undoes that but a person. The event is reported for one
// (EventNotApplied naming the invoice, an error in the log) and bills
// nobody again.
func TestWebhookOwnPaymentIntentCompletedAfterAnInvoicePaidThePeriodIsReportedForAPerson(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	r, err := h.b.Invoice(ctx, "cus_1", period, threeLines())
	if err != nil || r.Outcome != billing.Created {
		t.Fatalf("Invoice = %+v, %v; want created", r, err)
	}
	h.completeOnSession(pi)
	h.deliverAll()
	var reported bool
	for _, e := range h.observed() {
		if e.Kind == billing.EventNotApplied && e.StripeID == pi && strings.Contains(e.Err.Error(), r.StripeID) {
			reported = true
		}
	}
	if !reported || !strings.Contains(h.logs.String(), "level=ERROR") {
		t.Errorf("the second payment of the period was not reported: events %+v", h.observed())
	}
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_1"), nil); err != nil {
		t.Fatal(err)
	}
	_, _ = h.b.Rebill(ctx, "cus_1", period, 2, nil)
	if n := h.srv.Count("cus_1"); n != 1 {
		t.Errorf("%d card payments for the period, want the 1 completed on session", n)
	}
	if got := h.srv.Invoices("cus_1"); len(got) != 1 || got[0].Payments != 1 {
		t.Errorf("invoices of the period: %+v; want one, paid once", got)
	}
}

// The customer tries to complete the declined attempt's PaymentIntent on
// session while a re-bill's request is on its way to Stripe: the re-bill
// canceled it before its key was sent, so the completion is refused, and
// the period is paid once, by the re-bill. Counted at the fake.
func TestDeclinedIntentCompletedWhileAReBillIsOnItsWayIsRefused(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	k2, err := h.b.Key("cus_1", period, 2)
	if err != nil {
		t.Fatal(err)
	}
	var tried sync.Once
	h.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.IdempotencyKey == k2.String() {
			tried.Do(func() { h.wantCompletionRefused(pi) })
		}
		return billingtest.Fault{}
	})
	r2, err := h.b.Rebill(ctx, "cus_1", period, 2, nil)
	h.srv.SetScript(nil)
	if err != nil || r2.Outcome != billing.Created {
		t.Fatalf("Rebill = %+v, %v; want created", r2, err)
	}
	h.deliverAll()
	h.wantBilledBy("cus_1", r2.StripeID)
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d payments for the period, want 1", n)
	}
}

// A failed claim succeeds only by its own payment. Another payment's
// success that carries its key (a support script's charge copying the
// metadata), or a success of another kind of object (a payment naming a
// usage report's key, an invoice naming a charge's), leaves it failed,
// however often and in whatever order the events arrive.
func TestWebhookSuccessOfAnotherObjectLeavesAFailedClaimFailed(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	h.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	h.srv.Decline("cus_1", "insufficient_funds")
	if _, err := h.b.Charge(ctx, "cus_1", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Charge = %v, want declined", err)
	}
	h.srv.Honor("cus_1")
	h.srv.RejectUsage("cus_2", "meter_event_customer_not_found")
	u := usage("cus_2", 3)
	r, err := h.b.ReportUsage(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.AggregateNow()
	h.deliverAll()
	h.srv.RejectUsage("cus_2", "")
	before := len(h.srv.Events())
	cc := &charge.Client{B: h.otherBackend(), Key: secretKey}
	for customer, key := range map[string]string{"cus_1": h.key("cus_1"), "cus_2": r.Key.String()} {
		p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
		p.Metadata = map[string]string{billing.MetaKey: key, billing.MetaCustomer: customer, billing.MetaPeriod: period}
		//idemvet:ignore a support script's own charge, which sends no key
		if _, err := cc.New(p); err != nil {
			t.Fatal(err)
		}
	}
	ip := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), AutoAdvance: stripe.Bool(false)}
	ip.IdempotencyKey = stripe.String("other-invoice")
	ip.AddMetadata(billing.MetaKey, h.key("cus_1"))
	in, err := h.invoices().New(ip)
	if err != nil {
		t.Fatal(err)
	}
	fp := &stripe.InvoiceFinalizeInvoiceParams{}
	fp.IdempotencyKey = stripe.String("other-invoice-finalize")
	if _, err := h.invoices().FinalizeInvoice(in.ID, fp); err != nil { // empty: paid at once
		t.Fatal(err)
	}
	evs := h.srv.Events()[before:]
	for round := range 3 {
		for i := range evs {
			ev := evs[i]
			if round == 1 {
				ev = evs[len(evs)-1-i]
			}
			got := h.deliver(ev)
			if got == "ignored: event type not handled" {
				continue
			}
			if round == 0 && got != "otherpayment" || round > 0 && got != "duplicate" {
				t.Errorf("round %d: %s answered %q", round, ev.Type, got)
			}
		}
	}
	for key, who := range map[string]string{h.key("cus_1"): "the declined charge", r.Key.String(): "the rejected usage report"} {
		if c, err := h.store.Get(ctx, key); err != nil || c.State != claim.StateFailed {
			t.Errorf("%s after another object's success = %s (%s), %v; want failed", who, c.State, c.LastError, err)
		}
	}
	if _, err := h.b.Charge(ctx, "cus_1", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Errorf("Charge after another object's success = %v, want still declined", err)
	}
}

// A customer who completes, on session, the PaymentIntent of an attempt
// that was declined, after the period was re-billed and paid, would pay
// the period twice: the re-bill cancels that PaymentIntent before its own
// key is sent, so the completion is refused. Counted at the fake.
func TestDeclinedIntentCompletedAfterItsRebillIsNotPaidTwice(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	first := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	r2, err := h.b.Rebill(context.Background(), "cus_1", period, 2, nil)
	if err != nil || r2.Outcome != billing.Created {
		t.Fatalf("Rebill(2) = %+v, %v; want created", r2, err)
	}
	h.wantCompletionRefused(first)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
	for _, e := range h.observed() {
		if e.Kind == billing.EventNotApplied {
			t.Errorf("an event was not applied: %v", e.Err)
		}
	}
	h.wantBilledBy("cus_1", r2.StripeID)
}

// A re-bill's answer is lost (Stripe charged it; its search is down), and
// its claim is left pending with its key, for a resume to learn its
// outcome. The declined attempt's PaymentIntent was canceled before the
// re-bill was sent, so its customer can no longer complete it: the period
// has one payment, the re-bill's, and the re-bill's resume records it.
// Counted at the fake.
func TestDeclinedIntentCanceledBeforeAReBillWhoseAnswerIsLostLeavesOnePaymentForTheResume(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1")
	k2, err := h.b.Key("cus_1", period, 2)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.FailNext(billingtest.Match{IdempotencyKey: k2.String()}, billingtest.Fault{Kind: billingtest.FaultCut})
	h.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	b := h.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
	if _, err := b.Rebill(ctx, "cus_1", period, 2, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("Rebill with a lost answer = %v, want ErrOutcomeUnknown", err)
	}
	h.srv.SetScript(nil)
	ps := h.srv.Payments()
	rebill := ps[len(ps)-1]
	if rebill.ID == pi || rebill.Metadata[billing.MetaKey] != k2.String() {
		t.Fatalf("the last payment is %s (key %s), want the re-bill's", rebill.ID, rebill.Metadata[billing.MetaKey])
	}
	h.wantCompletionRefused(pi)
	h.deliverAll()
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d payments for the period, want 1, the re-bill's", n)
	}
	r, err := b.Rebill(ctx, "cus_1", period, 2, nil)
	if err != nil || r.Outcome != billing.Replayed || r.StripeID != rebill.ID {
		t.Errorf("the re-bill's resume = %+v, %v; want Stripe's replay of %s", r, err, rebill.ID)
	}
	if c1, c2 := h.claimOf("cus_1"), h.claimOf2("cus_1", 2); c1.State != claim.StateFailed || c2.State != claim.StateSucceeded || c2.StripeID != rebill.ID {
		t.Errorf("attempt 1 = %s %s, attempt 2 = %s %s (%s); want failed, and succeeded by %s", c1.State, c1.StripeID, c2.State, c2.StripeID, c2.LastError, rebill.ID)
	}
	for _, e := range h.observed() {
		if e.Kind == billing.EventNotApplied {
			t.Errorf("an event was not applied: %v", e.Err)
		}
	}
	h.wantBilledBy("cus_1", rebill.ID)
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("%d payments for the period, want 1", n)
	}
}

// A PaymentIntent declined off session, whose answer was lost, is
// completed by its customer on session before billonce resumes it. Stripe
// replays the key's stored answer, the decline, whatever became of the
// PaymentIntent since: billonce must not record the period declined (and
// advise a re-bill) while its PaymentIntent is paid. Counted at the fake.
func TestReplayedDeclineOfAPaymentIntentCompletedSinceBillsThePeriod(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	b, pi := h.declineAnswerLost("cus_1")
	h.completeOnSession(pi.ID)
	r, err := b.Charge(ctx, "cus_1", period, nil)
	if errors.Is(err, billing.ErrDeclined) {
		_, _ = b.Rebill(ctx, "cus_1", period, 2, nil) // as the decline advises
	} else if err != nil || r.StripeID != pi.ID {
		t.Errorf("Charge after the customer completed the PaymentIntent = %+v, %v; want its receipt", r, err)
	}
	if n := h.count("cus_1"); n != 1 {
		t.Errorf("cus_1 paid %d times for %s; want once", n, period)
	}
}

// wantBilledBy wants every later call for customer's period, a Charge and
// re-bills of attempts 2 and 3, to answer that payment pi billed it.
func (h *hookEnv) wantBilledBy(customer, pi string) {
	h.tb.Helper()
	ctx := context.Background()
	for _, call := range []func() (billing.Receipt, error){
		func() (billing.Receipt, error) { return h.b.Charge(ctx, customer, period, nil) },
		func() (billing.Receipt, error) { return h.b.Rebill(ctx, customer, period, 2, nil) },
		func() (billing.Receipt, error) { return h.b.Rebill(ctx, customer, period, 3, nil) },
	} {
		if r, err := call(); err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != pi {
			h.tb.Errorf("a later call = %+v, %v; want already billed by %s", r, err, pi)
		}
	}
}

// declineAnswerLost has customer charged off session by a Biller of one
// attempt on the PaymentIntents API, whose PaymentIntent is declined for
// authentication and whose answer is lost, with Stripe's search failing
// too, so that the claim stays pending with an unknown outcome. It
// returns that Biller and the declined PaymentIntent.
func (h *hookEnv) declineAnswerLost(customer string) (*billing.Biller, billingtest.Payment) {
	h.tb.Helper()
	b := h.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
	h.srv.Decline(customer, "authentication_required")
	h.srv.FailNext(billingtest.Match{Customer: customer}, billingtest.Fault{Kind: billingtest.FaultCut})
	h.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore} // search cannot settle it either
		}
		return billingtest.Fault{}
	})
	if _, err := b.Charge(context.Background(), customer, period, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
		h.tb.Fatalf("Charge with the decline's answer lost = %v; want ErrOutcomeUnknown", err)
	}
	h.srv.SetScript(nil)
	ps := h.srv.Payments()
	return b, ps[len(ps)-1]
}
