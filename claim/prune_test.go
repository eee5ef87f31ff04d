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

// The events of one payment: processing, settled, two refunds and two
// disputes, in the order Stripe created them.
func paymentEvents(key string) []claimengine.Update {
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	return []claimengine.Update{
		{EventID: "evt_p", EventType: "charge.pending", Key: key, StripeID: "py_1", State: string(claim.StateProcessing), Created: at(1)},
		{EventID: "evt_s", EventType: "charge.succeeded", Key: key, StripeID: "py_1", State: string(claim.StateSucceeded), Created: at(2)},
		{EventID: "evt_r1", EventType: "charge.refunded", Key: key, StripeID: "py_1", Refunded: 1000, Created: at(3)},
		{EventID: "evt_d1", EventType: "charge.dispute.created", Key: key, StripeID: "py_1", Dispute: "dp_1 (fraudulent)", Created: at(4)},
		{EventID: "evt_r2", EventType: "charge.refunded", Key: key, StripeID: "py_1", Refunded: 4200, Created: at(5)},
		{EventID: "evt_d2", EventType: "charge.dispute.created", Key: key, StripeID: "py_1", Dispute: "dp_2 (duplicate)", Created: at(6)},
		{EventID: "evt_f", EventType: "charge.failed", Key: key, StripeID: "py_1", State: string(claim.StateFailed), FailureCode: "insufficient_funds", Created: at(7)},
	}
}

// Pruning removes the records of events received longer ago than the
// retention, and only those. An event delivered again after its record
// was pruned is applied again, and changes nothing: states only move
// forward, refunds only grow, the latest dispute stays. Whatever the
// order of the redeliveries.
func TestPruneEventsThenRedeliver(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustSend(t, s, req("cus_1", "k1", "a"))
		events := paymentEvents("k1")
		for _, u := range events {
			if _, err := s.Apply(ctx, u); err != nil {
				t.Fatal(err)
			}
		}
		want, err := s.Get(ctx, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if want.State != claim.StateSucceeded || want.Refunded != 4200 || want.Dispute != "dp_2 (duplicate)" {
			t.Fatalf("claim after the events = %+v", want)
		}
		if n, err := s.PruneEvents(ctx, 30*24*time.Hour); err != nil || n != 0 {
			t.Fatalf("PruneEvents of fresh records = %d, %v; want 0", n, err)
		}
		h.pass(t, 40*24*time.Hour)
		recent := claimengine.Update{EventID: "evt_recent", EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: 100, Created: t0.Add(8 * time.Second)}
		mustApply(t, s, recent, claimengine.Unchanged)
		if n, err := s.PruneEvents(ctx, 30*24*time.Hour); err != nil || n != len(events) {
			t.Fatalf("PruneEvents = %d, %v; want %d", n, err, len(events))
		}
		if n, err := s.PruneEvents(ctx, 30*24*time.Hour); err != nil || n != 0 {
			t.Fatalf("PruneEvents again = %d, %v; want 0", n, err)
		}
		mustApply(t, s, recent, claimengine.Duplicate) // a record within the retention stays

		orders := [][]int{{0, 1, 2, 3, 4, 5, 6}, {6, 5, 4, 3, 2, 1, 0}, {3, 0, 5, 2, 6, 1, 4}, {5, 3, 4, 2, 1, 0, 6}}
		for _, order := range orders {
			want, _ = s.Get(ctx, "k1") // the test's clock moved its times
			for _, i := range order {
				a := mustApply(t, s, events[i], claimengine.Unchanged)
				if a.Claim.UpdatedAt != want.UpdatedAt {
					t.Fatalf("order %v: %s moved the claim: %+v, was %+v", order, events[i].EventID, a.Claim, want)
				}
			}
			for _, i := range order {
				mustApply(t, s, events[i], claimengine.Duplicate)
			}
			h.pass(t, 40*24*time.Hour)
			if n, err := s.PruneEvents(ctx, 30*24*time.Hour); err != nil || n != len(events)+1 && n != len(events) {
				t.Fatalf("PruneEvents = %d, %v", n, err)
			}
		}
		got, _ := s.Get(ctx, "k1")
		if got.State != want.State || got.Refunded != want.Refunded || got.Dispute != want.Dispute || !got.EventAt.Equal(want.EventAt) || !got.SettledAt.Equal(want.SettledAt) {
			t.Fatalf("claim after redeliveries = %+v, want %+v", got, want)
		}
		if _, err := s.PruneEvents(ctx, -time.Second); !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("PruneEvents with a negative age = %v, want ErrInvalid", err)
		}
	})
}

