package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

var t0 = time.Date(2026, 9, 1, 12, 0, 0, 0, time.UTC)

func upd(id string, s claim.State, at int) claimengine.Update {
	return claimengine.Update{EventID: id, EventType: "test." + string(s), Key: "k1", StripeID: "py_1", State: string(s), Created: t0.Add(time.Duration(at) * time.Second)}
}

// mustSend claims r and records the answer to its send: payment py_1,
// processing. Only an update about py_1 can then be shown to be about the
// claim's own send.
func mustSend(t *testing.T, s engine, r claimengine.Request) {
	t.Helper()
	mustClaim(t, s, r, claimengine.Won)
	if err := s.Process(context.Background(), r.Key, "py_1"); err != nil {
		t.Fatal(err)
	}
}

func mustApply(t *testing.T, s engine, u claimengine.Update, want claimengine.ApplyOutcome) applied {
	t.Helper()
	a, err := s.Apply(context.Background(), u)
	if err != nil {
		t.Fatalf("Apply(%+v): %v", u, err)
	}
	if a.Outcome != want {
		t.Fatalf("Apply(%s %s) = %v (%s), want %v", u.EventID, u.State, a.Outcome, a.Reason, want)
	}
	return a
}

// A payment that settles later: the claim is processing, holds its period
// (Claim answers Processing, so nothing is sent again), and settles once.
func TestProcessingSettles(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		if err := s.Process(ctx, "k1", "py_1"); err != nil {
			t.Fatal(err)
		}
		if err := s.Process(ctx, "k1", "py_1"); err != nil {
			t.Fatalf("Process again: %v", err)
		}
		if err := s.Process(ctx, "k1", "py_2"); !errors.Is(err, claimengine.ErrConflict) {
			t.Fatalf("Process with another payment = %v, want ErrConflict", err)
		}
		res := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Processing)
		if res.Claim.StripeID != "py_1" || res.Claim.ProcessingAt.IsZero() {
			t.Fatalf("processing claim = %+v", res.Claim)
		}
		// Another key for the same period finds the processing claim.
		if _, err := s.Claim(ctx, req("cus_1", "k2", "b")); err == nil {
			t.Fatal("a second key for a processing period was accepted")
		}
		a := mustApply(t, s, upd("evt_1", claim.StateSucceeded, 1), claimengine.Changed)
		if a.Before.State != claim.StateProcessing || a.Claim.State != claim.StateSucceeded || a.Claim.SettledAt.IsZero() {
			t.Fatalf("applied = %+v", a)
		}
		mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Succeeded)
		// The runner's own answer arriving late changes nothing.
		if err := s.Process(ctx, "k1", "py_1"); err != nil {
			t.Fatalf("Process after settlement: %v", err)
		}
	})
}

// A payment that fails after processing records Stripe's failure code and
// is failed for its key: the next Claim with that key answers Failed (never
// sent again); billing again is an explicit new key.
func TestProcessingFailsWithCode(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		if err := s.Process(ctx, "k1", "py_1"); err != nil {
			t.Fatal(err)
		}
		u := upd("evt_f", claim.StateFailed, 5)
		u.FailureCode = "insufficient_funds"
		a := mustApply(t, s, u, claimengine.Changed)
		c := a.Claim
		if c.State != claim.StateFailed || c.FailureCode != "insufficient_funds" || c.ProcessingAt.IsZero() || c.SettledAt.IsZero() ||
			c.LastError != "payment py_1 failed after processing: insufficient_funds" {
			t.Fatalf("failed claim = %+v", c)
		}
		mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Failed)
		mustApply(t, s, upd("evt_s", claim.StateSucceeded, 4), claimengine.Unchanged) // an older success is not after the failure
		mustClaim(t, s, req("cus_1", "k2", "b"), claimengine.Won)                     // a re-bill, decided by a caller
	})
}

// The same event delivered five times is applied once.
func TestApplyDuplicateEvent(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		mustSend(t, h.store, req("cus_1", "k1", "a"))
		u := upd("evt_1", claim.StateSucceeded, 1)
		mustApply(t, h.store, u, claimengine.Changed)
		var before claim.Claim
		for i := range 4 {
			a := mustApply(t, h.store, u, claimengine.Duplicate)
			if i == 0 {
				before = a.Claim
			} else if a.Claim.UpdatedAt != before.UpdatedAt {
				t.Fatalf("a duplicate changed the claim: %+v, was %+v", a.Claim, before)
			}
		}
	})
}

