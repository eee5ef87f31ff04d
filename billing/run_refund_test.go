package billing_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// refundItems is a mass refund: every customer of ids refunded each of
// refunds.
func refundItems(ids []string, refunds ...billing.Refund) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for _, id := range ids {
			for _, r := range refunds {
				if !yield(billing.Item{Customer: id, Refund: &r}, nil) {
					return
				}
			}
		}
	}
}

// paidAll bills every customer of ids for the period, by a Run.
func paidAll(t *testing.T, e *env, ids []string) {
	t.Helper()
	if sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), nil); err != nil || !sum.Complete() || sum.Created != len(ids) {
		t.Fatalf("billing run: %+v, %v", sum.Progress, err)
	}
}

// wantRefundedOnce wants the fake to hold, for every customer of ids,
// exactly one refund of each of refunds, by its id, and no more refunded
// of a payment than the payment.
func wantRefundedOnce(t *testing.T, e *env, ids []string, refunds ...billing.Refund) {
	t.Helper()
	made := map[string][]billingtest.Movement{} // by customer and refund id
	byPayment := map[string]int64{}
	for _, m := range e.srv.Movements("refund") {
		k := m.Customer + " " + m.Metadata["billonce_refund"]
		made[k] = append(made[k], m)
		if m.Status != "failed" && m.Status != "canceled" {
			byPayment[m.Of] += m.Amount
		}
	}
	want := 0
	for _, id := range ids {
		for _, r := range refunds {
			want++
			got := made[id+" "+r.ID]
			if len(got) != 1 || got[0].Amount != r.Amount {
				t.Errorf("%s, refund %s: Stripe holds %+v; want one refund of %d", id, r.ID, got, r.Amount)
			}
		}
	}
	if n := len(e.srv.Movements("refund")); n != want {
		t.Errorf("Stripe holds %d refunds, want %d", n, want)
	}
	for pay, sum := range byPayment {
		if sum > amount {
			t.Errorf("payment %s refunded %d, more than its %d", pay, sum, amount)
		}
	}
}

var (
	outage   = billing.Refund{ID: "outage-2026-11", Amount: 500}
	goodwill = billing.Refund{ID: "goodwill-2026-11", Amount: 300}
)

// A Run of refunds refunds each customer's payment once per refund id,
// however often it runs: two refunds of one payment in one batch are
// claimed apart and both made, and a second Run finds every refund made.
func TestRunRefundsEachPaymentOncePerRefundID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(40)
	paidAll(t, e, ids)
	ctx := context.Background()
	sum, err := e.b.Run(ctx, period, refundItems(ids, outage, goodwill), &billing.RunOptions{BatchSize: 25})
	if err != nil || !sum.Complete() || sum.Created != 2*len(ids) || sum.Done != 2*len(ids) {
		t.Fatalf("refund run: %+v, %v; want %d refunds created", sum.Progress, err, 2*len(ids))
	}
	posts := refundPosts(e)
	again, err := e.biller().Run(ctx, period, refundItems(ids, outage, goodwill), nil)
	if err != nil || !again.Complete() || again.AlreadyBilled != 2*len(ids) || again.Created != 0 {
		t.Fatalf("refund run again: %+v, %v; want every refund found made", again.Progress, err)
	}
	if n := refundPosts(e) - posts; n != 0 {
		t.Errorf("the second run sent %d refund requests, want 0", n)
	}
	wantRefundedOnce(t, e, ids, outage, goodwill)
	if r, err := e.b.Refund(ctx, ids[0], period, outage.ID, outage.Amount); err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("Refund of a refund the Run made: %+v, %v; want AlreadyBilled", r, err)
	}
}

