package riverbilling_test

import (
	"context"
	"errors"
	"iter"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// The periodic fan-out inserts one job per customer; the jobs bill
// everyone once. A second fan-out inserts nothing. Once River has cleaned
// the completed jobs away a fan-out inserts them all again, and the claims
// make those jobs complete without a request to Stripe.
func TestFanOutTwiceChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_00007": "insufficient_funds"}})
	ids := customers(300)
	cfg := e.riverConfig(e.biller(), ids)
	cfg.PeriodicJobs = []*river.PeriodicJob{riverbilling.PeriodicFanOut(river.PeriodicInterval(time.Hour),
		func(time.Time) string { return period }, &river.PeriodicJobOpts{RunOnStart: true})}
	c := e.client(cfg)
	e.start(c)
	st := e.waitFinished(len(ids))
	if st.Jobs[rivertype.JobStateCompleted] != len(ids)-1 || st.Jobs[rivertype.JobStateCancelled] != 1 {
		t.Fatalf("after the periodic fan-out: %v; want %d completed, 1 cancelled (the decline)", st, len(ids)-1)
	}

	ctx := context.Background()
	res, err := riverbilling.FanOut(ctx, c, e.pool, period, billing.Customers(ids...), 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Inserted != 0 || res.Duplicates != len(ids) {
		t.Errorf("second fan-out = %+v; want nothing inserted, %d duplicates", res, len(ids))
	}

	// River's job cleaner deletes completed and cancelled jobs after a day.
	e.exec(`DELETE FROM river_job WHERE kind = $1`, riverbilling.ChargeArgs{}.Kind())
	creates := len(e.srv.Log())
	res, err = riverbilling.FanOut(ctx, c, e.pool, period, billing.Customers(ids...), 100)
	if err != nil {
		t.Fatal(err)
	}
	if res.Inserted != len(ids) || res.Duplicates != 0 {
		t.Errorf("fan-out after cleaning = %+v; want %d inserted", res, len(ids))
	}
	st = e.waitFinished(len(ids))
	for _, id := range ids {
		want := 1
		if id == "cus_00007" {
			want = 0
		}
		if n := e.count(id); n != want {
			t.Errorf("%s charged %d times, want %d", id, n, want)
		}
	}
	if n := len(e.srv.Log()) - creates; n != 0 {
		t.Errorf("%d requests to Stripe after the re-inserted jobs, want 0", n)
	}
	t.Log(st)
}

// FanOut reads the iterator batch by batch, skips duplicates and unusable
// items, and stops on the iterator's error after committing what it read.
func TestFanOutInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	ctx := context.Background()
	boom := errors.New("customer source down")
	items := func(yield func(billing.Item, error) bool) {
		for _, it := range []billing.Item{{Customer: "cus_1"}, {Customer: "cus_1"}, {Customer: ""},
			{Customer: "cus_2", Price: &billing.Price{Amount: 1, Currency: "usd"}}, {Customer: "cus_3"}} {
			if !yield(it, nil) {
				return
			}
		}
		yield(billing.Item{}, boom)
	}
	res, err := riverbilling.FanOut(ctx, c, e.pool, period, iter.Seq2[billing.Item, error](items), 2)
	if !errors.Is(err, boom) {
		t.Errorf("FanOut error = %v, want the iterator's", err)
	}
	if res.Customers != 5 || res.Inserted != 2 || res.Duplicates != 1 || res.Invalid != 2 || len(res.Errors) != 2 {
		t.Errorf("FanOut = %+v; want 5 read, 2 inserted, 1 duplicate, 2 invalid", res)
	}
	if n := sum(e.state().Jobs); n != 2 {
		t.Errorf("%d jobs in River, want 2", n)
	}
	for _, bad := range []struct {
		period string
		batch  int
	}{{"2026-13", 0}, {period, -1}, {period, 10_001}} {
		if _, err := riverbilling.FanOut(ctx, c, e.pool, bad.period, billing.Customers("cus_9"), bad.batch); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("FanOut(%q, batch %d) = %v, want ErrInvalid", bad.period, bad.batch, err)
		}
	}
}

// A job discarded after its last retry leaves its claim pending; a fan-out
// inserts a new job for it (discarded jobs do not block), which resumes the
// claim with the same key: Stripe replays the first charge.
func TestFanOutReinsertsDiscardedJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	res, err := c.Insert(context.Background(), riverbilling.ChargeArgs{Customer: "cus_1", Period: period}, &river.InsertOpts{MaxAttempts: 1})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	wr := e.workJob(e.worker(e.biller(oneAttempt)), res.Job)
	e.srv.SetScript(nil)
	if wr.Job.State != rivertype.JobStateDiscarded {
		t.Fatalf("after its only attempt the job is %s, want discarded", wr.Job.State)
	}
	if st := e.state(); st.Claims["pending"] != 1 {
		t.Fatalf("state = %v, want the claim pending", st)
	}
	e.advance(5 * time.Minute) // the first run's lease is over

	fo, err := riverbilling.FanOut(context.Background(), c, e.pool, period, billing.Customers("cus_1"), 0)
	if err != nil || fo.Inserted != 1 {
		t.Fatalf("fan-out = %+v, %v; want the discarded job inserted again", fo, err)
	}
	e.start(c)
	st := e.waitFinished(2)
	if n := e.count("cus_1"); n != 1 || st.Claims["succeeded"] != 1 {
		t.Errorf("cus_1 charged %d times, state %v; want 1 charge, the claim succeeded", n, st)
	}
}