// permutations returns every order of n items.
func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			q := append(append(append([]int{}, p[:i]...), n-1), p[i:]...)
			out = append(out, q)
		}
	}
	return out
}

// Events for one payment delivered in every order leave the same claim:
// states only move forward, refunds only grow, and the latest dispute wins.
func TestApplyEveryOrder(t *testing.T) {
	t.Parallel()
	events := []claimengine.Update{
		upd("evt_p", claim.StateProcessing, 1),
		upd("evt_s", claim.StateSucceeded, 2),
		{EventID: "evt_r1", EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: 1000, Created: t0.Add(3 * time.Second)},
		{EventID: "evt_r2", EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: 4200, Created: t0.Add(4 * time.Second)},
		{EventID: "evt_d", EventType: "charge.dispute.created", Key: "k1", StripeID: "py_1", Dispute: "dp_1 (fraudulent)", Created: t0.Add(5 * time.Second)},
	}
	orders := permutations(len(events))
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		for i, order := range orders {
			key := fmt.Sprintf("k%d", i)
			mustSend(t, h.store, req(fmt.Sprintf("cus_%d", i), key, "a"))
			var last claim.Claim
			for _, e := range order {
				u := events[e]
				u.Key, u.EventID = key, fmt.Sprintf("%s_%d", u.EventID, i)
				a, err := h.store.Apply(context.Background(), u)
				if err != nil {
					t.Fatal(err)
				}
				last = a.Claim
			}
			if last.State != claim.StateSucceeded || last.StripeID != "py_1" || last.Refunded != 4200 ||
				last.Dispute != "dp_1 (fraudulent)" || !last.EventAt.Equal(t0.Add(5*time.Second)) {
				t.Fatalf("order %v left %+v", order, last)
			}
		}
	})
}

// An update for another payment, or an unknown key, changes nothing; the
// unknown key's event is not recorded, so it stays applicable should its
// claim appear.
func TestApplyOtherPaymentAndUnknownKey(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		mustClaim(t, h.store, req("cus_1", "k1", "a"), claimengine.Won)
		if err := h.store.Process(ctx, "k1", "py_1"); err != nil {
			t.Fatal(err)
		}
		u := upd("evt_1", claim.StateFailed, 1)
		u.StripeID = "py_other"
		mustApply(t, h.store, u, claimengine.OtherPayment)
		if c, _ := h.store.Get(ctx, "k1"); c.State != claim.StateProcessing {
			t.Fatalf("claim = %+v", c)
		}
		u = upd("evt_2", claim.StateSucceeded, 1)
		u.Key = "k_unknown"
		if _, err := h.store.Apply(ctx, u); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("Apply for an unknown key = %v, want ErrNotFound", err)
		}
		u.Key = "k1"
		mustApply(t, h.store, u, claimengine.Changed)
		for _, bad := range []claimengine.Update{
			{Key: "k1", StripeID: "py_1", State: string(claim.StateSucceeded)},                             // no time
			{Key: "k1", StripeID: "py_1", State: "settled", Created: t0},                                   // unknown state
			{Key: "", StripeID: "py_1", State: string(claim.StateSucceeded), Created: t0},                  // no key
			{Key: "k1", StripeID: "py_1", Refunded: -1, Created: t0},                                       // negative refund
			{EventID: "e\x00", Key: "k1", StripeID: "py_1", Created: t0, State: string(claim.StateFailed)}, // bad id
		} {
			if _, err := h.store.Apply(ctx, bad); !errors.Is(err, claim.ErrInvalid) {
				t.Errorf("Apply(%+v) = %v, want ErrInvalid", bad, err)
			}
		}
	})
}

