package riverbilling_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"iter"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertest"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
)

const (
	meterEvents = "/v1/billing/meter_events"
	whsec       = "whsec_riverbillingTestSecretNeverLog000"
)

// report is the usage of customer in the last whole hour that is over,
// for the api_calls meter, shifted back by back hours.
func report(customer string, value int64, back int) billing.Usage {
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Duration(back+1) * time.Hour)
	return billing.Usage{Customer: customer, Meter: "api_calls", Kind: billing.Increments,
		Start: start, End: start.Add(time.Hour), Value: value}
}

// work works job once with River's test worker for w, committing its
// changes.
func work[T river.JobArgs](e *env, w river.Worker[T], job *rivertype.JobRow) *rivertest.WorkResult {
	e.tb.Helper()
	ctx := context.Background()
	tw := rivertest.NewWorker(e.tb, e.driver, &river.Config{Logger: quietLogger}, w)
	tx, err := e.pool.Begin(ctx)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer tx.Rollback(ctx) //nolint:errcheck
	res, err := tw.WorkJob(ctx, e.tb, tx, job)
	if err != nil {
		e.tb.Logf("work: %v", err) // the job's own error, also in res.Job.Errors
	}
	if err := tx.Commit(ctx); err != nil {
		e.tb.Fatal(err)
	}
	return res
}

// insertUsage inserts a usage job without working it.
func (e *env) insertUsage(c *river.Client[pgx.Tx], u billing.Usage) *rivertype.JobRow {
	e.tb.Helper()
	res, err := c.Insert(context.Background(), riverbilling.UsageArgs{Usage: u}, nil)
	if err != nil {
		e.tb.Fatal(err)
	}
	return res.Job
}

// sends counts the meter events POSTed to the fake for customer, answered
// or not.
func (e *env) sends(customer string) int {
	n := 0
	for _, r := range e.srv.Log() {
		if r.Method == http.MethodPost && r.Path == meterEvents && r.Customer == customer {
			n++
		}
	}
	return n
}

// requireCounted wants u counted exactly once at the fake: one event for
// the customer, and the window's total its value.
func (e *env) requireCounted(u billing.Usage) {
	e.tb.Helper()
	if n := e.srv.MeterEvents(u.Meter, u.Customer); n != 1 {
		e.tb.Errorf("%s: %d meter events at Stripe, want 1", u.Customer, n)
	}
	if got := e.srv.MeterTotal(u.Meter, u.Customer, u.Start, u.End); got != float64(u.Value) {
		e.tb.Errorf("%s: meter total %v, want %d", u.Customer, got, u.Value)
	}
}

// rejectLater has Stripe accept u's event, then reject it in a meter
// error report that reaches b's webhook: u's claim fails.
func (e *env) rejectLater(b *billing.Biller, u billing.Usage) {
	e.tb.Helper()
	e.srv.RejectUsage(u.Customer, "meter_event_customer_not_found")
	if _, err := b.ReportUsage(context.Background(), u); err != nil {
		e.tb.Fatal(err)
	}
	e.srv.AggregateNow()
	e.deliverEvents(b)
	// Accept the customer's events again: a second send would count.
	e.srv.RejectUsage(u.Customer, "")
}

// deliverEvents delivers the fake's events, signed, to b's webhook.
func (e *env) deliverEvents(b *billing.Biller) {
	e.tb.Helper()
	h, err := b.Webhook(billing.WebhookConfig{Secret: whsec})
	if err != nil {
		e.tb.Fatal(err)
	}
	for _, ev := range e.srv.Events() {
		req := httptest.NewRequest(http.MethodPost, "/", strings.NewReader(string(ev.Body)))
		req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, whsec, time.Now()))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			e.tb.Fatalf("delivering %s %s: %d %s", ev.ID, ev.Type, rec.Code, rec.Body)
		}
	}
}

// claims counts the claim rows.
func (e *env) claims() int {
	e.tb.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM billonce_claims").Scan(&n); err != nil {
		e.tb.Fatal(err)
	}
	return n
}