// Two disputes created in the same second (Stripe's times are whole
// seconds): whichever is delivered last, and however often either is
// delivered again after pruning, the claim keeps one of them, the same.
func TestPruneSameSecondDisputes(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		d := func(id, dispute string) claimengine.Update {
			return claimengine.Update{EventID: id, EventType: "charge.dispute.created", Key: "k1", StripeID: "py_1", Dispute: dispute, Created: t0}
		}
		a, b := d("evt_da", "dp_a (fraudulent)"), d("evt_db", "dp_b (general)")
		mustSend(t, s, req("cus_1", "k1", "a"))
		mustApply(t, s, a, claimengine.Changed)
		first, _ := s.Apply(ctx, b)
		kept := first.Claim.Dispute
		for round := range 4 {
			h.pass(t, 40*24*time.Hour)
			if _, err := s.PruneEvents(ctx, 30*24*time.Hour); err != nil {
				t.Fatal(err)
			}
			u := a
			if round%2 == 1 {
				u = b
			}
			got, err := s.Apply(ctx, u)
			if err != nil {
				t.Fatal(err)
			}
			if got.Claim.Dispute != kept || got.Outcome == claimengine.Changed {
				t.Fatalf("round %d: %s delivered again after pruning: %v, dispute %q, was %q", round, u.EventID, got.Outcome, got.Claim.Dispute, kept)
			}
		}
	})
}

// Pruning every record, over and over, while the same events are
// delivered again and again from many goroutines: every delivery is
// applied or a duplicate, none moves the claim backwards, and the claim
// ends as the events say.
func TestPruneConcurrentWithApply(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustSend(t, s, req("cus_1", "k1", "a"))
		events := paymentEvents("k1")
		stop := make(chan struct{})
		var pruned sync.WaitGroup
		pruned.Add(1)
		go func() {
			defer pruned.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := s.PruneEvents(ctx, 0); err != nil {
					t.Error(err)
					return
				}
			}
		}()
		var wg sync.WaitGroup
		var mu sync.Mutex
		changed := map[string]int{}
		for g := range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for r := range 6 {
					for i := range events {
						u := events[(i+g+r)%len(events)]
						a, err := s.Apply(ctx, u)
						if err != nil {
							t.Error(err)
							return
						}
						if a.Claim.Refunded < a.Before.Refunded || rankOf(a.Claim.State) < rankOf(a.Before.State) ||
							a.Before.State != claim.StatePending && a.Before.State != claim.StateProcessing && a.Claim.State != a.Before.State {
							t.Errorf("%s moved the claim backwards: %+v, was %+v", u.EventID, a.Claim, a.Before)
						}
						if a.Outcome == claimengine.Changed {
							mu.Lock()
							changed[fmt.Sprintf("%s %s %d %s", a.Claim.State, a.Before.State, a.Claim.Refunded, a.Claim.Dispute)]++
							mu.Unlock()
						}
					}
				}
			}()
		}
		wg.Wait()
		close(stop)
		pruned.Wait()
		c, _ := s.Get(ctx, "k1")
		if c.Refunded != 4200 || c.Dispute != "dp_2 (duplicate)" || c.State != claim.StateSucceeded && c.State != claim.StateFailed {
			t.Fatalf("claim after concurrent deliveries and pruning = %+v", c)
		}
		for change, n := range changed {
			if n != 1 {
				t.Errorf("the change %q was made %d times", change, n)
			}
		}
	})
}

func rankOf(s claim.State) int {
	switch s {
	case claim.StateProcessing:
		return 1
	case claim.StateSucceeded, claim.StateFailed:
		return 2
	}
	return 0
}

// A dispute delivered late, after an event Stripe created later than the
// dispute (a refund), is still the latest dispute if it is newer than the
// one the claim records: the order of disputes is theirs, not that of
// other events.
func TestLateDisputeAfterLaterEvent(t *testing.T) {
	t.Parallel()
	bothStores(t, time.Minute, func(t *testing.T, h harness) {
		at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
		mustSend(t, h.store, req("cus_1", "k1", "a"))
		mustApply(t, h.store, claimengine.Update{EventID: "evt_d1", EventType: "charge.dispute.created", Key: "k1", StripeID: "py_1", Dispute: "dp_1 (fraudulent)", Created: at(4)}, claimengine.Changed)
		mustApply(t, h.store, claimengine.Update{EventID: "evt_r", EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: 100, Created: at(10)}, claimengine.Changed)
		a := mustApply(t, h.store, claimengine.Update{EventID: "evt_d2", EventType: "charge.dispute.created", Key: "k1", StripeID: "py_1", Dispute: "dp_2 (duplicate)", Created: at(6)}, claimengine.Changed)
		if a.Claim.Dispute != "dp_2 (duplicate)" || !a.Claim.EventAt.Equal(at(10)) {
			t.Fatalf("claim = dispute %q, event at %v; want dp_2, %v", a.Claim.Dispute, a.Claim.EventAt, at(10))
		}
		mustApply(t, h.store, claimengine.Update{EventID: "evt_d1_again", EventType: "charge.dispute.created", Key: "k1", StripeID: "py_1", Dispute: "dp_1 (fraudulent)", Created: at(4)}, claimengine.Unchanged)
	})
}
