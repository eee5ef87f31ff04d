package riverbilling_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// oneJobs reads the period's jobs of one customer: for each customer, its
// state and how long until it is due.
func (e *env) oneJobs() map[string]struct {
	state rivertype.JobState
	due   time.Duration
} {
	e.tb.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT args->>'customer', state::text,
		(extract(epoch FROM scheduled_at - now()) * 1000000)::bigint FROM river_job WHERE args->>'customer' <> ''`)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer rows.Close()
	jobs := map[string]struct {
		state rivertype.JobState
		due   time.Duration
	}{}
	for rows.Next() {
		var (
			customer, state string
			due             int64
		)
		if err := rows.Scan(&customer, &state, &due); err != nil {
			e.tb.Fatal(err)
		}
		jobs[customer] = struct {
			state rivertype.JobState
			due   time.Duration
		}{rivertype.JobState(state), time.Duration(due) * time.Microsecond}
	}
	if err := rows.Err(); err != nil {
		e.tb.Fatal(err)
	}
	return jobs
}

// A job of several customers bills them in one Run, each once, and
// completes. Every customer that Run does not bill gets a job of its own,
// as a job of one would have been told: the declined one at once, the one
// another runner holds when that runner's lease ends, the one whose answer
// was lost after the first retry's wait. Those jobs finish the period: the
// decline's is cancelled with the reason and sends nothing, the others
// resume their claims with the same keys. Each customer charged once.
func TestJobOfSeveralHandsOnWhatItDoesNotBill(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	c := e.client(e.riverConfig(e.biller(), nil))
	// Another runner's charge: Stripe committed it, and that runner is
	// still at it (its claim's lease runs for two more minutes).
	e.lostAnswer(e.biller(oneAttempt), "cus_held")
	e.exec(`UPDATE billonce_claims SET lease_until = now() + interval '2 minutes' WHERE customer = 'cus_held'`)
	ids := []string{"cus_a", "cus_b", "cus_d", "cus_held", "cus_lost"}
	job := e.insert(c, riverbilling.ChargeArgs{Customers: ids, Period: period})

	e.srv.FailNext(billingtest.Match{Customer: "cus_lost"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	res := e.workJob(e.worker(e.biller(oneAttempt)), job)
	e.srv.SetScript(nil)
	if res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("the job of several: %s %v, want completed", res.EventKind, res.Job.Errors)
	}
	for _, id := range []string{"cus_a", "cus_b"} {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
	jobs := e.oneJobs()
	t.Logf("jobs of one: %v", jobs)
	if len(jobs) != 3 {
		t.Fatalf("jobs of one customer: %v; want cus_d, cus_held and cus_lost only", jobs)
	}
	if j := jobs["cus_d"]; j.state != rivertype.JobStateAvailable {
		t.Errorf("the decline's job is %s, want available at once", j.state)
	}
	if j := jobs["cus_held"]; j.state != rivertype.JobStateScheduled || j.due < time.Minute {
		t.Errorf("the held customer's job is %s, due in %v; want scheduled for the other runner's lease (2 min)", j.state, j.due)
	}
	if j := jobs["cus_lost"]; j.due > time.Second {
		t.Errorf("the lost answer's job is due in %v, want the first retry's wait (10 ms)", j.due)
	}

	e.advance(5 * time.Minute) // the other runner's lease is over
	e.exec(`UPDATE river_job SET scheduled_at = now() WHERE state = 'scheduled'`)
	e.start(c)
	st := e.waitSettled(len(ids))
	if st.Claims["succeeded"] != 4 || st.Claims["failed"] != 1 || st.Jobs[rivertype.JobStateCancelled] != 1 {
		t.Errorf("state = %v; want 4 claims succeeded, 1 failed, the decline's job cancelled", st)
	}
	for _, id := range []string{"cus_a", "cus_b", "cus_held", "cus_lost"} {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
	if n, r := e.count("cus_d"), e.creates("cus_d"); n != 0 || r != 1 {
		t.Errorf("cus_d: %d charges, %d create requests; want 0 and 1", n, r)
	}
	var errs string
	if err := e.pool.QueryRow(context.Background(), `SELECT errors::text FROM river_job WHERE state = 'cancelled'`).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs, "insufficient_funds") {
		t.Errorf("the cancelled job's errors = %.300s, want the decline's reason", errs)
	}
}

// The same job of several customers run twice at once (the rescuer re-ran
// a job that was only slow): each customer charged once. The second run
// finds the customers the first has billed already billed, and hands on
// the ones it is still sending; their jobs complete without a request to
// Stripe.
func TestJobOfSeveralTwiceAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.FailNext(billingtest.Match{Customer: "cus_00002"}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: 500 * time.Millisecond})
	b := e.biller()
	w := e.worker(b)
	c := e.client(e.riverConfig(b, nil))
	ids := customers(5)
	key, err := b.Key(ids[0], period, 1)
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[riverbilling.ChargeArgs]{
		JobRow: &rivertype.JobRow{ID: 1, Attempt: 1, Queue: riverbilling.DefaultQueue},
		Args:   riverbilling.ChargeArgs{Customers: ids, Period: period},
	}
	ctx := rivertest.WorkContext(context.Background(), c)
	var (
		wg   sync.WaitGroup
		errs [2]error
	)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 1 {
				// Start once the first run holds the claims.
				for ; ; time.Sleep(5 * time.Millisecond) {
					if _, err := e.store.Get(context.Background(), key.String()); err == nil {
						break
					}
				}
			}
			errs[i] = w.Work(ctx, job)
		}()
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil {
		t.Fatalf("runs = %v, %v; want both to complete", errs[0], errs[1])
	}
	if len(e.oneJobs()) == 0 {
		t.Errorf("no job handed on by the second run; want one for each customer the first was sending")
	}
	e.exec(`UPDATE river_job SET scheduled_at = now() WHERE state = 'scheduled'`)
	e.start(c)
	e.waitSettled(len(ids))
	for _, id := range ids {
		if n, r := e.count(id), e.creates(id); n != 1 || r != 1 {
			t.Errorf("%s: %d charges, %d create requests; want 1 and 1", id, n, r)
		}
	}
}

// A worker killed in the middle of a job of several customers, after
// Stripe committed one of its charges: River's rescuer retries the job,
// whose Run resumes that claim with the same key (Stripe replays the
// charge) and bills the others. Each customer charged once.
func TestJobOfSeveralRescuedAfterWorkerKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	ids := customers(4)
	job := e.insert(c, riverbilling.ChargeArgs{Customers: ids, Period: period})
	e.lostAnswer(e.biller(oneAttempt), ids[0])
	e.exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '2 hours',
		attempted_by = '{dead-worker}' WHERE id = $1`, job.ID)
	e.advance(5 * time.Minute) // the dead worker's claim lease runs out

	e.start(c)
	st := e.waitSettled(len(ids))
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
	if r := e.creates(ids[0]); r != 2 {
		t.Errorf("%s: %d create requests, want 2 (the lost answer, then its replay)", ids[0], r)
	}
	got, err := c.JobGet(context.Background(), job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != rivertype.JobStateCompleted || got.Attempt != 2 || st.Claims["succeeded"] != len(ids) {
		t.Errorf("job %s after %d attempts, state %v; want completed after 2, every claim succeeded", got.State, got.Attempt, st)
	}
}

