package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/lock"
)

// Reconcile settles what crashed runners left pending, whether or not their
// charge reached Stripe, one charge each; a live claim is left alone.
func TestReconcileSettlesCrashedClaims(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	sent, unsent := customers(6)[:3], customers(6)[3:]
	ids := make(map[string]string) // customer → charge made before the crash
	for _, c := range sent {
		ids[c] = e.chargeDirect(c, e.crashedClaim(c, amount), amount).ID
	}
	for _, c := range unsent {
		e.crashedClaim(c, amount)
	}
	if _, err := e.b.Charge(ctx, "cus_done", period, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := engineOf(e.store).Claim(ctx, claimengine.Request{Customer: "cus_live", Period: period, Key: e.key("cus_live"),
		Amount: amount, Currency: "usd", Owner: "live-runner"}); err != nil {
		t.Fatal(err)
	}

	var progress []billing.Progress
	sum, err := e.b.Reconcile(ctx, &billing.ReconcileOptions{Progress: func(p billing.Progress) { progress = append(progress, p) }})
	if err != nil {
		t.Fatal(err)
	}
	if sum.Total != 6 || sum.Done != 6 || sum.Created != 6 || !sum.Complete() || len(progress) != 6 {
		t.Fatalf("summary %+v, %d progress reports; want the 6 stale claims settled", sum.Progress, len(progress))
	}
	wantAllOnceOf(t, e, append(append([]string{"cus_done"}, sent...), unsent...))
	for c, id := range ids {
		if cl := e.claimOf(c); cl.State != claim.StateSucceeded || cl.StripeID != id {
			t.Fatalf("claim of %s: %+v; want the charge made before the crash, %s", c, cl, id)
		}
	}
	wantCount(t, e, "cus_live", 0)
	if cl := e.claimOf("cus_live"); cl.State != claim.StatePending || cl.Owner != "live-runner" {
		t.Fatalf("live claim %+v was touched", cl)
	}
	// Nothing left to do.
	if sum, err := e.b.Reconcile(ctx, nil); err != nil || sum.Total != 0 {
		t.Fatalf("second Reconcile: %+v, %v", sum.Progress, err)
	}
}

// Past the window margin, Reconcile looks charges up in Stripe before
// sending: found ones are recorded, missing ones are sent once.
func TestReconcileAfterKeyWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	found, missing := customers(4)[:2], customers(4)[2:]
	for _, c := range found {
		key := e.crashedClaim(c, amount)
		e.chargeDirect(c, key, amount)
		e.ageClaim(key, 25*time.Hour)
	}
	for _, c := range missing {
		e.ageClaim(e.crashedClaim(c, amount), 25*time.Hour)
	}
	e.srv.Advance(25 * time.Hour)
	sum, err := e.b.Reconcile(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.AlreadyBilled != 2 || sum.Created != 2 || !sum.Complete() {
		t.Fatalf("summary %+v; want 2 reconciled from search and 2 sent", sum.Progress)
	}
	wantAllOnceOf(t, e, append(found, missing...))
	if st := e.srv.Stats(); st.Created != 4 {
		t.Fatalf("Stripe created %d objects; want the 2 from before the window and 2 new", st.Created)
	}
}

// With a lock.Locker, Reconcile is turned away while another runner holds
// its lock, before it lists or sends anything; once the lock is free it
// settles the pending claim, and the fake counts one charge.
func TestReconcileLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.crashedClaim("cus_r", amount)

	guard, err := lock.NewAdvisory(e.pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	held, err := guard.Lock(ctx, "billonce-reconcile:"+billing.DefaultScope)
	if err != nil {
		t.Fatal(err)
	}
	before := e.srv.Stats().Requests
	sum, err := e.b.Reconcile(ctx, &billing.ReconcileOptions{Lock: guard})
	if !errors.Is(err, billing.ErrRunHeldElsewhere) || sum.Done != 0 || e.srv.Stats().Requests != before {
		t.Fatalf("Reconcile while the lock is held: %+v, %v; want ErrRunHeldElsewhere and no request", sum.Progress, err)
	}
	if err := held.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	sum, err = e.b.Reconcile(ctx, &billing.ReconcileOptions{Lock: guard})
	if err != nil || sum.Done != 1 || !sum.Complete() {
		t.Fatalf("Reconcile after the lock was released: %+v, %v", sum.Progress, err)
	}
	wantAllOnce(t, e.srv, []string{"cus_r"})
}

// A decline whose answer was lost is found by search past the deadline:
// the claim fails, nothing is re-billed on its own, an explicit Rebill
// charges once, and later Charges report the re-bill.
func TestLostDeclineFoundBySearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.srv.Decline("cus_1", "insufficient_funds")
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(searchDown)
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("charge with a lost answer succeeded")
	}
	e.srv.SetScript(nil)
	e.srv.Honor("cus_1")
	e.advance(25 * time.Hour)
	before := len(e.srv.Log())
	_, err := e.b.Charge(ctx, "cus_1", period, nil)
	var failed *billing.ChargeError
	if !(errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined)) || posts(e, before) != 0 {
		t.Fatalf("Charge past the deadline = %v (%d POSTs), want ErrDeclined and nothing sent", err, posts(e, before))
	}
	if _, err := e.b.Rebill(ctx, "cus_1", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Attempt != 2 || e.count("cus_1") != 1 {
		t.Fatalf("Charge after the re-bill = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// A decline answered with a stored 500 (outcome unknown) is found by the
// in-window search and fails the claim; it is not retried.
func TestDeclineBehindStored500FoundBySearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.Decline("cus_1", "")
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	var failed *billing.ChargeError
	if !(errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined)) || len(e.srv.Payments()) != 1 {
		t.Fatalf("Charge = %v; %d payments", err, len(e.srv.Payments()))
	}
}

// Several payments for one key (Stripe forgot the key once): search finds
// both, nothing more is sent, and the caller is told to reconcile.
func TestSearchFindingSeveralPaymentsForOneKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := e.crashedClaim("cus_1", amount)
	e.chargeDirect("cus_1", key, amount)
	e.advance(25 * time.Hour)
	e.chargeDirect("cus_1", key, amount)
	before := len(e.srv.Log())
	_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	var needs *billing.ChargeError
	if !(errors.As(err, &needs) && errors.Is(err, billing.ErrNeedsReconciliation)) || posts(e, before) != 0 || e.count("cus_1") != 2 {
		t.Fatalf("Charge = %v; %d POSTs, %d charges", err, posts(e, before), e.count("cus_1"))
	}
}
