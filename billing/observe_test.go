package billing_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/claimengine"
)

type recorder struct {
	mu     sync.Mutex
	events []billing.Event
}

func (r *recorder) observe(e billing.Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// take returns the events so far and forgets them.
func (r *recorder) take() []billing.Event {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.events
	r.events = nil
	return out
}

// want is what one event should say: its kind, the HTTP attempt of a
// Stripe call, whether it carries an error, and the outcome.
type want struct {
	kind    billing.EventKind
	attempt int
	failed  bool
	outcome billing.Outcome
}

func checkEvents(t *testing.T, step, customer string, got []billing.Event, wants ...want) {
	t.Helper()
	if len(got) != len(wants) {
		t.Fatalf("%s: %d events %+v; want %d", step, len(got), got, len(wants))
	}
	for i, w := range wants {
		g := got[i]
		if g.Kind != w.kind || g.Customer != customer || g.Period != period || (g.Err != nil) != w.failed {
			t.Fatalf("%s: event %d is %+v; want %+v", step, i, g, w)
		}
		switch g.Kind {
		case billing.EventStripeCall:
			if g.Attempt != w.attempt || g.Duration <= 0 {
				t.Fatalf("%s: Stripe call %d is %+v; want attempt %d with a duration", step, i, g, w.attempt)
			}
		case billing.EventOutcome:
			if g.Outcome != w.outcome {
				t.Fatalf("%s: outcome %v; want %v", step, g.Outcome, w.outcome)
			}
		}
	}
}

// Config.Observe hears every Stripe call, with its attempt number, and
// exactly one outcome per Charge, whatever the outcome.
func TestObserveCallsAndOutcomes(t *testing.T) {
	t.Parallel()
	rec := &recorder{}
	e := newEnv(t, func(c *billing.Config) { c.Observe = rec.observe })
	ctx := context.Background()
	call := func(attempt int, failed bool) want {
		return want{kind: billing.EventStripeCall, attempt: attempt, failed: failed}
	}
	outcome := func(how billing.Outcome) want { return want{kind: billing.EventOutcome, outcome: how} }
	failed := want{kind: billing.EventOutcome, failed: true}

	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.b.Charge(ctx, "cus_1", period, nil)
	checkEvents(t, "lost response", "cus_1", rec.take(), call(1, true), call(2, false), outcome(billing.Replayed))

	e.b.Charge(ctx, "cus_1", period, nil)
	checkEvents(t, "already recorded", "cus_1", rec.take(), outcome(billing.AlreadyBilled))

	e.srv.FailNext(billingtest.Match{Customer: "cus_2"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	e.b.Charge(ctx, "cus_2", period, nil)
	checkEvents(t, "500 after commit", "cus_2", rec.take(), call(1, true), outcome(billing.Reconciled))

	e.srv.Decline("cus_3", "")
	_, err := e.b.Charge(ctx, "cus_3", period, nil)
	got := rec.take()
	checkEvents(t, "decline", "cus_3", got, call(1, true), failed)
	var fe *billing.ChargeError
	if !(errors.As(got[1].Err, &fe) && errors.Is(got[1].Err, billing.ErrDeclined)) || got[1].Err != err {
		t.Fatalf("decline outcome carries %v; want Charge's ErrDeclined", got[1].Err)
	}
	e.b.Charge(ctx, "cus_3", period, nil)
	checkEvents(t, "recorded decline", "cus_3", rec.take(), failed)

	if _, err := engineOf(e.store).Claim(ctx, claimengine.Request{Customer: "cus_4", Period: period, Key: e.key("cus_4"),
		Amount: amount, Currency: "usd", Owner: "other-runner"}); err != nil {
		t.Fatal(err)
	}
	e.b.Charge(ctx, "cus_4", period, nil)
	checkEvents(t, "in progress", "cus_4", rec.take(), failed)

	e.b.Charge(ctx, "", period, nil)
	if got := rec.take(); len(got) != 0 {
		t.Fatalf("bad input produced events %+v; it never reaches a claim", got)
	}

	// A Run reports each customer's outcome once.
	if _, err := e.b.Run(ctx, period, billing.Customers("cus_1", "cus_5", "cus_6"), nil); err != nil {
		t.Fatal(err)
	}
	outcomes := map[string]billing.Outcome{}
	for _, ev := range rec.take() {
		if ev.Kind == billing.EventOutcome {
			if _, dup := outcomes[ev.Customer]; dup {
				t.Fatalf("two outcomes for %s", ev.Customer)
			}
			outcomes[ev.Customer] = ev.Outcome
		}
	}
	if outcomes["cus_1"] != billing.AlreadyBilled || outcomes["cus_5"] != billing.Created || outcomes["cus_6"] != billing.Created {
		t.Fatalf("Run outcomes %v", outcomes)
	}
}