// Two Runs of the same refunds at once, from two Billers, through lost
// answers, stored and unstored 500s and lock timeouts, then a clean Run:
// each (customer, refund id) is refunded once, never past the payment.
func TestRunRefundsConcurrentlyFromTwoBillersRefundOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(60)
	paidAll(t, e, ids)
	e.srv.SetScript(faults(5, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.05, billingtest.FaultErrorBefore: 0.05, billingtest.FaultErrorAfter: 0.03, billingtest.FaultLockTimeout: 0.05}))
	ctx := context.Background()
	runners := []*billing.Biller{e.b, e.biller()}
	sums := make([]billing.Summary, len(runners))
	var wg sync.WaitGroup
	for i, b := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var err error
			sums[i], err = b.Run(ctx, period, refundItems(ids, outage, goodwill), &billing.RunOptions{BatchSize: 16, Concurrency: 4})
			if err != nil {
				t.Errorf("run %d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	t.Logf("concurrent runs: %+v; %+v", sums[0].Progress, sums[1].Progress)
	e.srv.SetScript(nil)
	e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE state = 'pending'")
	sum, err := e.biller().Run(ctx, period, refundItems(ids, outage, goodwill), nil)
	if err != nil || !sum.Complete() {
		t.Fatalf("clean run: %+v, %v %v", sum.Progress, err, sum.Failures)
	}
	if created := sums[0].Created + sums[1].Created + sum.Created; created > 2*len(ids) {
		t.Errorf("the runs counted %d refunds created, want at most %d", created, 2*len(ids))
	}
	wantRefundedOnce(t, e, ids, outage, goodwill)
}

// crashAfterBatch is a claim store whose runner dies as soon as a batch
// of its claims is committed, before anything is sent.
type crashAfterBatch struct{ testStore }

func (s crashAfterBatch) ClaimBatch(ctx context.Context, reqs []claimengine.Request) ([]claimResult, error) {
	if _, err := s.claimEngine.ClaimBatch(ctx, reqs); err != nil {
		return nil, err
	}
	return nil, errCrashed
}

// A runner that died between claiming a batch of refunds and sending them
// leaves the claims pending; the next Run resumes them with their keys
// (looking at the payments' refunds first) and refunds each once.
func TestRunRefundsCrashedBetweenClaimAndSendAreMadeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(12)
	paidAll(t, e, ids)
	ctx := context.Background()
	dead := e.biller(func(c *billing.Config) { c.Claims = crashAfterBatch{wrapStore(e.store)} })
	if _, err := dead.Run(ctx, period, refundItems(ids, outage), nil); !errors.Is(err, errCrashed) {
		t.Fatalf("crashing run: %v, want the crash", err)
	}
	var pending int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM billonce_claims WHERE refund_of IS NOT NULL AND state = 'pending'").Scan(&pending); err != nil {
		t.Fatal(err)
	}
	if pending != len(ids) || refundPosts(e) != 0 {
		t.Fatalf("after the crash: %d refund claims pending, %d refund requests; want %d and 0", pending, refundPosts(e), len(ids))
	}
	e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE state = 'pending'")
	sum, err := e.biller().Run(ctx, period, refundItems(ids, outage), nil)
	if err != nil || !sum.Complete() || sum.Created != len(ids) {
		t.Fatalf("run after the crash: %+v, %v", sum.Progress, err)
	}
	if n := refundPosts(e); n != len(ids) {
		t.Errorf("%d refund requests, want %d: one per refund", n, len(ids))
	}
	wantRefundedOnce(t, e, ids, outage)
}

