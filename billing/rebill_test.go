package billing_test

// Re-bills: their numbering, their races with Charge, Run and other
// re-bills, and what Charge reports once one is made. The oracle is the
// fake Stripe's ledger.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Attempt 1 is processing; a dunning process calls Rebill(2) at once and
// again after the payment settles. Nothing but attempt 1 may be charged.
func TestRebillWhileProcessingChargesNothing(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, map[string]billingtest.Async{"cus_p": {After: time.Hour}})
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_p", period, nil)
			if err != nil || !r.Processing {
				t.Fatalf("Charge = %+v, %v; want processing", r, err)
			}
			r2, err2 := h.b.Rebill(ctx, "cus_p", period, 2, nil)
			if n := len(h.srv.Payments()); n != 1 {
				t.Fatalf("%d payments after Rebill(2) while attempt 1 processes: %+v, %v", n, r2, err2)
			}
			h.srv.Advance(2 * time.Hour)
			h.deliverAll()
			r3, err3 := h.b.Rebill(ctx, "cus_p", period, 2, nil)
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_p"), nil); err != nil {
				t.Fatal(err)
			}
			if n := len(h.srv.Payments()); n != 1 || h.count("cus_p") != 1 {
				t.Fatalf("%d payments (%d counted) after settling; Rebill = %+v, %v", n, h.count("cus_p"), r3, err3)
			}
		})
	}
}

