package riverbilling_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

// insert inserts a charge job for customer without working it.
func (e *env) insert(c *river.Client[pgx.Tx], args riverbilling.ChargeArgs) *rivertype.JobRow {
	e.tb.Helper()
	res, err := c.Insert(context.Background(), args, nil)
	if err != nil {
		e.tb.Fatal(err)
	}
	return res.Job
}

// workJob works a charge job once with River's test worker, committing
// its changes (see work).
func (e *env) workJob(w *riverbilling.Worker, job *rivertype.JobRow) *rivertest.WorkResult {
	e.tb.Helper()
	return work(e, w, job)
}

// A worker killed after Stripe committed the charge and before the job
// was recorded complete: River's rescuer retries the job on another
// worker, which resumes the claim with the same key. One charge.
func TestWorkerKilledAfterStripeCommitted(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	dead := e.biller(oneAttempt)
	live := e.biller()
	c := e.client(e.riverConfig(live, nil))
	job := e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period})

	// The dead worker: it took the job, Stripe committed its charge, and
	// the process died before the answer was read, the claim recorded or
	// the job completed. What it leaves behind: a charge at Stripe, a
	// pending claim under its lease, a job running for over an hour.
	e.lostAnswer(dead, "cus_1")
	e.exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '2 hours',
		attempted_by = '{dead-worker}' WHERE id = $1`, job.ID)
	e.advance(5 * time.Minute) // the dead worker's claim lease runs out

	e.start(c) // its leader runs the rescuer, which schedules the retry
	st := e.waitFinished(1)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1", n)
	}
	if st.Jobs[rivertype.JobStateCompleted] != 1 || st.Claims["succeeded"] != 1 {
		t.Errorf("state = %v, want the job completed and the claim succeeded", st)
	}
	got, err := c.JobGet(context.Background(), job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 2 || len(got.Errors) != 1 {
		t.Errorf("job after %d attempts with errors %+v; want 2 attempts, the rescuer's error", got.Attempt, got.Errors)
	}
}

// The same job run twice at once (the rescuer re-ran a job that was only
// slow): one charge; the second run finds the first one's live claim and
// is snoozed, then completes without calling Stripe.
func TestSameJobTwiceAtOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: 500 * time.Millisecond})
	b := e.biller()
	w := e.worker(b)
	key, err := b.Key("cus_1", period, 1)
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[riverbilling.ChargeArgs]{
		JobRow: &rivertype.JobRow{ID: 1, Attempt: 1, Queue: riverbilling.DefaultQueue},
		Args:   riverbilling.ChargeArgs{Customer: "cus_1", Period: period},
	}
	var (
		wg   sync.WaitGroup
		errs [2]error
	)
	for i := range errs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == 1 {
				// Start once the first run holds the claim (it is at Stripe).
				for ; ; time.Sleep(5 * time.Millisecond) {
					if _, err := e.store.Get(context.Background(), key.String()); err == nil {
						break
					}
				}
			}
			errs[i] = w.Work(context.Background(), job)
		}()
	}
	wg.Wait()
	var snoozed *river.JobSnoozeError
	if errs[0] != nil || !errors.As(errs[1], &snoozed) {
		t.Errorf("runs = %v, %v; want nil and a snooze", errs[0], errs[1])
	}
	if err := w.Work(context.Background(), job); err != nil {
		t.Errorf("the snoozed run, again = %v; want nil", err)
	}
	if n, r := e.count("cus_1"), e.creates("cus_1"); n != 1 || r != 1 {
		t.Errorf("cus_1: %d charges, %d create requests; want 1 and 1", n, r)
	}
}

// A job retried 25 hours after its key was first sent (a long outage, a
// discarded job retried by hand): past the key's deadline the Biller
// searches Stripe and records the charge it finds instead of sending the
// key again.
func TestJobRetried25HoursLater(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	w := e.worker(e.biller(oneAttempt))
	c := e.client(e.riverConfig(e.biller(), nil))
	job := e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period})

	// First run: Stripe commits, the answer is lost, search is down.
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	res := e.workJob(w, job)
	e.srv.SetScript(nil)
	if res.EventKind != river.EventKindJobFailed {
		t.Fatalf("first run: %s, job %s; want failed, to be retried", res.EventKind, res.Job.State)
	}

	e.advance(25 * time.Hour)
	before := e.creates("cus_1")
	res = e.workJob(w, res.Job)
	if res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("run 25 h later: %s (%v); want completed", res.EventKind, res.Job.Errors)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1", n)
	}
	if r := e.creates("cus_1") - before; r != 0 {
		t.Errorf("%d create requests after the window, want 0 (found by search)", r)
	}
}

// A decline cancels the job at once, with the reason, and is never retried.
func TestDeclineCancelsWithoutRetry(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	w := e.worker(e.biller())
	c := e.client(e.riverConfig(e.biller(), nil))
	job := e.insert(c, riverbilling.ChargeArgs{Customer: "cus_d", Period: period})

	res := e.workJob(w, job)
	if res.EventKind != river.EventKindJobCancelled || res.Job.State != rivertype.JobStateCancelled || res.Job.Attempt != 1 {
		t.Fatalf("decline: %s, job %s after %d attempts; want cancelled after 1", res.EventKind, res.Job.State, res.Job.Attempt)
	}
	if len(res.Job.Errors) != 1 || !strings.Contains(res.Job.Errors[0].Error, "insufficient_funds") {
		t.Errorf("job errors = %+v, want the decline's reason", res.Job.Errors)
	}
	// While the cancelled job is kept, a second one is a duplicate.
	dup, err := c.Insert(context.Background(), riverbilling.ChargeArgs{Customer: "cus_d", Period: period}, nil)
	if err != nil || !dup.UniqueSkippedAsDuplicate {
		t.Errorf("insert again = %+v, %v; want skipped as a duplicate", dup, err)
	}
	// Once River has cleaned it away, a job inserted again is cancelled
	// from the claim, without a request to Stripe.
	e.exec(`DELETE FROM river_job WHERE id = $1`, job.ID)
	res = e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: "cus_d", Period: period}))
	if res.EventKind != river.EventKindJobCancelled {
		t.Errorf("second run: %s, want cancelled", res.EventKind)
	}
	if n, r := e.count("cus_d"), e.creates("cus_d"); n != 0 || r != 1 {
		t.Errorf("cus_d: %d charges, %d create requests; want 0 and 1", n, r)
	}
}

// A refusal of the API key cancels the job, visibly, and pauses the queue:
// every other job would meet the same answer.
func TestAuthRefusalCancelsAndPausesQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{APIKeys: []string{"sk_test_the_right_one"}})
	b := e.biller()
	c := e.client(e.riverConfig(b, nil))
	ids := customers(20)
	if _, err := riverbilling.FanOut(context.Background(), c, e.pool, period, billing.Customers(ids...), 0); err != nil {
		t.Fatal(err)
	}
	e.start(c)
	// Wait for the queue to be paused and the jobs already fetched to
	// finish.
	var st riverbilling.PeriodState
	for {
		q, err := c.QueueGet(context.Background(), riverbilling.DefaultQueue)
		st = e.state()
		if err == nil && q.PausedAt != nil && st.Jobs[rivertype.JobStateRunning] == 0 && st.Jobs[rivertype.JobStateCancelled] > 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Jobs[rivertype.JobStateCompleted] != 0 {
		t.Errorf("state = %v; want some jobs cancelled, none completed", st)
	}
	if len(e.srv.Payments()) != 0 {
		t.Errorf("%d payments, want 0", len(e.srv.Payments()))
	}
	// The reason is in the jobs' errors, and the secret key is not.
	var errs string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(errors::text, ' '), '') FROM river_job WHERE state = 'cancelled'`).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs, "API key") || strings.Contains(errs, secretKey) || strings.Contains(errs, secretKey[8:]) {
		t.Errorf("cancelled jobs' errors = %.300s; want the refusal, without the secret key", errs)
	}
}