// usageJobs counts the usage jobs by state.
func (e *env) usageJobs() map[rivertype.JobState]int {
	e.tb.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT state::text, count(*) FROM river_job WHERE kind = 'billonce_usage' GROUP BY state`)
	if err != nil {
		e.tb.Fatal(err)
	}
	out := map[rivertype.JobState]int{}
	for rows.Next() {
		var (
			s string
			n int
		)
		if err := rows.Scan(&s, &n); err != nil {
			e.tb.Fatal(err)
		}
		out[rivertype.JobState(s)] = n
	}
	if err := rows.Err(); err != nil {
		e.tb.Fatal(err)
	}
	return out
}

// waitUsageFinished waits until n usage jobs are completed, cancelled or
// discarded and none is waiting or running.
func (e *env) waitUsageFinished(n int) map[rivertype.JobState]int {
	e.tb.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		j := e.usageJobs()
		done := j[rivertype.JobStateCompleted] + j[rivertype.JobStateCancelled] + j[rivertype.JobStateDiscarded]
		if done == n && done == sum(j) {
			return j
		}
		if time.Now().After(deadline) {
			rows, _ := e.pool.Query(context.Background(), `SELECT id, state::text, attempt, scheduled_at - now(), errors::text FROM river_job WHERE kind = 'billonce_usage' AND state NOT IN ('completed', 'cancelled') LIMIT 5`)
			for rows.Next() {
				var (
					id, att  int64
					st, errs string
					wait     time.Duration
				)
				_ = rows.Scan(&id, &st, &att, &wait, &errs)
				e.tb.Logf("job %d %s attempt %d scheduled in %v: %.600s", id, st, att, wait, errs)
			}
			rows.Close()
			e.tb.Fatalf("usage jobs not finished after 90s: %v", j)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// A usage job's arguments are one report whatever the time zone its
// window was written in, and whether its first attempt is 0 or 1; a
// report without a kind cannot be inserted.
func TestUsageArgsOneReportOneJob(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	c := e.client(e.riverConfig(e.biller(), nil))
	u := report("cus_1", 5, 0)
	first := e.insertUsage(c, u)
	paris := time.FixedZone("CEST", 2*3600)
	same := u
	same.Start, same.End, same.Attempt = u.Start.In(paris), u.End.In(paris), 1
	res, err := c.Insert(context.Background(), riverbilling.UsageArgs{Usage: same}, nil)
	if err != nil || !res.UniqueSkippedAsDuplicate {
		t.Errorf("the same report in another zone, attempt 1 = %+v, %v; want skipped as a duplicate", res, err)
	}
	var back riverbilling.UsageArgs
	if err := json.Unmarshal(first.EncodedArgs, &back); err != nil || back.Usage.Start != u.Start || back.Usage.End != u.End ||
		back.Usage.Kind != billing.Increments || back.Usage.Customer != u.Customer || back.Usage.Value != u.Value {
		t.Errorf("stored args %s read back as %+v, %v; want %+v", first.EncodedArgs, back.Usage, err, u)
	}
	var stored map[string]any
	if err := json.Unmarshal(first.EncodedArgs, &stored); err != nil || stored["kind"] != "increments" || stored["start"] != u.Start.Format(time.RFC3339) {
		t.Errorf("stored args %s: want the kind by name and the window in UTC", first.EncodedArgs)
	}
	noKind := u
	noKind.Kind = 0
	if _, err := c.Insert(context.Background(), riverbilling.UsageArgs{Usage: noKind}, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Errorf("insert without a kind = %v, want ErrInvalid", err)
	}
	if n := sum(e.usageJobs()); n != 1 {
		t.Errorf("%d usage jobs, want 1", n)
	}
}

// A usage job run again after it completed, and run twice at the same
// time (River's rescuer re-running a slow job), sends one meter event:
// the second run at once is snoozed while the first holds the claim.
func TestUsageJobRunTwiceSendsOneEvent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("api_calls", "sum", "")
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: 500 * time.Millisecond})
	w := e.usageWorker(e.biller())
	u := report("cus_1", 42, 0)
	job := &river.Job[riverbilling.UsageArgs]{
		JobRow: &rivertype.JobRow{ID: 1, Attempt: 1, Queue: riverbilling.DefaultQueue},
		Args:   riverbilling.UsageArgs{Usage: u},
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
				for deadline := time.Now().Add(10 * time.Second); e.claims() == 0; time.Sleep(5 * time.Millisecond) {
					if time.Now().After(deadline) {
						t.Error("the first run sent nothing within 10s")
						return
					}
				}
			}
			errs[i] = w.Work(context.Background(), job)
		}()
	}
	wg.Wait()
	var snoozed *river.JobSnoozeError
	if errs[0] != nil || !errors.As(errs[1], &snoozed) {
		t.Errorf("runs at once = %v, %v; want nil and a snooze", errs[0], errs[1])
	}
	// The snoozed run, and a run of the job after it completed.
	for i := range 2 {
		if err := w.Work(context.Background(), job); err != nil {
			t.Errorf("run %d after the first = %v; want nil", i+2, err)
		}
	}
	e.requireCounted(u)
	if n := e.sends("cus_1"); n != 1 {
		t.Errorf("%d meter event requests, want 1: later runs find the claim delivered", n)
	}
}

// A worker killed after Stripe accepted the event and before the job was
// recorded complete: River's rescuer retries the job on another worker,
// which resumes the claim with the same identifier. One event.
func TestUsageJobRescuedAfterWorkerKilled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("api_calls", "sum", "")
	dead := e.biller(oneAttempt)
	c := e.client(e.riverConfig(e.biller(), nil))
	u := report("cus_1", 7, 0)
	job := e.insertUsage(c, u)

	// The dead worker: Stripe accepted its event, the answer never came
	// back, and the process died with the job running.
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err := dead.ReportUsage(context.Background(), u); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("report with a lost answer = %v, want ErrOutcomeUnknown", err)
	}
	e.exec(`UPDATE river_job SET state = 'running', attempt = 1, attempted_at = now() - interval '2 hours',
		attempted_by = '{dead-worker}' WHERE id = $1`, job.ID)
	e.advance(5 * time.Minute) // the dead worker's claim lease runs out

	e.start(c) // its leader runs the rescuer, which schedules the retry
	st := e.waitUsageFinished(1)
	if st[rivertype.JobStateCompleted] != 1 {
		t.Errorf("usage jobs %v, want 1 completed", st)
	}
	e.requireCounted(u)
	got, err := c.JobGet(context.Background(), job.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Attempt != 2 || len(got.Errors) != 1 {
		t.Errorf("job after %d attempts with errors %+v; want 2 attempts, the rescuer's error", got.Attempt, got.Errors)
	}
}

// A job whose first run lost Stripe's answer fails and is retried with the
// same identifier: at once, Stripe replays the event; a day later, past
// the key's deadline, the meter's summary shows it delivered and nothing
// is sent. One event either way.
func TestUsageJobRetriedAfterLostAnswer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		later time.Duration
		sends int // requests of the retry
	}{
		{"at once", 0, 1},
		{"a day later", 25 * time.Hour, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, billingtest.Config{})
			e.srv.CreateMeter("api_calls", "sum", "")
			c := e.client(e.riverConfig(e.biller(), nil))
			u := report("cus_1", 9, 0)
			e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
			res := work(e, e.usageWorker(e.biller(oneAttempt)), e.insertUsage(c, u))
			if res.EventKind != river.EventKindJobFailed {
				t.Fatalf("first run: %s, job %s; want failed, to be retried", res.EventKind, res.Job.State)
			}
			if tc.later > 0 {
				e.advance(tc.later)
				e.srv.AggregateNow()
			}
			before := e.sends("cus_1")
			res = work(e, e.usageWorker(e.biller()), res.Job)
			if res.EventKind != river.EventKindJobCompleted {
				t.Fatalf("retry: %s %v; want completed", res.EventKind, res.Job.Errors)
			}
			if n := e.sends("cus_1") - before; n != tc.sends {
				t.Errorf("the retry sent %d requests, want %d", n, tc.sends)
			}
			e.requireCounted(u)
		})
	}
}

// A report Stripe rejected (its meter error report reached the webhook)
// cancels its job at once, with the reason, without a request to Stripe
// and without a retry. Reporting it again is the next Attempt.
func TestRejectedUsageJobIsCancelled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("api_calls", "sum", "")
	b := e.biller()
	c := e.client(e.riverConfig(b, nil))
	u := report("cus_r", 3, 0)
	e.rejectLater(b, u)
	before := e.sends("cus_r")

	res := work(e, e.usageWorker(b), e.insertUsage(c, u))
	if res.EventKind != river.EventKindJobCancelled || res.Job.State != rivertype.JobStateCancelled || res.Job.Attempt != 1 {
		t.Fatalf("rejected report: %s, job %s after %d attempts; want cancelled after 1", res.EventKind, res.Job.State, res.Job.Attempt)
	}
	if !strings.Contains(lastErr(res.Job), "meter_event_customer_not_found") {
		t.Errorf("job errors = %+v, want the rejection's code", res.Job.Errors)
	}
	if dup, err := c.Insert(context.Background(), riverbilling.UsageArgs{Usage: u}, nil); err != nil || !dup.UniqueSkippedAsDuplicate {
		t.Errorf("insert again = %+v, %v; want skipped as a duplicate", dup, err)
	}
	if n := e.sends("cus_r") - before; n != 0 {
		t.Errorf("%d requests for the rejected report, want 0", n)
	}
	if n := e.srv.MeterEvents("api_calls", "cus_r"); n != 0 {
		t.Errorf("%d events counted for the rejected report, want 0", n)
	}

	u.Attempt = 2
	res = work(e, e.usageWorker(b), e.insertUsage(c, u))
	if res.EventKind != river.EventKindJobCompleted {
		t.Errorf("attempt 2: %s %v, want completed", res.EventKind, res.Job.Errors)
	}
	e.requireCounted(u)
}

// Two machines with eight workers each work the usage jobs of 30
// customers over two windows, while a third reports the same usage with
// RunUsage, through lost answers, 5xx, 409 and 429: every report is
// counted once. The jobs of three customers whose reports Stripe had
// rejected are cancelled after one run each, and nothing is sent again.
func TestUsageJobsOnSeveralWorkers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("api_calls", "sum", "")
	ids := customers(30)
	rejected := map[string]bool{ids[3]: true, ids[11]: true, ids[22]: true}
	var reports []billing.Usage
	for i, id := range ids {
		for back := range 2 {
			reports = append(reports, report(id, int64(i+1), back))
		}
	}
	pre := e.biller()
	for _, u := range reports {
		if rejected[u.Customer] {
			e.rejectLater(pre, u)
		}
	}
	before := map[string]int{}
	for id := range rejected {
		before[id] = e.sends(id)
	}

	faults := []billingtest.FaultKind{billingtest.FaultCut, billingtest.FaultErrorBefore,
		billingtest.FaultInFlight, billingtest.FaultLockTimeout, billingtest.FaultRateLimit}
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.Path != meterEvents || r.Attempt > 2 {
			return billingtest.Fault{}
		}
		h := fnv.New32a()
		fmt.Fprintf(h, "%s/%d", r.IdempotencyKey, r.Attempt)
		if k := int(h.Sum32() % 10); k < len(faults) {
			return billingtest.Fault{Kind: faults[k]}
		}
		return billingtest.Fault{}
	})
	clients := make([]*river.Client[pgx.Tx], 2)
	for i := range clients {
		clients[i] = e.client(e.riverConfig(e.biller(), nil))
	}
	params := make([]river.InsertManyParams, 0, len(reports))
	for _, u := range reports {
		params = append(params, river.InsertManyParams{Args: riverbilling.UsageArgs{Usage: u}})
	}
	// Inserted twice: the second time, every job is a duplicate.
	for i, want := range []int{len(reports), 0} {
		res, err := clients[0].InsertMany(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		if n := len(res) - countSkipped(res); n != want {
			t.Fatalf("insert %d: %d new jobs, want %d", i+1, n, want)
		}
	}
	for _, c := range clients {
		e.start(c)
	}
	// A third replica reports the same usage with RunUsage meanwhile. Its
	// claims' leases are short, so that the jobs it holds up are snoozed
	// for seconds, not the default lease's minutes.
	short, err := claim.NewPostgres(e.pool, claim.Config{Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	run := e.biller(func(c *billing.Config) { c.Claims = short })
	if _, err := run.RunUsage(context.Background(), seq(reports), &billing.RunOptions{BatchSize: 8}); err != nil {
		t.Errorf("RunUsage beside the workers: %v", err)
	}
	st := e.waitUsageFinished(len(reports))
	e.srv.SetScript(nil)
	wantCancelled := 2 * len(rejected)
	if st[rivertype.JobStateCompleted] != len(reports)-wantCancelled || st[rivertype.JobStateCancelled] != wantCancelled {
		t.Errorf("usage jobs %v; want %d completed, %d cancelled", st, len(reports)-wantCancelled, wantCancelled)
	}
	for _, u := range reports {
		if rejected[u.Customer] {
			continue
		}
		if n := e.srv.MeterEvents(u.Meter, u.Customer); n != 2 {
			t.Errorf("%s: %d events, want 2 (one per window)", u.Customer, n)
		}
		if got := e.srv.MeterTotal(u.Meter, u.Customer, u.Start, u.End); got != float64(u.Value) {
			t.Errorf("%s %s: total %v, want %d", u.Customer, u.Start.Format(time.RFC3339), got, u.Value)
		}
	}
	for id := range rejected {
		if n := e.sends(id) - before[id]; n != 0 {
			t.Errorf("%s: %d requests after the rejection, want 0", id, n)
		}
		if n := e.srv.MeterEvents("api_calls", id); n != 0 {
			t.Errorf("%s: %d events counted, want 0", id, n)
		}
	}
	rows, err := e.pool.Query(context.Background(), `SELECT attempt FROM river_job WHERE kind = 'billonce_usage' AND state = 'cancelled'`)
	if err != nil {
		t.Fatal(err)
	}
	attempts, err := pgx.CollectRows(rows, pgx.RowTo[int])
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range attempts {
		if a != 1 {
			t.Errorf("a rejected report's job ran %d times, want 1", a)
		}
	}
}

func countSkipped(res []*rivertype.JobInsertResult) int {
	n := 0
	for _, r := range res {
		if r.UniqueSkippedAsDuplicate {
			n++
		}
	}
	return n
}

func seq[T any](s []T) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for _, v := range s {
			if !yield(v, nil) {
				return
			}
		}
	}
}

// A job whose window overlaps a window already claimed for its customer
// and meter is invalid: it is cancelled at once, naming the claimed
// window, sends nothing and is never retried.
func TestOverlappingUsageJobIsCancelled(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.srv.CreateMeter("api_calls", "sum", "")
	b := e.biller()
	c := e.client(e.riverConfig(b, nil))
	first := report("cus_o", 3, 1)
	res := work(e, e.usageWorker(b), e.insertUsage(c, first))
	if res.EventKind != river.EventKindJobCompleted {
		t.Fatalf("first window: %s %v, want completed", res.EventKind, res.Job.Errors)
	}
	later := first
	later.Start, later.End, later.Value = first.Start.Add(30*time.Minute), first.End.Add(30*time.Minute), 4
	before := e.sends("cus_o")
	res = work(e, e.usageWorker(e.biller()), e.insertUsage(c, later))
	if res.EventKind != river.EventKindJobCancelled || res.Job.Attempt != 1 {
		t.Fatalf("overlapping window: %s after %d attempts, %v; want cancelled after 1", res.EventKind, res.Job.Attempt, res.Job.Errors)
	}
	claimed := first.Start.Format(time.RFC3339) + " to " + first.End.Format(time.RFC3339)
	if !strings.Contains(lastErr(res.Job), claimed) {
		t.Errorf("job errors = %+v, want the window claimed, %s", res.Job.Errors, claimed)
	}
	if n := e.sends("cus_o") - before; n != 0 {
		t.Errorf("%d requests for the overlapping window, want 0", n)
	}
	e.requireCounted(first)
	if got := e.srv.MeterTotal("api_calls", "cus_o", first.Start, later.End); got != float64(first.Value) {
		t.Errorf("the meter counts %v over both windows, want %d", got, first.Value)
	}
}
