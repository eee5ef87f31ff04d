package billing_test

import (
	"context"
	"errors"
	"iter"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/lock"
)

// A Run under a lock.Lease whose holder stalled past the lease's TTL (a
// paused process; here an iterator that blocks while the test expires the
// lease) finds, once it goes on, that another Run has taken the lease: its
// next claim is refused with the lock's fencing token, before anything is
// sent for it, and the run stops with lock.ErrLockLost. The charge it had
// sent before the takeover is still recorded when Stripe answers after
// it. The other Run bills every customer, each once.
func TestRunStaleLeaseClaimsNothingMore(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	lease, err := lock.NewLease(e.pool, lock.LeaseConfig{TTL: time.Hour}) // no renewal during the test
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	ids := customers(6)
	// The items of a run, which stop after the first n customers until
	// go is closed, once paused is closed.
	stalling := func(n int, paused, goOn chan struct{}) iter.Seq2[billing.Item, error] {
		return func(yield func(billing.Item, error) bool) {
			for i, id := range ids {
				if i == n {
					close(paused)
					<-goOn
				}
				if !yield(billing.Item{Customer: id}, nil) {
					return
				}
			}
		}
	}
	type result struct {
		sum billing.Summary
		err error
	}
	opts := &billing.RunOptions{Lock: lease, BatchSize: 1, Concurrency: 1}
	// The first customer's charge is in flight at Stripe during the
	// takeover.
	sent, answer := make(chan struct{}), make(chan struct{})
	var once sync.Once
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.Customer == ids[0] && r.Attempt == 1 {
			once.Do(func() { close(sent) })
			return billingtest.Fault{Kind: billingtest.FaultSlow, Release: answer}
		}
		return billingtest.Fault{}
	})

	stalledA, goA := make(chan struct{}), make(chan struct{})
	first := make(chan result, 1)
	go func() {
		s, err := e.b.Run(context.Background(), period, stalling(2, stalledA, goA), opts)
		first <- result{s, err}
	}()
	<-stalledA
	<-sent
	// The first run stalls past its TTL: its lease expires, and another
	// run takes it.
	e.exec(`UPDATE ` + lock.DefaultLeaseTable + ` SET lock_until = now() - interval '1 second'`)
	stalledB, goB := make(chan struct{}), make(chan struct{})
	second := make(chan result, 1)
	go func() {
		s, err := e.biller().Run(context.Background(), period, stalling(0, stalledB, goB), opts)
		second <- result{s, err}
	}()
	select {
	case <-stalledB: // the second run holds the lease
	case r := <-second:
		t.Fatalf("second Run: %+v, %v; want it to take the expired lease", r.sum.Progress, r.err)
	}

	// Stripe answers the charge sent before the takeover: it is recorded.
	close(answer)
	waitFor(t, func() bool { return e.claimOf(ids[0]).State == claim.StateSucceeded })
	if c, pays := e.claimOf(ids[0]), e.srv.Payments(); len(pays) != 1 || c.StripeID != pays[0].ID {
		t.Fatalf("claim of %s: %+v; want it to record the one payment, %+v", ids[0], c, pays)
	}

	close(goA)
	a := <-first
	t.Logf("stale run: %+v: %v", a.sum.Progress, a.err)
	if !errors.Is(a.err, lock.ErrLockLost) {
		t.Fatalf("stale run returned %v; want an error wrapping lock.ErrLockLost", a.err)
	}
	for _, c := range ids[2:] {
		if n := e.srv.CountPeriod(c, period); n != 0 {
			t.Errorf("the stale run charged %s %d times after another run took its lease; want 0", c, n)
		}
	}
	if n := e.claimRows(); n > 2 {
		t.Errorf("%d claims after the stale run; want at most the 2 it made before its lease was taken", n)
	}

	close(goB)
	b := <-second
	if b.err != nil || !b.sum.Complete() {
		t.Fatalf("second Run: %+v, %v", b.sum.Progress, b.err)
	}
	wantAllOnce(t, e.srv, ids)
}