// The first charge spelled two ways (Attempt 0 and 1) is two jobs to
// River's uniqueness but one key and one claim: one charge.
func TestFirstChargeUnderTwoSpellings(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	w := e.worker(e.biller())
	c := e.client(e.riverConfig(e.biller(), nil))
	for _, a := range []int{0, 1} {
		res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period, Attempt: a}))
		if res.EventKind != river.EventKindJobCompleted {
			t.Errorf("attempt %d: %s, want completed", a, res.EventKind)
		}
	}
	if n, r := e.count("cus_1"), e.creates("cus_1"); n != 1 || r != 1 {
		t.Errorf("cus_1: %d charges, %d create requests; want 1 and 1", n, r)
	}
}

// A job retried after the price changed (a deploy between two runs of one
// job) is cancelled as a mismatch with its claim, not charged again at
// the new price.
func TestRetryAfterPriceChangeIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	job := e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period})
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	res := e.workJob(e.worker(e.biller(oneAttempt)), job)
	e.srv.SetScript(nil)
	if res.EventKind != river.EventKindJobFailed {
		t.Fatalf("first run: %s, want failed, to be retried", res.EventKind)
	}
	e.advance(5 * time.Minute) // the first run's lease is over

	repriced := e.biller(func(c *billing.Config) {
		c.Price = func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 9900, Currency: "usd"}, nil
		}
	})
	res = e.workJob(e.worker(repriced), res.Job)
	if res.EventKind != river.EventKindJobCancelled {
		t.Errorf("retry at a new price: %s, want cancelled", res.EventKind)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Errorf("cus_1 charged %d times, want 1", n)
	}
}