// Unsettled lists processing claims by age, of the scope and of unknown
// scope.
func TestUnsettled(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		for i, scope := range []string{"a", "b", ""} {
			r := req(fmt.Sprintf("cus_%d", i), fmt.Sprintf("k%d", i), "o")
			r.Scope = scope
			mustClaim(t, h.store, r, claimengine.Won)
			if err := h.store.Process(ctx, r.Key, fmt.Sprintf("py_%d", i)); err != nil {
				t.Fatal(err)
			}
		}
		mustClaim(t, h.store, req("cus_9", "k9", "o"), claimengine.Won) // pending: never listed
		if got, _ := h.store.Unsettled(ctx, "a", time.Hour); len(got) != 0 {
			t.Fatalf("Unsettled before an hour = %d claims", len(got))
		}
		h.pass(t, 2*time.Hour)
		got, err := h.store.Unsettled(ctx, "a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		var keys []string
		for _, c := range got {
			keys = append(keys, c.Key)
		}
		if fmt.Sprint(keys) != "[k0 k2]" {
			t.Fatalf("Unsettled(a) = %v, want [k0 k2]", keys)
		}
		if all, _ := h.store.Unsettled(ctx, "", 0); len(all) != 3 {
			t.Fatalf("Unsettled(all) = %d claims, want 3", len(all))
		}
		if _, err := h.store.Unsettled(ctx, "", -time.Second); !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("negative age = %v", err)
		}
	})
}

// One event delivered to many replicas at once is applied by one of them.
func TestApplyConcurrentDeliveries(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		mustSend(t, h.store, req("cus_1", "k1", "a"))
		const n = 16
		var wg sync.WaitGroup
		outcomes := make(chan claimengine.ApplyOutcome, 2*n)
		for i := range 2 * n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				u := upd("evt_p", claim.StateProcessing, 1)
				if i%2 == 1 {
					u = upd("evt_s", claim.StateSucceeded, 2)
				}
				a, err := h.store.Apply(context.Background(), u)
				if err != nil {
					t.Error(err)
					return
				}
				outcomes <- a.Outcome
			}()
		}
		wg.Wait()
		close(outcomes)
		count := map[claimengine.ApplyOutcome]int{}
		for o := range outcomes {
			count[o]++
		}
		// evt_s is applied once (Changed); evt_p once, and Unchanged, the
		// claim being processing already; every other delivery is a
		// duplicate.
		if count[claimengine.Duplicate] != 2*n-2 || count[claimengine.Changed] != 1 || count[claimengine.Unchanged] != 1 {
			t.Fatalf("outcomes = %v", count)
		}
		if c, _ := h.store.Get(context.Background(), "k1"); c.State != claim.StateSucceeded {
			t.Fatalf("claim = %+v", c)
		}
	})
}

// An update moves only a claim of the kind of object it is about: a
// payment's update no invoice's or usage report's claim, and the other way
// round, whatever key the object's metadata names. An update of the
// claim's own kind moves it only once the claim has recorded its object
// (its invoice, its payment).
func TestApplyOnlyToAClaimOfTheUpdatesKind(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		pay := req("cus_1", "k_pay", "a")
		inv := req("cus_2", "k_inv", "a")
		inv.Endpoint = "invoices"
		use := claimengine.Request{Customer: "cus_3", Period: "usage api_calls 2026-09-01T10:00:00Z increment", Key: "k_use", Amount: 5, Owner: "a", Endpoint: "meter_events"}
		for _, r := range []claimengine.Request{pay, inv, use} {
			mustClaim(t, h.store, r, claimengine.Won)
		}
		at := func(key, endpoint, id string) claimengine.Update {
			return claimengine.Update{EventID: "evt_" + key + endpoint, EventType: "test", Key: key, StripeID: id,
				State: string(claim.StateSucceeded), Created: t0, Endpoint: endpoint}
		}
		mustApply(t, h.store, at("k_pay", "invoices", "in_1"), claimengine.OtherPayment)
		mustApply(t, h.store, at("k_pay", "meter_events", "k_pay"), claimengine.OtherPayment)
		mustApply(t, h.store, at("k_inv", "", "ch_1"), claimengine.OtherPayment)
		mustApply(t, h.store, at("k_use", "invoices", "in_2"), claimengine.OtherPayment)
		mustApply(t, h.store, at("k_inv", "invoices", "in_3"), claimengine.Unproven) // no invoice recorded yet
		mustApply(t, h.store, at("k_pay", "", "ch_2"), claimengine.Unproven)         // no payment recorded yet
		for _, key := range []string{"k_pay", "k_inv", "k_use"} {
			if c, _ := h.store.Get(ctx, key); c.State != claim.StatePending {
				t.Fatalf("claim %s after updates of another kind = %+v, want pending", key, c)
			}
		}
		if err := h.store.Advance(ctx, "k_inv", "a", "in_3", "draft"); err != nil {
			t.Fatal(err)
		}
		u := at("k_inv", "invoices", "in_3")
		u.EventID = "evt_paid"
		mustApply(t, h.store, u, claimengine.Changed)
	})
}

