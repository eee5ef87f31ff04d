package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// postsFor returns the fake's log entries of the POSTs that carried key,
// in order.
func postsFor(e *env, key string) []billingtest.Entry {
	var out []billingtest.Entry
	for _, en := range e.srv.Log() {
		if en.Method == "POST" && en.IdempotencyKey == key {
			out = append(out, en)
		}
	}
	return out
}

// Every error that comes from a Stripe answer unwraps to Stripe's own
// *stripe.Error, declines included, and its *ChargeError carries the key
// and the request id of the answer, the one the fake logged, while the
// kinds stay what they are. None moved money, and none carries the
// secret key.
func TestChargeErrorsCarryStripesAnswer(t *testing.T) {
	t.Parallel()
	refuse := func(status int, r billingtest.Refusal) billingtest.Fault {
		return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: status, Refusal: r}
	}
	five := billingtest.Fault{Kind: billingtest.FaultErrorBefore}
	cases := []struct {
		name   string
		setup  func(e *env, cus string) *billing.Biller // nil: the env's Biller
		kind   error
		status int
		code   stripe.ErrorCode
		param  string
	}{
		{name: "decline", kind: billing.ErrDeclined, status: 402, code: stripe.ErrorCodeCardDeclined,
			setup: func(e *env, cus string) *billing.Biller { e.srv.Decline(cus, "insufficient_funds"); return nil }},
		{name: "no such payment method", kind: billing.ErrDeclined, status: 400, code: stripe.ErrorCodeResourceMissing, param: "payment_method",
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.FailNext(billingtest.Match{Customer: cus}, refuse(400, billingtest.Refusal{Code: "resource_missing", Param: "payment_method"}))
				return nil
			}},
		{name: "decline not recorded", kind: billing.ErrNotRecorded, status: 402, code: stripe.ErrorCodeCardDeclined,
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.Decline(cus, "")
				st := &failAfter{testStore: wrapStore(e.store), fail: map[string]bool{"Fail": true}}
				return e.biller(func(c *billing.Config) { c.Claims = st })
			}},
		{name: "unknown parameter", kind: billing.ErrStripeRequest, status: 400, code: stripe.ErrorCodeParameterUnknown, param: "amount",
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.FailNext(billingtest.Match{Customer: cus}, refuse(400, billingtest.Refusal{Code: "parameter_unknown", Param: "amount"}))
				return nil
			}},
		{name: "expired key", kind: billing.ErrStripeAuth, status: 401, code: stripe.ErrorCodeAPIKeyExpired,
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.FailNext(billingtest.Match{Customer: cus}, refuse(401, billingtest.Refusal{Code: "api_key_expired"}))
				return nil
			}},
		{name: "key reused", kind: billing.ErrKeyReused, status: 400,
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.FailNext(billingtest.Match{Customer: cus}, refuse(400, billingtest.Refusal{Type: "idempotency_error"}))
				return nil
			}},
		{name: "retries exhausted", kind: billing.ErrOutcomeUnknown, status: 500,
			setup: func(e *env, cus string) *billing.Biller {
				e.srv.FailNext(billingtest.Match{Customer: cus}, five, five, five)
				return e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 3 })
			}},
	}
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		e := newEnv(t, func(c *billing.Config) { c.API = api })
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/%s", api, tc.name), func(t *testing.T) {
				cus := "cus_" + strings.ReplaceAll(tc.name, " ", "_")
				b := tc.setup(e, cus)
				if b == nil {
					b = e.b
				}
				r, err := b.Charge(context.Background(), cus, period, nil)
				var (
					ce *billing.ChargeError
					se *stripe.Error
				)
				if !errors.Is(err, tc.kind) || !errors.As(err, &ce) || !errors.As(err, &se) {
					t.Fatalf("Charge = %v; want a *ChargeError of kind %v wrapping Stripe's *stripe.Error", err, tc.kind)
				}
				sent := postsFor(e, e.key(cus))
				if len(sent) == 0 {
					t.Fatal("the fake logged no POST with the key")
				}
				last := sent[len(sent)-1]
				if se.HTTPStatusCode != tc.status || se.Code != tc.code || se.Param != tc.param || se.RequestID != last.RequestID {
					t.Fatalf("stripe.Error %d %q param %q request %q; want %d %q param %q request %q",
						se.HTTPStatusCode, se.Code, se.Param, se.RequestID, tc.status, tc.code, tc.param, last.RequestID)
				}
				if ce.Key != e.key(cus) || ce.RequestID != last.RequestID {
					t.Fatalf("ChargeError key %q request %q; want %q and %q", ce.Key, ce.RequestID, e.key(cus), last.RequestID)
				}
				if !strings.Contains(err.Error(), last.RequestID) {
					t.Fatalf("the message %q does not name the request %s", err, last.RequestID)
				}
				if n := e.count(cus); n != 0 {
					t.Fatalf("the fake moved money %d times for %s", n, cus)
				}
				if r.Outcome.String() != "none" {
					t.Fatalf("a failed charge's receipt has Outcome %q; want none", r.Outcome)
				}
				secret := strings.TrimPrefix(secretKey, "sk_test_")
				secret = secret[:len(secret)-4]
				for _, s := range []string{err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err)} {
					if strings.Contains(s, secret) {
						t.Fatalf("the secret key leaked into: %s", s)
					}
				}
			})
		}
	}
}