// Refund items that cannot be refunded (no payment, more than is left,
// an empty or bad refund id, another account, a refund mixed with a
// bill) are refused each on its own, with nothing sent for them, and the
// Run goes on with the others.
func TestRunRefusesBadRefundItemsAndGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(3)
	paidAll(t, e, ids)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	if r, err := e.b.Refund(ctx, ids[2], period, "earlier", 2200); err != nil || r.Outcome != billing.Created {
		t.Fatalf("earlier refund: %+v, %v", r, err)
	}
	posts := refundPosts(e)
	bad := []struct {
		it     billing.Item
		want   string
		static bool // Item.Validate refuses it too, without the claims
	}{
		{billing.Item{Customer: "cus_never", Refund: &outage}, "has no payment to refund", false},
		{billing.Item{Customer: ids[1], Refund: &billing.Refund{ID: "too-much", Amount: amount + 1}}, "usd left", false},
		{billing.Item{Customer: ids[2], Refund: &outage}, "300 usd left", false},
		{billing.Item{Customer: ids[1], Refund: &billing.Refund{Amount: 500}}, "refund ID is empty", true},
		{billing.Item{Customer: ids[1], Refund: &billing.Refund{ID: "a b", Amount: 500}}, "white space", true},
		{billing.Item{Customer: ids[1], Refund: &billing.Refund{ID: "zero"}}, "must be a positive number", true},
		{billing.Item{Customer: ids[1], Account: acct, Refund: &outage}, "a refund goes to its payment's account", false},
		{billing.Item{Customer: ids[1], Refund: &outage, Price: &billing.Price{Amount: 100, Currency: "usd"}}, "has a Refund and a Price", true},
		{billing.Item{Account: acct, Refund: &outage, Transfer: &usd}, "names a Transfer or a Payout and something else", true},
	}
	items := []billing.Item{{Customer: ids[0], Refund: &outage}}
	for _, b := range bad {
		items = append(items, b.it)
		if err := b.it.Validate(billing.Charges); b.static && !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalid", b.it, err)
		}
	}
	for _, it := range []billing.Item{items[0], {Customer: ids[1], Account: acct, Refund: &outage}} {
		if err := it.Validate(billing.Charges); err != nil {
			t.Errorf("Validate(%+v) = %v, want nil", it, err)
		}
	}
	items = append(items, billing.Item{Customer: ids[1], Refund: &outage})
	sum, err := e.b.Run(ctx, period, func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}, &billing.RunOptions{BatchSize: 4})
	if err != nil || sum.Created != 2 || sum.Invalid != len(bad) || sum.Done != len(items) || len(sum.Failures) != len(bad) {
		t.Fatalf("run: %+v, %v; want 2 refunds made and %d items invalid", sum.Progress, err, len(bad))
	}
	for i, b := range bad {
		found := false
		for _, f := range sum.Failures {
			var ce *billing.ChargeError
			if errors.Is(f, billing.ErrInvalid) && errors.As(f, &ce) && strings.Contains(f.Error(), b.want) {
				found = true
			}
		}
		if !found {
			t.Errorf("bad item %d (%+v): no ErrInvalid saying %q among %v", i, b.it, b.want, sum.Failures)
		}
	}
	if n := refundPosts(e) - posts; n != 2 {
		t.Errorf("%d refund requests, want 2: nothing sent for a bad item", n)
	}
	for _, id := range ids[:2] {
		var n int
		for _, m := range e.srv.Movements("refund") {
			if m.Customer == id && m.Metadata["billonce_refund"] == outage.ID && m.Amount == outage.Amount {
				n++
			}
		}
		if n != 1 {
			t.Errorf("%s: %d outage refunds, want 1", id, n)
		}
	}
	var refundClaims int
	if err := e.pool.QueryRow(ctx, "SELECT count(*) FROM billonce_claims WHERE refund_of IS NOT NULL").Scan(&refundClaims); err != nil {
		t.Fatal(err)
	}
	if refundClaims != 3 {
		t.Errorf("%d refund claims, want 3 (the earlier one and the two made): a bad item claims nothing", refundClaims)
	}
}

// A refund item on a connected account refunds its payment there.
func TestRunRefundsOnTheAccountOfThePayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	if r, err := e.b.Charge(ctx, "cus_a", period, &billing.ChargeOptions{Account: acct}); err != nil || r.Outcome != billing.Created {
		t.Fatalf("charge on %s: %+v, %v", acct, r, err)
	}
	for _, it := range []billing.Item{{Customer: "cus_a", Refund: &outage}, {Customer: "cus_a", Account: acct, Refund: &goodwill}} {
		sum, err := e.b.Run(ctx, period, func(yield func(billing.Item, error) bool) { yield(it, nil) }, nil)
		if err != nil || sum.Created != 1 {
			t.Fatalf("run of %+v: %+v, %v %v", it, sum.Progress, err, sum.Failures)
		}
	}
	ms := e.srv.Movements("refund")
	if len(ms) != 2 || ms[0].Account != acct || ms[1].Account != acct {
		t.Fatalf("refunds %+v, want two on %s", ms, acct)
	}
	c, err := e.store.Get(ctx, fmt.Sprint(ms[0].Metadata[billing.MetaKey]))
	if err != nil || c.Account != acct || c.State != claim.StateSucceeded {
		t.Fatalf("refund claim %+v, %v; want succeeded on %s", c, err, acct)
	}
}