// A claim failed by its own payment succeeds when that payment does (a
// PaymentIntent declined off session, completed by its customer): it takes
// its period back, stopping a re-bill still pending, which then passes no
// send check. A re-bill that paid the period keeps it: the answer is
// PaidTwice, and the claim stays failed. Another object's success changes
// nothing (a success older than a failure event: see
// TestPruneConcurrentWithApply).
func TestApplyOwnPaymentSucceedingAfterItsFailure(t *testing.T) {
	t.Parallel()
	attempt := func(n int, owner string) claimengine.Request {
		r := req("cus_1", fmt.Sprintf("k%d", n), owner)
		r.Scope, r.Attempt = "s", n
		return r
	}
	success := func(id, pi string, at int) claimengine.Update {
		return claimengine.Update{EventID: id, EventType: "payment_intent.succeeded", Key: "k1", StripeID: pi,
			State: string(claim.StateSucceeded), Created: t0.Add(time.Duration(at) * time.Second)}
	}
	for _, tc := range []struct {
		name   string
		rebill func(t *testing.T, s engine) // what attempt 2 is when attempt 1's payment succeeds
		want   claimengine.ApplyOutcome
		k1, k2 claim.State // the claims after it; "" for no claim
	}{
		{"no re-bill", func(*testing.T, engine) {}, claimengine.Changed, claim.StateSucceeded, ""},
		{"a re-bill claimed", func(t *testing.T, s engine) { mustClaim(t, s, attempt(2, "b"), claimengine.Won) }, claimengine.Changed, claim.StateSucceeded, claim.StateFailed},
		{"a re-bill that paid", func(t *testing.T, s engine) {
			mustClaim(t, s, attempt(2, "b"), claimengine.Won)
			if err := s.Succeed(context.Background(), "k2", "pi_2"); err != nil {
				t.Fatal(err)
			}
		}, claimengine.PaidTwice, claim.StateFailed, claim.StateSucceeded},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			bothStores(t, time.Minute, func(t *testing.T, h harness) {
				ctx := context.Background()
				s := h.store
				mustClaim(t, s, attempt(1, "a"), claimengine.Won)
				if err := s.Fail(ctx, "k1", "pi_1", "authentication_required"); err != nil {
					t.Fatal(err)
				}
				mustApply(t, s, claimengine.Update{EventID: "evt_f", EventType: "payment_intent.payment_failed", Key: "k1", StripeID: "pi_1",
					State: string(claim.StateFailed), Created: t0.Add(2 * time.Second)}, claimengine.Unchanged)
				tc.rebill(t, s)
				mustApply(t, s, success("evt_other", "pi_other", 3), claimengine.OtherPayment)
				a := mustApply(t, s, success("evt_s", "pi_1", 3), tc.want)
				mustApply(t, s, success("evt_s", "pi_1", 3), claimengine.Duplicate)
				for key, want := range map[string]claim.State{"k1": tc.k1, "k2": tc.k2} {
					c, err := s.Get(ctx, key)
					if want == "" && errors.Is(err, claim.ErrNotFound) {
						continue
					}
					if err != nil || c.State != want {
						t.Errorf("%s = %s (%s), %v; want %s", key, c.State, c.LastError, err, want)
					}
				}
				switch tc.name {
				case "no re-bill":
					if _, err := s.Claim(ctx, attempt(2, "b")); err == nil {
						t.Error("a re-bill of the period was claimed after attempt 1's payment succeeded")
					}
				case "a re-bill claimed":
					if a.Superseded.Key != "k2" || a.Superseded.FailureCode != claim.FailureSuperseded {
						t.Errorf("superseded = %+v, want k2 stopped", a.Superseded)
					}
					if err := s.CheckSend(ctx, "k2", "b", time.Hour); !errors.Is(err, claimengine.ErrLeaseLost) {
						t.Errorf("send check of the stopped re-bill = %v, want ErrLeaseLost", err)
					}
				}
			})
		})
	}
}

