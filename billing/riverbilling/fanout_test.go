package riverbilling_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// The periodic fan-out inserts a job per 50 customers; the jobs bill
// everyone once, and the declined customer gets a job of its own, which
// is cancelled. A fan-out once those jobs have completed inserts them
// again, and so does one after River has cleaned every job away: the
// claims make them complete without a request to Stripe, and the decline's
// job is cancelled again.
func TestFanOutTwiceChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_00007": "insufficient_funds"}})
	ids := customers(300)
	cfg := e.riverConfig(e.biller(), ids)
	cfg.PeriodicJobs = []*river.PeriodicJob{riverbilling.PeriodicFanOut(river.PeriodicInterval(time.Hour),
		func(time.Time) string { return period }, &river.PeriodicJobOpts{RunOnStart: true})}
	c := e.client(cfg)
	e.start(c)
	st := e.waitSettled(len(ids))
	if st.Jobs[rivertype.JobStateCompleted] != len(ids)/50 || st.Jobs[rivertype.JobStateCancelled] != 1 {
		t.Fatalf("after the periodic fan-out: %v; want %d completed, 1 cancelled (the decline's own job)", st, len(ids)/50)
	}
	var declined string
	if err := e.pool.QueryRow(context.Background(), `SELECT args->>'customer' FROM river_job WHERE state = 'cancelled'`).Scan(&declined); err != nil || declined != "cus_00007" {
		t.Errorf("the cancelled job is for %q (%v), want cus_00007", declined, err)
	}

	ctx := context.Background()
	creates := len(e.srv.Log())
	again := func(when string) {
		t.Helper()
		res, err := riverbilling.FanOut(ctx, c, e.pool, period, billing.Customers(ids...), 50)
		if err != nil {
			t.Fatal(err)
		}
		if res.Inserted != len(ids) || res.Duplicates != 0 {
			t.Errorf("fan-out %s = %+v; want %d inserted", when, res, len(ids))
		}
		e.waitSettled(len(ids))
	}
	again("once the jobs have completed")
	// River's job cleaner deletes completed and cancelled jobs after a day.
	e.exec(`DELETE FROM river_job WHERE kind = $1`, riverbilling.ChargeArgs{}.Kind())
	again("after cleaning")
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
	if st := e.state(); st.Jobs[rivertype.JobStateCancelled] != 1 {
		t.Errorf("after cleaning: %v; want the decline's job cancelled again", st)
	}
}

// FanOut reads the iterator batch by batch, skips duplicates and unusable
// items (a priced item, a refund item), and stops on the iterator's error after committing what it read.
func TestFanOutInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	ctx := context.Background()
	boom := errors.New("customer source down")
	items := func(yield func(billing.Item, error) bool) {
		for _, it := range []billing.Item{{Customer: "cus_1"}, {Customer: "cus_1"}, {Customer: ""},
			{Customer: "cus_2", Price: &billing.Price{Amount: 1, Currency: "usd"}},
			{Customer: "cus_4", Refund: &billing.Refund{ID: "rma-1", Amount: 100}}, {Customer: "cus_3"}} {
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
	if res.Customers != 6 || res.Inserted != 2 || res.Duplicates != 1 || res.Invalid != 3 || len(res.Errors) != 3 {
		t.Errorf("FanOut = %+v; want 6 read, 2 inserted, 1 duplicate, 3 invalid (a refund item is no charge job)", res)
	}
	var jobs []string
	rows, err := e.pool.Query(ctx, `SELECT args::text FROM river_job ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var a string
		if err := rows.Scan(&a); err != nil {
			t.Fatal(err)
		}
		jobs = append(jobs, a)
	}
	if len(jobs) != 1 || !strings.Contains(jobs[0], `"customers": ["cus_1", "cus_3"]`) {
		t.Errorf("jobs in River: %q; want one job of cus_1 and cus_3", jobs)
	}
	// While that job waits, the same fan-out inserts nothing.
	res, _ = riverbilling.FanOut(ctx, c, e.pool, period, iter.Seq2[billing.Item, error](items), 2)
	if res.Inserted != 0 || res.Duplicates != 3 {
		t.Errorf("FanOut again = %+v; want nothing inserted, 3 duplicates", res)
	}
	for _, bad := range []struct {
		period string
		batch  int
	}{{"2026-13", 0}, {period, -1}, {period, 1001}} {
		if _, err := riverbilling.FanOut(ctx, c, e.pool, bad.period, billing.Customers("cus_9"), bad.batch); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("FanOut(%q, batch %d) = %v, want ErrInvalid", bad.period, bad.batch, err)
		}
	}
}

// FanOut puts the customers billed by charge in jobs of batchSize, the
// last one of the period with what is left (one customer alone is a job
// of one), and each customer billed by invoice in a job of its own.
func TestFanOutMakesJobsOfBatchSize(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	items := func(yield func(billing.Item, error) bool) {
		for i, id := range customers(201) {
			if !yield(billing.Item{Customer: id}, nil) {
				return
			}
			if i == 150 && !yield(billing.Item{Customer: "cus_inv1", Invoice: &billing.Invoice{}}, nil) {
				return
			}
		}
		yield(billing.Item{Customer: "cus_inv2", Invoice: &billing.Invoice{}}, nil)
	}
	res, err := riverbilling.FanOut(context.Background(), c, e.pool, period, items, 100)
	if err != nil || res.Customers != 203 || res.Inserted != 203 {
		t.Fatalf("FanOut = %+v, %v; want 203 customers inserted", res, err)
	}
	rows, err := e.pool.Query(context.Background(), `SELECT coalesce(jsonb_array_length(args->'customers'), 0), args->>'customer', (args->>'invoice')::bool
		FROM river_job ORDER BY id`)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for rows.Next() {
		var (
			n       int
			one     *string
			invoice *bool
		)
		if err := rows.Scan(&n, &one, &invoice); err != nil {
			t.Fatal(err)
		}
		switch {
		case n > 0:
			got = append(got, fmt.Sprintf("%d customers", n))
		case invoice != nil && *invoice:
			got = append(got, "invoice "+*one)
		default:
			got = append(got, "charge "+*one)
		}
	}
	want := []string{"100 customers", "invoice cus_inv1", "100 customers", "invoice cus_inv2", "charge cus_00200"}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("jobs = %q, want %q", got, want)
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
