package billing_test

// Attacks through the public API on re-bill numbering, webhook pruning and
// acknowledged events. The oracle is the fake Stripe's ledger.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// pausingStore is a real claim store whose Claim and Abandon of chosen keys
// first run a hook: it stands for a replica that is slow between two
// statements (a GC pause, a slow network), placed exactly.
//
// A Claim of the key dieAfterClaim commits and then answers an error, as if
// its process died right after the statement: the claim is won and
// pending, and nothing was sent.
type pausingStore struct {
	batchingStore
	beforeClaim   map[string]func()
	beforeAbandon map[string]func()
	dieAfterClaim string
}

func (s *pausingStore) Claim(ctx context.Context, req claimengine.Request) (claimResult, error) {
	if f := s.beforeClaim[req.Key]; f != nil {
		f()
	}
	res, err := s.claimEngine.Claim(ctx, req)
	if err == nil && req.Key == s.dieAfterClaim {
		return res, errors.New("the runner died")
	}
	return res, err
}

func (s *pausingStore) Abandon(ctx context.Context, key, owner string) error {
	if f := s.beforeAbandon[key]; f != nil {
		f()
	}
	return s.claimEngine.Abandon(ctx, key, owner)
}

// rebill3PastAbandoned2 declines cus's attempt 1, then runs the race: Rebill(3)
// looks for attempt 2's claim while Rebill(2) is under way, and finds it;
// Rebill(2) is then refused before execution (a revoked key) and abandons
// its claim, which deletes it; Rebill(3) then claims. Attempt 2 has no
// claim: if attempt 3 paid, that is the skipped number the check is there
// to refuse. With die, Rebill(3)'s replica dies right after its claim
// commits.
func rebill3PastAbandoned2(t *testing.T, e *env, cus string, die bool) (billing.Receipt, error) {
	t.Helper()
	ctx := context.Background()
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor(cus)
	k2, _ := e.b.Key(cus, period, 2)
	k3, _ := e.b.Key(cus, period, 3)

	checked := make(chan struct{}) // Rebill(3) has looked at attempt 2
	done2 := make(chan struct{})   // Rebill(2) has returned
	s2 := &pausingStore{batchingStore: wrapBatching(e.store), beforeAbandon: map[string]func(){k2.String(): func() { <-checked }}}
	s3 := &pausingStore{batchingStore: wrapBatching(e.store), beforeClaim: map[string]func(){k3.String(): func() { close(checked); <-done2 }}}
	if die {
		s3.dieAfterClaim = k3.String()
	}
	b2 := e.biller(func(c *billing.Config) { c.Claims = s2 })
	b3 := e.biller(func(c *billing.Config) { c.Claims = s3 })

	e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized})
	go func() {
		defer close(done2)
		_, err := b2.Rebill(ctx, cus, period, 2, nil)
		t.Logf("Rebill(2): %v", err)
	}()
	// Rebill(3) may start only once Rebill(2) holds its claim.
	waitFor(t, func() bool { _, err := e.store.Get(ctx, k2.String()); return err == nil })
	r3, err3 := b3.Rebill(ctx, cus, period, 3, nil)
	<-done2
	t.Logf("Rebill(3) = %+v, %v", r3, err3)
	return r3, err3
}

// requireBilledOnceAfter checks the end of a re-bill race: a Rebill(3) that
// paid nothing was refused as invalid, so Rebill(2) bills; either way
// Charge reports the period billed and the fake holds one charge.
func requireBilledOnceAfter(t *testing.T, e *env, cus string, r3 billing.Receipt, err3 error) {
	t.Helper()
	ctx := context.Background()
	if n := e.srv.CountPeriod(cus, period); n == 0 {
		// Refused: the re-bill that follows the decline is attempt 2 again.
		if !errors.Is(err3, billing.ErrInvalid) {
			t.Fatalf("Rebill(3) paid nothing but reported %+v, %v; want ErrInvalid", r3, err3)
		}
		if _, err := e.b.Rebill(ctx, cus, period, 2, nil); err != nil {
			t.Fatalf("Rebill(2) once the key is fixed: %v", err)
		}
	}
	r, err := e.b.Charge(ctx, cus, period, nil)
	if err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("the customer paid, but Charge reports %+v, %v", r, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// The race of rebill3PastAbandoned2: Charge and Run, walking from attempt
// 1's decline, would stop at attempt 2 and report a paying customer as
// declined.
func TestAttack5RebillRacingAbandonedPredecessor(t *testing.T) {
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
func TestAttack5RebillDuringProcessingThenFailed(t *testing.T) {
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
// Run report a paying customer declined.
func TestAttack5RebillResumedAfterCrashLooksAgain(t *testing.T) {
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