// A job of several customers cut short by its timeout (shorter than one
// customer's answer) fails, to be retried; the retry, on a worker with
// the default timeout, completes: it bills the customers the first run did
// not, and resumes with its key the one the timeout cut (or hands it on).
// Each customer charged once.
func TestJobOfSeveralCutShortIsRetried(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	b := e.biller()
	w, err := riverbilling.NewWorker(b, riverbilling.WorkerConfig{JobTimeout: 300 * time.Millisecond,
		RetryInterval: 10 * time.Millisecond, MaxRetryInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	c := e.client(e.riverConfig(b, nil))
	ids := customers(3)
	e.srv.FailNext(billingtest.Match{Customer: ids[2]}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: time.Second})
	e.searchDown()
	res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customers: ids, Period: period}))
	e.srv.SetScript(nil)
	if res.EventKind != river.EventKindJobFailed {
		t.Fatalf("the run cut short: %s, want failed, to be retried", res.EventKind)
	}
	e.advance(5 * time.Minute) // the first run's lease is over
	if res = e.workJob(e.worker(b), res.Job); res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("the retry: %s %v, want completed", res.EventKind, res.Job.Errors)
	}
	// A customer whose cut request Stripe still holds when the retry
	// sends its key again (409, in flight) is handed on to a job of its
	// own: let those run too.
	e.exec(`UPDATE river_job SET scheduled_at = now() WHERE state = 'scheduled'`)
	e.start(c)
	e.waitSettled(len(ids))
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
}

// A job of several customers with arguments it cannot bill is cancelled
// with the reason before anything is claimed or sent.
func TestJobOfSeveralRefusesWhatItCannotBill(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	w := e.worker(e.biller())
	c := e.client(e.riverConfig(e.biller(), nil))
	two := []string{"cus_1", "cus_2"}
	for _, tt := range []struct {
		name string
		args riverbilling.ChargeArgs
		want string
	}{
		{"a customer as well", riverbilling.ChargeArgs{Customer: "cus_3", Customers: two, Period: period}, "takes no Customer, Invoice or Attempt above 1"},
		{"an invoice", riverbilling.ChargeArgs{Customers: two, Period: period, Invoice: true}, "takes no Customer, Invoice or Attempt above 1"},
		{"a re-bill", riverbilling.ChargeArgs{Customers: two, Period: period, Attempt: 2}, "takes no Customer, Invoice or Attempt above 1"},
		{"too many", riverbilling.ChargeArgs{Customers: customers(1001), Period: period}, "at most 1000"},
		{"an empty customer ID", riverbilling.ChargeArgs{Customers: []string{"cus_1", ""}, Period: period}, "customer 2 of"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			res := e.workJob(w, e.insert(c, tt.args))
			if res.EventKind != river.EventKindJobCancelled || !strings.Contains(lastErr(res.Job), tt.want) {
				t.Errorf("%s: %s %q; want cancelled, saying %q", tt.name, res.EventKind, lastErr(res.Job), tt.want)
			}
		})
	}
	if n := len(e.srv.Log()); n != 0 {
		t.Errorf("%d requests to Stripe, want 0", n)
	}
	if st := e.state(); len(st.Claims) != 0 {
		t.Errorf("claims = %v, want none", st.Claims)
	}
}