// Charge jobs behind a spend-cap proxy with a daily cap of three charges,
// over two days. Day 1: the first charge's answer is lost (its job is
// retried the next day, past the key's window, with Stripe's search up),
// two more are charged, the fourth meets the cap and is cancelled. Day 2:
// the retried job finds its charge instead of sending again, and the
// cancelled customers are billed under the new day's cap. Every customer
// is charged once, no day's spend passes the cap, and neither the vault
// key nor the Stripe key shows up in the jobs' errors or the logs.
func TestWorkersBehindSpendCapAcrossDays(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{APIKeys: []string{upstreamKey}})
	px := spendcaptest.NewProxy(spendcaptest.Config{Upstream: e.srv.URL, StripeKey: upstreamKey, Clock: e.srv})
	t.Cleanup(px.Close)
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 3 * amount, Per: spendcap.PerDay})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	behind := func(opts ...func(*billing.Config)) *billing.Biller {
		hc, err := spendcap.Client(px.URL, vaultKey, &http.Client{})
		if err != nil {
			t.Fatal(err)
		}
		return e.biller(append([]func(*billing.Config){func(c *billing.Config) {
			c.SecretKey, c.HTTPClient, c.Credential, c.Logger = vaultKey, hc, "acct_test/billing-key-1", logger
		}}, opts...)...)
	}
	worker := func(b *billing.Biller) *riverbilling.Worker {
		w, err := riverbilling.NewWorker(b, riverbilling.WorkerConfig{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	c := e.client(e.riverConfig(e.biller(), nil))
	ids := customers(6)

	// Day 1.
	var lost atomic.Bool
	px.LoseAnswers(func(r *http.Request) bool { return r.Method == http.MethodPost && lost.CompareAndSwap(false, true) })
	e.searchDown()
	first := e.workJob(worker(behind(oneAttempt)), e.insert(c, riverbilling.ChargeArgs{Customer: ids[0], Period: period}))
	px.LoseAnswers(nil)
	e.srv.SetScript(nil)
	if first.EventKind != river.EventKindJobFailed {
		t.Fatalf("lost answer: %s, want failed, to be retried", first.EventKind)
	}
	w := worker(behind())
	for _, id := range ids[1:4] {
		res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: id, Period: period}))
		t.Logf("day 1 %s: %s", id, res.EventKind)
	}
	if u := px.Usage(vaultKey); u.Spent+u.Reserved > 3*amount {
		t.Errorf("day 1 usage %+v passes the cap %d", u, 3*amount)
	}
	if n := len(e.srv.Payments()); n != 3 {
		t.Errorf("day 1: %d payments, want 3", n)
	}

	// Day 2.
	e.advance(25 * time.Hour)
	before := e.creates(ids[0])
	if res := e.workJob(w, first.Job); res.EventKind != river.EventKindJobCompleted {
		t.Errorf("retry of the lost answer a day later: %s %v", res.EventKind, res.Job.Errors)
	}
	if n := e.creates(ids[0]) - before; n != 0 {
		t.Errorf("%d create requests for %s a day later, want 0 (found by search)", n, ids[0])
	}
	for _, id := range ids[3:] {
		// Attempt 1 is the same charge as attempt 0, in a job River has
		// not seen (the cancelled one blocks its own arguments).
		res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: id, Period: period, Attempt: 1}))
		if res.EventKind != river.EventKindJobCompleted {
			t.Errorf("day 2 %s: %s %v", id, res.EventKind, res.Job.Errors)
		}
	}
	if u := px.Usage(vaultKey); u.Spent+u.Reserved > 3*amount {
		t.Errorf("day 2 usage %+v passes the cap %d", u, 3*amount)
	}
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}

	var errs string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(errors::text, ' '), '') FROM river_job`).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs, "cap") {
		t.Errorf("jobs' errors do not say the cap was reached: %.500s", errs)
	}
	for _, where := range []struct{ name, text string }{{"job errors", errs}, {"logs", logs.String()}} {
		for _, secret := range []string{vaultKey, vaultKey[10:], upstreamKey, upstreamKey[8:], secretKey, secretKey[8:]} {
			if strings.Contains(where.text, secret) {
				t.Errorf("%s hold a secret (%.12s…)", where.name, secret)
			}
		}
	}
}

// A job's first run loses Stripe's answer; before its retry the workers
// are redeployed with another configuration: the other API, a rotated
// secret key, another scope. No retry sends the key blind: the job waits
// (snoozed until the key's window has passed) or is cancelled with the
// reason, and a run a day later settles it by search. One charge.
func TestWorkerConfigChangedBetweenAttempts(t *testing.T) {
	t.Parallel()
	changes := map[string]func(*billing.Config){
		"api":   func(c *billing.Config) { c.API = billing.PaymentIntents; c.Price = pmPrice },
		"key":   func(c *billing.Config) { c.Credential = "sk_test_rotated_key_2" },
		"scope": func(c *billing.Config) { c.Scope = "billonce-v2" },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, billingtest.Config{})
			c := e.client(e.riverConfig(e.biller(), nil))
			e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
			e.searchDown()
			first := e.workJob(e.worker(e.biller(oneAttempt)), e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period}))
			if first.EventKind != river.EventKindJobFailed {
				t.Fatalf("first run: %s", first.EventKind)
			}
			// The retry, with search still down: nothing can settle it.
			w := e.worker(e.biller(change))
			res := e.workJob(w, first.Job)
			e.srv.SetScript(nil)
			t.Logf("retry after the change: %s %v", res.EventKind, lastErr(res.Job))
			if n := e.count("cus_1"); n != 1 {
				t.Fatalf("%d charges after the retry", n)
			}
			e.advance(25 * time.Hour)
			if res.Job.State != rivertype.JobStateCancelled && res.Job.State != rivertype.JobStateCompleted {
				res = e.workJob(w, res.Job)
				t.Logf("a day later: %s %v", res.EventKind, lastErr(res.Job))
			}
			// Whatever the job did, a Run of the first configuration
			// settles the period.
			sum, err := e.biller().Run(context.Background(), period, billing.Customers("cus_1"), nil)
			t.Logf("run of the first configuration: %+v %v", sum.Progress, err)
			billingtest.RequireChargedOnce(t, e.srv, "cus_1", period)
		})
	}
}