// A re-bill that skips a number (attempt 3 after a declined attempt 1,
// with no attempt 2) would bill the period where Charge and Run, walking
// the attempts in order from the decline, cannot see it: they would report
// attempt 1's decline for a customer who has paid, and send a dunning
// process after them. Such a re-bill is refused before anything is sent;
// the consecutive one bills, and is then reported as billed.
func TestRebillSkippingANumberIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_s", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_s", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor("cus_s")
	if _, err := e.b.Rebill(ctx, "cus_s", period, 3, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("Rebill(3) with no attempt 2: %v; want ErrInvalid", err)
	}
	billingtest.RequireNotCharged(t, e.srv, "cus_s", period)
	// A re-bill of a customer never charged is refused too: Charge would
	// then meet its claim as a mismatch and report the customer unbilled.
	if _, err := e.b.Rebill(ctx, "cus_never", period, 2, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("Rebill(2) of a customer never charged: %v; want ErrInvalid", err)
	}
	billingtest.RequireNotCharged(t, e.srv, "cus_never", period)

	r2, err := e.b.Rebill(ctx, "cus_s", period, 2, nil)
	if err != nil {
		t.Fatalf("Rebill(2): %v", err)
	}
	r, err := e.b.Charge(ctx, "cus_s", period, nil)
	if err != nil || r.StripeID != r2.StripeID {
		t.Errorf("Charge after Rebill(2) = %+v, %v; want AlreadyBilled with %s", r, err, r2.StripeID)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_s"), nil)
	if err != nil || !sum.Complete() {
		t.Errorf("Run after Rebill(2) = %+v, %v; want complete", sum.Progress, err)
	}
	if r3, err := e.b.Rebill(ctx, "cus_s", period, 3, nil); err != nil || r3.Outcome != billing.AlreadyBilled || r3.StripeID != r2.StripeID {
		t.Errorf("Rebill(3) after a paid Rebill(2) = %+v, %v; want AlreadyBilled with %s", r3, err, r2.StripeID)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_s", period)
}

// Rebill with an attempt number already used by a re-bill that is paid, a
// negative one, or one past the limit: nothing more is charged.
func TestRebillReusedNegativeOrHugeNumberIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_n", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_n", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor("cus_n")
	if _, err := e.b.Rebill(ctx, "cus_n", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range []int{2, 2, -1, 0, 1, 10_001, 1 << 40, 3, 10_000} {
		r, err := e.b.Rebill(ctx, "cus_n", period, a, nil)
		t.Logf("Rebill(%d) = %v, %v", a, r.Outcome, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_n", period)
}

// A refunded or disputed payment is not a reason to bill again: Rebill,
// Charge and Run after it charge nothing, even a day later.
func TestRebillAfterRefundOrDisputeChargesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []string{"cus_rf", "cus_dp"} {
		r, err := e.b.Charge(ctx, c, period, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c == "cus_rf" {
			if err := e.srv.Refund(r.StripeID, amount); err != nil {
				t.Fatal(err)
			}
		} else if _, err := e.srv.Dispute(r.StripeID, "fraudulent"); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Advance(25 * time.Hour)
	e.exec(`UPDATE billonce_claims SET created_at = created_at - interval '25 hours', first_sent_at = first_sent_at - interval '25 hours'`)
	for _, c := range []string{"cus_rf", "cus_dp"} {
		for a := 2; a <= 3; a++ {
			_, err := e.b.Rebill(ctx, c, period, a, nil)
			t.Logf("%s Rebill(%d): %v", c, a, err)
		}
		if _, err := e.b.Charge(ctx, c, period, nil); err != nil {
			t.Errorf("%s Charge: %v", c, err)
		}
	}
	if _, err := e.b.Run(ctx, period, billing.Customers("cus_rf", "cus_dp"), nil); err != nil {
		t.Fatal(err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_rf", period)
	billingtest.RequireChargedOnce(t, e.srv, "cus_dp", period)
}

// Rebill(2) racing a Run that bills the declined customer's neighbours and
// finds the customer declined: the re-bill charges once, the Run none.
func TestRebillRacingRunChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ids := customers(40)
	for _, id := range ids[:20] {
		e.srv.Decline(id, "insufficient_funds")
	}
	if _, err := e.b.Run(ctx, period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:20] {
		e.srv.Honor(id)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := e.biller()
			if i == 0 {
				_, _ = b.Run(ctx, period, billing.Customers(ids...), nil)
				return
			}
			for _, id := range ids[:20] {
				_, _ = b.Rebill(ctx, id, period, 2, nil)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
}

// A customer declined 120 times in a row (a dunning process re-billing
// daily, say), then paid by re-bill 122: Charge and Run report the period
// as billed, however many re-bills came before.
func TestManyRebillsThenPaidIsBilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_m", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_m", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatal(err)
	}
	for a := 2; a <= 121; a++ {
		if _, err := e.b.Rebill(ctx, "cus_m", period, a, nil); !errors.Is(err, billing.ErrDeclined) {
			t.Fatalf("Rebill(%d): %v", a, err)
		}
	}
	e.srv.Honor("cus_m")
	paid, err := e.b.Rebill(ctx, "cus_m", period, 122, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.b.Charge(ctx, "cus_m", period, nil)
	if err != nil || r.StripeID != paid.StripeID {
		t.Errorf("Charge after re-bill 122 paid: %v, %v; want AlreadyBilled %s", r.Outcome, err, paid.StripeID)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_m"), nil)
	if err != nil || !sum.Complete() {
		t.Errorf("Run after re-bill 122 paid: %+v, %v", sum.Progress, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_m", period)
}

// The race of rebill3PastAbandoned2: Charge and Run, walking from attempt
// 1's decline, would stop at attempt 2 and report a paying customer as
// declined.
func TestRebillRacingAbandonedPredecessorBillsOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const cus = "cus_race5"
	r3, err3 := rebill3PastAbandoned2(t, e, cus, false)
	requireBilledOnceAfter(t, e, cus, r3, err3)
	sum, err := e.b.Run(context.Background(), period, billing.Customers(cus), nil)
	if err != nil || !sum.Complete() || sum.Declined != 0 {
		t.Errorf("the customer paid, but Run reports %+v, %v", sum.Progress, err)
	}
}

// Rebill(2) while attempt 1 is still processing answers AlreadyBilled
// (processing); attempt 1 then fails when it settles, learnt from its
// webhook events or, with no webhook at all, by Reconcile's poll days
// later. Charge and Run must then say declined (not billed), and the
// same Rebill(2) must now bill, once.
func TestRebillDuringProcessingThenFailed(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		for _, viaHook := range []bool{true, false} {
			t.Run(fmt.Sprintf("%s/webhook=%v", api, viaHook), func(t *testing.T) {
				t.Parallel()
				const cus = "cus_ach5"
				h := newHookEnv(t, api, map[string]billingtest.Async{cus: {After: 72 * time.Hour, FailureCode: "insufficient_funds"}})
				ctx := context.Background()
				r1, err := h.b.Charge(ctx, cus, period, nil)
				if err != nil || !r1.Processing {
					t.Fatalf("Charge = %+v, %v; want processing", r1, err)
				}
				r2, err := h.b.Rebill(ctx, cus, period, 2, nil)
				if err != nil || r2.Outcome != billing.AlreadyBilled || !r2.Processing || r2.Attempt != 1 {
					t.Fatalf("Rebill(2) during processing = %+v, %v; want AlreadyBilled, processing, attempt 1", r2, err)
				}
				h.srv.Advance(73 * time.Hour)
				if viaHook {
					h.deliverAll()
				} else {
					h.exec("UPDATE billonce_claims SET processing_at = processing_at - interval '73 hours'")
					if _, err := h.b.Reconcile(ctx, nil); err != nil {
						t.Logf("Reconcile: %v", err)
					}
				}
				if c := h.claimOf(cus); c.State != claim.StateFailed {
					t.Fatalf("attempt 1 is %s after failing at settlement, want failed", c.State)
				}
				if r, err := h.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
					t.Errorf("Charge after the failed settlement = %+v, %v; want declined", r, err)
				}
				sum, _ := h.b.Run(ctx, period, billing.Customers(cus), nil)
				if sum.Complete() && sum.Declined+sum.DeclinedAfterProcessing == 0 {
					t.Errorf("Run after the failed settlement reports billed: %+v", sum.Progress)
				}
				h.srv.SettleLater(cus, billingtest.Async{})
				if r, err := h.b.Rebill(ctx, cus, period, 2, nil); err != nil || r.Attempt != 2 || r.Outcome == billing.AlreadyBilled {
					t.Fatalf("Rebill(2) after the failed settlement = %+v, %v; want attempt 2 created", r, err)
				}
				h.srv.Advance(time.Minute)
				if r, err := h.b.Rebill(ctx, cus, period, 2, nil); err != nil || r.Attempt != 2 {
					t.Errorf("Rebill(2) again = %+v, %v", r, err)
				}
				if _, err := h.b.Rebill(ctx, cus, period, 3, nil); err != nil {
					t.Errorf("Rebill(3) after a paid attempt 2: %v", err)
				}
				if r, err := h.b.Charge(ctx, cus, period, nil); err != nil || r.Attempt != 2 {
					t.Errorf("Charge after a paid attempt 2 = %+v, %v", r, err)
				}
				billingtest.RequireChargedOnce(t, h.srv, cus, period)
			})
		}
	}
}

// The race of rebill3PastAbandoned2, but the replica running Rebill(3) dies
// right after winning its claim, before it looks at the earlier attempts
// again. The claim waits, pending and unsent, for its lease to end; a
// later Rebill(3) resumes it. Resuming must look again too: attempt 2 has
// no claim, so sending attempt 3 would leave the gap that makes Charge and
// Run report a paying customer declined. Nothing records that the resumed
// claim's key was never sent, so it is kept until Stripe's search can
// prove that no payment carries the key, once the key's window is over;
// then it is abandoned, and the re-bill that follows the decline bills.
func TestRebillResumedAfterCrashChecksPredecessorsAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const cus = "cus_crash5"
	rebill3PastAbandoned2(t, e, cus, true)
	k3, _ := e.b.Key(cus, period, 3)
	if c, err := e.store.Get(ctx, k3.String()); err != nil || c.State != claim.StatePending {
		t.Fatalf("attempt 3's claim after the crash: %+v, %v; want pending", c, err)
	}
	billingtest.RequireNotCharged(t, e.srv, cus, period)
	if _, err := e.pool.Exec(ctx, "UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE key = $1", k3.String()); err != nil {
		t.Fatal(err)
	}
	r3, err := e.b.Rebill(ctx, cus, period, 3, nil)
	t.Logf("Rebill(3) resumed = %+v, %v", r3, err)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Fatalf("Rebill(3) resumed within its key's window: %v; want ErrNeedsReconciliation", err)
	}
	if c, err := e.store.Get(ctx, k3.String()); err != nil || c.State != claim.StatePending {
		t.Fatalf("attempt 3's claim after the resume: %+v, %v; want it kept, pending", c, err)
	}
	billingtest.RequireNotCharged(t, e.srv, cus, period)

	e.srv.Advance(25 * time.Hour)
	e.ageClaim(k3.String(), 25*time.Hour)
	r3, err = e.b.Rebill(ctx, cus, period, 3, nil)
	t.Logf("Rebill(3) resumed a day later = %+v, %v", r3, err)
	requireBilledOnceAfter(t, e, cus, r3, err)
}

// While a re-bill is being sent, the period's outcome is not known: Charge
// says so (ErrInProgress) instead of repeating the earlier decline, and Run
// counts the customer pending, not declined.
func TestChargeWhileRebillInFlightIsInProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const cus = "cus_inflight"
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor(cus)
	release := make(chan struct{})
	e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	done := make(chan error, 1)
	go func() {
		_, err := e.b.Rebill(ctx, cus, period, 2, nil)
		done <- err
	}()
	waitFor(t, func() bool { return e.srv.CountPeriod(cus, period) > 0 }) // the re-bill's charge is stored
	_, err := e.b.Charge(ctx, cus, period, nil)
	if !errors.Is(err, billing.ErrInProgress) {
		t.Errorf("Charge while the re-bill is sent: %v; want ErrInProgress", err)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers(cus), nil)
	if err != nil || sum.Declined != 0 || sum.Pending != 1 {
		t.Errorf("Run while the re-bill is sent: %+v, %v; want 1 pending, 0 declined", sum.Progress, err)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatalf("Rebill(2): %v", err)
	}
	if r, err := e.b.Charge(ctx, cus, period, nil); err != nil || r.Outcome != billing.AlreadyBilled || r.Attempt != 2 {
		t.Errorf("Charge after the re-bill paid: %+v, %v; want AlreadyBilled by attempt 2", r, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// A re-bill left pending with an unknown outcome (its caller gave up while
// Stripe ran it): Charge says which call settles it, and that call does,
// with the same key and no second charge.
func TestChargeAfterRebillLeftUnknownSaysHowToSettle(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const cus = "cus_unknown2"
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor(cus)
	release := make(chan struct{})
	e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	gaveUp, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		_, err := e.b.Rebill(gaveUp, cus, period, 2, nil)
		done <- err
	}()
	waitFor(t, func() bool { return e.srv.CountPeriod(cus, period) > 0 }) // the re-bill's charge is stored
	cancel()
	if err := <-done; !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("Rebill(2) whose caller gave up: %v; want ErrOutcomeUnknown", err)
	}
	close(release)
	_, err := e.b.Charge(ctx, cus, period, nil)
	if !errors.Is(err, billing.ErrInProgress) || !strings.Contains(err.Error(), "Rebill with attempt 2") {
		t.Fatalf("Charge after the re-bill was left unknown: %v; want ErrInProgress naming Rebill with attempt 2", err)
	}
	r, err := e.b.Rebill(ctx, cus, period, 2, nil)
	if err != nil || r.Attempt != 2 {
		t.Fatalf("Rebill(2) again: %+v, %v", r, err)
	}
	if r, err := e.b.Charge(ctx, cus, period, nil); err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("Charge once the re-bill is settled: %+v, %v; want AlreadyBilled", r, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// A re-bill's key was sent and Stripe charged it, but its runner died
// before recording the answer: its claim is pending with an unknown
// outcome. Resuming it, the chain check's lookup of attempt 1 fails for
// a reason that is not "no such claim" (here the caller stopping; a
// dropped connection does the same). That is no gap, and the claim holds
// the only record of a key that may have executed at Stripe: it must stay.
// If it is deleted, Charge reports the paying customer as declined, and
// the re-bill made in answer, once Stripe has forgotten the key, charges
// a second time.
func TestRebillChainLookupErrorKeepsSentClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const cus = "cus_chain6"
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor(cus)
	k2, err := e.b.Key(cus, period, 2)
	if err != nil {
		t.Fatal(err)
	}

	// A runner claims attempt 2, sends its key (Stripe charges) and dies.
	crashing := e.biller(func(c *billing.Config) { c.Claims = crashAfterClaim{wrapStore(e.store)} })
	if _, err := crashing.Rebill(ctx, cus, period, 2, nil); !errors.Is(err, errCrashed) {
		t.Fatalf("crashing re-bill: %v", err)
	}
	e.chargeDirect(cus, k2.String(), amount)
	e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE key = $1", k2.String())

	// The re-bill is resumed; its caller stops right after the claim.
	stopping, cancel := context.WithCancel(ctx)
	defer cancel()
	b := e.biller(func(c *billing.Config) {
		c.Claims = cancelAfterClaim{testStore: wrapStore(e.store), key: k2.String(), cancel: cancel}
	})
	r, err := b.Rebill(stopping, cus, period, 2, nil)
	t.Logf("resumed Rebill(2), stopped after its claim: %+v, %v", r, err)
	c, gerr := e.store.Get(ctx, k2.String())
	if gerr != nil {
		t.Errorf("attempt 2's claim, whose key Stripe charged, is gone: %v", gerr)
	} else {
		t.Logf("attempt 2's claim: %s, owner %q", c.State, c.Owner)
	}

	// A day later: Stripe has forgotten the key.
	e.srv.Advance(25 * time.Hour)
	if gerr == nil {
		e.ageClaim(k2.String(), 25*time.Hour)
	}
	r, err = e.b.Charge(ctx, cus, period, nil)
	t.Logf("Charge a day later: %+v, %v", r, err)
	var ce *billing.ChargeError
	next := 2
	if errors.As(err, &ce) && errors.Is(err, billing.ErrDeclined) {
		next = ce.Attempt + 1
	}
	r, err = e.b.Rebill(ctx, cus, period, next, nil)
	t.Logf("Rebill(%d) a day later: %+v, %v", next, r, err)
	r, err = e.b.Charge(ctx, cus, period, nil)
	if err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("the customer paid, but Charge reports %+v, %v", r, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// Rebill while attempt 1's outcome is unknown is refused (the period's live
// claim holds), and nothing is sent; the charge is then found once.
func TestRebillWhileAttemptOnePendingIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.lostAnswer(e.b, "cus_1")
	before := len(e.srv.Log())
	// Attempt 1's outcome decides whether a re-bill may bill: it waits.
	_, err := e.b.Rebill(ctx, "cus_1", period, 2, nil)
	if !errors.Is(err, billing.ErrInProgress) || posts(e, before) != 0 {
		t.Fatalf("Rebill while attempt 1 is pending = %v, %d POSTs", err, posts(e, before))
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || e.count("cus_1") != 1 {
		t.Fatalf("Charge = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// Attempt 1 was declined; Rebill(2) charged, but its answer was lost, so
// its claim is pending with an unknown outcome. Then attempt 1's failed
// claim is deleted by hand. The claim of attempt 2 is the only record
// that its key may have charged: resuming it finds the gap before it, but
// must neither send nor delete it blind. If it were deleted, a day later
// (Stripe has forgotten both keys) Charge would claim attempt 1 afresh and
// charge the customer a second time.
func TestResumedRebillAfterEarlierClaimDeletedKeepsItsClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		search func(billingtest.Request) billingtest.Fault // Stripe's search once the answer is lost
		want   claim.State                                 // attempt 2's claim at the end
	}{
		{"search down", searchDown, claim.StatePending}, // ErrNeedsReconciliation
		{"search answers", nil, claim.StateSucceeded},   // the search finds the charge
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			ctx := context.Background()
			const cus = "cus_gap"
			e.srv.Decline(cus, "insufficient_funds")
			if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
				t.Fatalf("first charge: %v, want declined", err)
			}
			e.srv.Honor(cus)
			k1, _ := e.b.Key(cus, period, 1)
			k2, _ := e.b.Key(cus, period, 2)

			// Rebill(2) charges; its answer is lost, and the one search
			// after it fails.
			e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultCut})
			e.srv.SetScript(searchDown)
			if _, err := e.b.Rebill(ctx, cus, period, 2, nil); !errors.Is(err, billing.ErrOutcomeUnknown) {
				t.Fatalf("Rebill(2) with a lost answer: %v; want ErrOutcomeUnknown", err)
			}
			billingtest.RequireChargedOnce(t, e.srv, cus, period)
			e.srv.SetScript(tc.search)

			// A person deletes attempt 1's failed claim.
			e.exec("DELETE FROM billonce_claims WHERE key = $1", k1.String())

			sum, err := e.b.Reconcile(ctx, nil)
			t.Logf("Reconcile: %+v, %v", sum, err)
			c, gerr := e.store.Get(ctx, k2.String())
			if gerr != nil {
				t.Errorf("attempt 2's claim, whose key Stripe charged, is gone after Reconcile: %v", gerr)
			} else {
				t.Logf("attempt 2's claim after Reconcile: %s %q", c.State, c.LastError)
			}

			// A day later Stripe has forgotten both keys.
			e.srv.Advance(25 * time.Hour)
			e.ageAll(25 * time.Hour)
			r, err := e.b.Charge(ctx, cus, period, nil)
			t.Logf("Charge a day later: %+v, %v", r, err)
			sum, err = e.b.Reconcile(ctx, nil)
			t.Logf("Reconcile a day later: %+v, %v", sum, err)
			r, err = e.b.Charge(ctx, cus, period, nil)
			t.Logf("Charge again: %+v, %v", r, err)
			if c, err := e.store.Get(ctx, k2.String()); err != nil || c.State != tc.want {
				t.Errorf("attempt 2's claim at the end: %+v, %v; want it %s", c, err, tc.want)
			}
			if tc.want == claim.StatePending && !errors.Is(errors.Join(sum.Failures...), billing.ErrNeedsReconciliation) {
				t.Errorf("Reconcile a day later, search down: %v; want ErrNeedsReconciliation", sum.Failures)
			}
			billingtest.RequireChargedOnce(t, e.srv, cus, period)
		})
	}
}
