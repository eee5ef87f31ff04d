package riverbilling_test

// Re-bill jobs queued while an earlier attempt of the period is still
// processing or being sent.

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
	"github.com/riverqueue/river/rivertype"
)

// A dunning process declines attempt 1 and queues the re-bill, attempt 2,
// which pays by bank debit: processing. A second re-bill job, attempt 3,
// runs while attempt 2 is processing: Rebill answers AlreadyBilled
// (processing). Attempt 2 then fails when it settles, and the dunning
// process queues attempt 3 again, as the decline says. That job must
// still bill the customer: a job that reported the period billed while it
// was not may not stand in for it.
func TestRebillJobWhileEarlierAttemptProcessing(t *testing.T) {
	t.Parallel()
	const cus = "cus_ach_river5"
	e := newEnv(t, billingtest.Config{})
	ctx := context.Background()
	b := e.biller()
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("attempt 1: %v, want declined", err)
	}
	e.srv.Honor(cus)
	e.srv.SettleLater(cus, billingtest.Async{After: 72 * time.Hour, FailureCode: "insufficient_funds"})
	if r, err := b.Rebill(ctx, cus, period, 2, nil); err != nil || !r.Processing {
		t.Fatalf("attempt 2 = %+v, %v; want processing", r, err)
	}
	c := e.client(e.riverConfig(b, nil))
	e.start(c)
	res, err := c.Insert(ctx, riverbilling.ChargeArgs{Customer: cus, Period: period, Attempt: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := waitJob(t, e, res.Job.ID, func(j *rivertype.JobRow) bool { return j.AttemptedAt != nil && j.State != rivertype.JobStateRunning })
	t.Logf("attempt 3's job while attempt 2 is processing: %s", job.State)

	// Attempt 2 fails when it settles, learnt by Reconcile's poll.
	e.advance(73 * time.Hour)
	if _, err := b.Reconcile(ctx, nil); err != nil {
		t.Logf("Reconcile: %v", err)
	}
	k2, _ := b.Key(cus, period, 2)
	if c2, err := e.store.Get(ctx, k2.String()); err != nil || c2.State != claim.StateFailed {
		t.Fatalf("attempt 2 after settling = %+v, %v; want failed", c2, err)
	}
	e.srv.SettleLater(cus, billingtest.Async{})
	_, err = b.Charge(ctx, cus, period, nil)
	var ce *billing.ChargeError
	switch {
	case errors.As(err, &ce) && errors.Is(err, billing.ErrDeclined) && ce.Attempt == 2:
	case errors.Is(err, billing.ErrInProgress):
		// The waiting job for attempt 3 is already sending it.
	case err == nil:
		// The waiting job for attempt 3 has billed it already (its retry
		// came first on a busy machine): the period's live claim.
		k3, _ := b.Key(cus, period, 3)
		if c3, err := e.store.Get(ctx, k3.String()); err != nil || c3.State != claim.StateSucceeded {
			t.Fatalf("Charge after attempt 2 failed: billed, but attempt 3's claim = %+v, %v; want succeeded", c3, err)
		}
	default:
		t.Fatalf("Charge after attempt 2 failed: %v; want attempt 2 declined, or attempt 3 in progress", err)
	}
	// The dunning process queues the next re-bill, as the decline says.
	res2, err := c.Insert(ctx, riverbilling.ChargeArgs{Customer: cus, Period: period, Attempt: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("queueing attempt 3 again: job %d, skipped as duplicate: %v", res2.Job.ID, res2.UniqueSkippedAsDuplicate)
	waitJob(t, e, res2.Job.ID, func(j *rivertype.JobRow) bool {
		return j.State == rivertype.JobStateCompleted || j.State == rivertype.JobStateCancelled
	})
	e.srv.SettleNow()
	if n := e.count(cus); n != 1 {
		t.Fatalf("customer charged %d times after the re-bill job finished; want 1 (jobs: %v)", n, e.state())
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// A re-bill job for attempt 3 runs while attempt 2 is still being sent
// (held at Stripe); attempt 2 is then declined, the card works again and
// the dunning process queues attempt 3 again, as the decline says. The
// customer must be billed by attempt 3.
func TestRebillJobWhileEarlierAttemptSending(t *testing.T) {
	t.Parallel()
	const cus = "cus_held_river5"
	e := newEnv(t, billingtest.Config{})
	ctx := context.Background()
	// A short lease: the job waits for attempt 2's lease to end.
	short, err := claim.NewPostgres(e.pool, claim.Config{Lease: 3 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	b := e.biller(func(c *billing.Config) { c.Claims = short })
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("attempt 1: %v, want declined", err)
	}
	release := make(chan struct{})
	e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	done := make(chan error, 1)
	go func() {
		_, err := b.Rebill(ctx, cus, period, 2, nil)
		done <- err
	}()
	k2, _ := b.Key(cus, period, 2)
	for ; ; time.Sleep(5 * time.Millisecond) { // until attempt 2 is claimed
		if _, err := e.store.Get(ctx, k2.String()); err == nil {
			break
		}
	}
	c := e.client(e.riverConfig(b, nil))
	e.start(c)
	res, err := c.Insert(ctx, riverbilling.ChargeArgs{Customer: cus, Period: period, Attempt: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	job := waitJob(t, e, res.Job.ID, func(j *rivertype.JobRow) bool { return j.AttemptedAt != nil && j.State != rivertype.JobStateRunning })
	t.Logf("attempt 3's job while attempt 2 is being sent: %s", job.State)
	close(release)
	if err := <-done; !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("attempt 2: %v, want declined", err)
	}
	// The card works again; the dunning process queues attempt 3, as
	// attempt 2's decline says.
	e.srv.Honor(cus)
	res2, err := c.Insert(ctx, riverbilling.ChargeArgs{Customer: cus, Period: period, Attempt: 3}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("queueing attempt 3 again: job %d, skipped as duplicate: %v", res2.Job.ID, res2.UniqueSkippedAsDuplicate)
	waitJob(t, e, res2.Job.ID, func(j *rivertype.JobRow) bool {
		return j.State == rivertype.JobStateCompleted || j.State == rivertype.JobStateCancelled
	})
	t.Logf("jobs: %v", e.state())
	var errs string
	e.pool.QueryRow(ctx, "SELECT errors::text FROM river_job WHERE id = $1", res.Job.ID).Scan(&errs)
	t.Logf("job errors: %s", errs)
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}