// An answer that is not an error carries its request id too: a charge
// whose recording failed (ErrNotRecorded) names the request that made it;
// a decline read back from the claim store, with no call to Stripe, has no
// Stripe error and no request id.
func TestChargeErrorRequestIDWithoutStripeError(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	st := &failAfter{testStore: wrapStore(e.store), fail: map[string]bool{"Succeed": true}}
	b := e.biller(oneAttempt, func(c *billing.Config) { c.Claims = st })

	_, err := b.Charge(ctx, "cus_ok", period, nil)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrNotRecorded) || !errors.As(err, &ce) {
		t.Fatalf("Charge = %v; want ErrNotRecorded", err)
	}
	sent := postsFor(e, e.key("cus_ok"))
	if len(sent) != 1 || ce.RequestID != sent[0].RequestID || ce.StripeID == "" || e.count("cus_ok") != 1 {
		t.Fatalf("ChargeError request %q stripe %q, %d POSTs %+v, %d charges; want the one POST's request id and one charge",
			ce.RequestID, ce.StripeID, len(sent), sent, e.count("cus_ok"))
	}

	e.srv.Decline("cus_d", "")
	if _, err := e.b.Charge(ctx, "cus_d", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first Charge = %v; want ErrDeclined", err)
	}
	before := len(e.srv.Log())
	_, err = e.b.Charge(ctx, "cus_d", period, nil)
	var se *stripe.Error
	if !errors.Is(err, billing.ErrDeclined) || !errors.As(err, &ce) || errors.As(err, &se) || ce.RequestID != "" || ce.Key != e.key("cus_d") {
		t.Fatalf("recorded decline = %v (request %q); want ErrDeclined with the key, no Stripe error and no request id", err, ce.RequestID)
	}
	if after := len(e.srv.Log()); after != before {
		t.Fatalf("a recorded decline called Stripe %d times", after-before)
	}
}

// Config.Observe's events carry the key of the claim they concern, and
// Stripe's request id of the call they report: each EventStripeCall has
// the id the fake logged for that request, and a failed EventOutcome the
// id of the answer that decided it.
func TestObserveEventsCarryKeyAndRequestID(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newEnv(t, func(c *billing.Config) { c.Observe = rec.observe })
	ctx := context.Background()

	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	e.srv.Decline("cus_2", "")
	if _, err := e.b.Charge(ctx, "cus_2", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Charge = %v; want ErrDeclined", err)
	}
	if _, err := e.b.Run(ctx, period, billing.Customers("cus_1", "cus_3"), nil); err != nil {
		t.Fatal(err)
	}
	calls := map[string][]string{}
	outcomes := map[string]int{}
	runs := 0
	for _, ev := range rec.take() {
		if ev.Kind == billing.EventRun {
			// The run's own event, once, after its customers'.
			if runs++; ev.Key != "" || ev.Period != period || ev.Summary == nil || ev.Summary.Done != 2 || ev.Err != nil || ev.Duration <= 0 {
				t.Fatalf("run event %+v; want the run's period, no key, a summary of 2 customers and a duration", ev)
			}
			continue
		}
		key := e.key(ev.Customer)
		if ev.Key != key {
			t.Fatalf("%v event for %s has key %q; want %q", ev.Kind, ev.Customer, ev.Key, key)
		}
		switch ev.Kind {
		case billing.EventStripeCall:
			calls[ev.Customer] = append(calls[ev.Customer], ev.RequestID)
		case billing.EventOutcome:
			outcomes[ev.Customer]++
			want := ""
			if ev.Err != nil {
				sent := postsFor(e, key)
				want = sent[len(sent)-1].RequestID
			}
			if ev.Err != nil && ev.RequestID != want {
				t.Fatalf("failed outcome for %s has request id %q; want %q", ev.Customer, ev.RequestID, want)
			}
		}
	}
	if runs != 1 {
		t.Fatalf("%d run events; want 1", runs)
	}
	for _, cus := range []string{"cus_1", "cus_2", "cus_3"} {
		var want []string
		for _, en := range postsFor(e, e.key(cus)) {
			want = append(want, en.RequestID)
		}
		if fmt.Sprint(calls[cus]) != fmt.Sprint(want) || len(want) == 0 {
			t.Fatalf("Stripe call events for %s carry request ids %v; the fake logged %v", cus, calls[cus], want)
		}
	}
	if outcomes["cus_1"] != 2 || outcomes["cus_2"] != 1 || outcomes["cus_3"] != 1 {
		t.Fatalf("outcome events %v", outcomes)
	}
	if e.count("cus_1") != 1 || e.count("cus_2") != 0 || e.count("cus_3") != 1 {
		t.Fatalf("charges at the fake: %d %d %d; want 1 0 1", e.count("cus_1"), e.count("cus_2"), e.count("cus_3"))
	}
}

// Every value of billing's enum-like types prints a word, its zero value
// included: a receipt of a failed charge, an Event built by hand, a zero
// Config.
func TestEnumsPrintWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct{ got, want string }{
		{billing.Outcome(0).String(), "none"},
		{fmt.Sprint(billing.Receipt{}.Outcome), "none"},
		{billing.Created.String(), "created"},
		{billing.Replayed.String(), "replayed"},
		{billing.AlreadyBilled.String(), "already billed"},
		{billing.Reconciled.String(), "reconciled"},
		{billing.EventKind(0).String(), "none"},
		{billing.EventStripeCall.String(), "stripe call"},
		{billing.EventOutcome.String(), "outcome"},
		{billing.EventSettled.String(), "settled"},
		{billing.EventRefunded.String(), "refunded"},
		{billing.EventDisputed.String(), "disputed"},
		{billing.EventNotApplied.String(), "not applied"},
		{fmt.Sprint(billing.Event{}.Kind), "none"},
	} {
		if c.got != c.want {
			t.Errorf("printed %q; want %q", c.got, c.want)
		}
	}
}
