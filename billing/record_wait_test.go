package billing_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// lockAfterAnswer is a transport that, once Stripe has answered, locks the
// customer's claim rows in a transaction of its own, as a session that
// holds SELECT … FOR UPDATE open does, before handing the answer on.
type lockAfterAnswer struct {
	e  *env
	mu sync.Mutex
	tx pgx.Tx
}

func (l *lockAfterAnswer) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := testTransport.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tx == nil {
		tx, err := l.e.pool.Begin(context.Background())
		if err != nil {
			l.e.tb.Error(err)
			return resp, nil
		}
		if _, err := tx.Exec(context.Background(), `SELECT 1 FROM billonce_claims FOR UPDATE`); err != nil {
			l.e.tb.Error(err)
		}
		l.tx = tx
	}
	return resp, nil
}

// release ends the locking transaction.
func (l *lockAfterAnswer) release() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tx != nil {
		_ = l.tx.Rollback(context.Background())
	}
}

// waitForLockWaiter returns once a statement waits for a row lock.
func (e *env) waitForLockWaiter(done <-chan struct{}) bool {
	for {
		var n int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'`).Scan(&n); err != nil {
			e.tb.Fatal(err)
		}
		if n > 0 {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// recordWaitFlows are the ways a caller charges: Charge, and a Run with
// and without the batched records of claim.Postgres.
var recordWaitFlows = []struct {
	name    string
	batched bool
	run     func(ctx context.Context, b *billing.Biller) error
}{
	{"charge", false, func(ctx context.Context, b *billing.Biller) error {
		_, err := b.Charge(ctx, "cus_locked", period, nil)
		return err
	}},
	{"batched run", true, runLocked},
	{"run", false, runLocked},
}

func runLocked(ctx context.Context, b *billing.Biller) error {
	s, err := b.Run(ctx, period, billing.Customers("cus_locked"), nil)
	if err == nil && !s.Complete() {
		err = errors.New("run not complete")
	}
	if err != nil && len(s.Failures) == 1 {
		err = errors.Join(err, s.Failures[0])
	}
	return err
}

// giveUpWhileRecordWaits starts flow f, waits until the record of the
// charge Stripe made waits on a claim row another session holds locked,
// gives up (cancels the caller's context), and returns what the call
// returned and how long after it gave up. The row stays locked until the
// test releases it with lk.release: a call that waited for it would never
// return.
func giveUpWhileRecordWaits(tb testing.TB, e *env, flowIndex int) (lk *lockAfterAnswer, after time.Duration, err error) {
	tb.Helper()
	f := recordWaitFlows[flowIndex]
	lk = &lockAfterAnswer{e: e}
	tb.Cleanup(lk.release)
	var store claim.Store = wrapStore(e.store)
	if f.batched {
		store = e.store
	}
	b := e.biller(func(c *billing.Config) {
		c.Claims = store
		c.HTTPClient = &http.Client{Transport: lk}
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- f.run(ctx, b) }()
	stop := make(chan struct{})
	defer close(stop)
	if !e.waitForLockWaiter(stop) {
		tb.Fatal("no statement waited on the locked row")
	}
	cancel()
	cancelled := time.Now()
	err = <-done
	return lk, time.Since(cancelled), err
}

// A caller that gives up while the record of its charge waits on a claim
// row locked by another session gets its answer while the row is still
// locked (how soon is BenchmarkGiveUpWhileRecordWaitsOnLockedRow's): the
// charge exists but is not recorded; the claim stays pending with its key
// (the next run, once the lock is gone, records Stripe's replay) or the
// record lands once the lock is gone. The customer is charged once.
func TestCancelWhileRecordWaitsOnLockedRow(t *testing.T) {
	for i, f := range recordWaitFlows {
		t.Run(f.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			lk, after, err := giveUpWhileRecordWaits(t, e, i)
			t.Logf("returned %v after the caller gave up: %v", after.Round(time.Millisecond), err)
			if !errors.Is(err, billing.ErrNotRecorded) || !errors.Is(err, context.Canceled) {
				t.Fatalf("err = %v; want ErrNotRecorded wrapping context.Canceled", err)
			}
			if got := e.count("cus_locked"); got != 1 {
				t.Fatalf("%d charges at Stripe; want 1", got)
			}
			lk.release()
			// The statement cut short may still run once the lock is
			// gone (the server finishes what it was waiting for): the
			// record lands later, or the claim stays pending.
			if c := e.claimOf("cus_locked"); c.State != claim.StatePending && c.State != claim.StateSucceeded {
				t.Fatalf("claim state %s; want pending or succeeded", c.State)
			}
			// The runner that gave up could not release its lease.
			e.exec(`UPDATE billonce_claims SET lease_until = now() WHERE state = 'pending'`)
			if err := f.run(context.Background(), e.biller()); err != nil {
				t.Fatalf("next run: %v", err)
			}
			billingtest.RequireChargedOnce(t, e.srv, "cus_locked", period)
			if c := e.claimOf("cus_locked"); c.State != claim.StateSucceeded {
				t.Fatalf("claim state %s after the next run; want succeeded", c.State)
			}
		})
	}
}

// BenchmarkGiveUpWhileRecordWaitsOnLockedRow measures how soon a Charge
// or Run returns after its caller gives up while the record of its charge
// waits on a locked claim row: the package's grace for the record (two
// seconds) and what it takes to notice.
//
//	go test -run '^$' -bench BenchmarkGiveUpWhileRecordWaitsOnLockedRow -benchtime 3x ./billing/
func BenchmarkGiveUpWhileRecordWaitsOnLockedRow(b *testing.B) {
	for i, f := range recordWaitFlows {
		b.Run(f.name, func(b *testing.B) {
			var total time.Duration
			for b.Loop() {
				e := newEnv(b)
				lk, after, err := giveUpWhileRecordWaits(b, e, i)
				if !errors.Is(err, billing.ErrNotRecorded) {
					b.Fatalf("err = %v; want ErrNotRecorded", err)
				}
				lk.release()
				total += after
			}
			b.ReportMetric(total.Seconds()/float64(b.N), "s-after-giving-up")
		})
	}
}