// An update about a usage report's meter event (a meter error report)
// moves the claim only if it can be about the claim's own event: on the
// meter the claim recorded, by its Stripe id (another account's meter of
// the same event name has another), received within the time the claim's
// key can be sent, and, once the key's window was reopened, after that.
// Stripe gives whole seconds, so a report about the resend can seem to
// begin a moment before the reopening; one about the send before it
// begins long before. A claim that recorded no meter id (made before the
// table recorded one) is moved by no report.
func TestApplyMeterReportOnlyAboutTheClaimsOwnEvent(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		start := time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)
		usageClaim := func(key string, reopen bool) claim.Claim {
			t.Helper()
			r := claimengine.Request{Customer: "cus_" + key, Period: "usage api_calls 2026-09-01T10:00:00Z increment", Key: key, Amount: 5, Owner: "a", Endpoint: "meter_events",
				Meter: "api_calls", WindowStart: start, WindowEnd: start.Add(time.Hour), MeterID: "mtr_a"}
			if key == "k_unknown" {
				r.MeterID = "" // made before the table recorded meter ids
			}
			mustClaim(t, s, r, claimengine.Won)
			if reopen {
				if err := s.Reopen(ctx, key, "a", "meter_events", "cred"); err != nil {
					t.Fatal(err)
				}
			}
			if err := s.Succeed(ctx, key, key); err != nil {
				t.Fatal(err)
			}
			c, err := s.Get(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}
		n := 0
		report := func(key, meter string, from, to time.Time) claimengine.Update {
			n++
			return claimengine.Update{EventID: fmt.Sprintf("evt_%d/%s", n, key), EventType: "v1.billing.meter.error_report_triggered", Key: key, StripeID: key,
				State: string(claim.StateFailed), FailureCode: "meter_event_customer_not_found", Created: time.Now(), Endpoint: "meter_events",
				MeterID: meter, SentFrom: from, SentTo: to, ReadAt: time.Now()}
		}
		now := time.Now()
		usageClaim("k1", false)
		mustApply(t, s, report("k1", "mtr_b", now, now), claimengine.OtherPayment) // another meter: of another account, or another event name
		mustApply(t, s, report("k1", "", now, now), claimengine.Unproven)
		noWindow := report("k1", "mtr_a", time.Time{}, time.Time{})
		mustApply(t, s, noWindow, claimengine.Unproven)
		mustApply(t, s, report("k1", "mtr_a", now.Add(-time.Hour), now.Add(-10*time.Minute)), claimengine.OtherPayment) // before the claim
		c2 := usageClaim("k2", true)
		mustApply(t, s, report("k2", "mtr_a", c2.ReconciledAt.Add(-2*time.Hour), c2.ReconciledAt.Add(-2*time.Hour)), claimengine.Unproven) // the send before the reopening
		resend := c2.ReconciledAt.Add(-900 * time.Millisecond)                                                                             // the resend's second, cut to whole seconds
		mustApply(t, s, report("k2", "mtr_a", resend, time.Now()), claimengine.Changed)
		mustApply(t, s, report("k1", "mtr_a", time.Now().Add(-time.Second), time.Now()), claimengine.Changed)
		usageClaim("k_unknown", false)
		mustApply(t, s, report("k_unknown", "mtr_a", time.Now().Add(-time.Second), time.Now()), claimengine.Unproven)
		usageClaim("k3", false)
		h.pass(t, 25*time.Hour)
		mustApply(t, s, report("k3", "mtr_a", time.Now(), time.Now()), claimengine.OtherPayment) // another writer's, a day later
		for key, want := range map[string]claim.State{"k1": claim.StateFailed, "k2": claim.StateFailed, "k3": claim.StateSucceeded, "k_unknown": claim.StateSucceeded} {
			if c, err := s.Get(ctx, key); err != nil || c.State != want {
				t.Errorf("%s = %s, %v; want %s", key, c.State, err, want)
			}
		}
	})
}
