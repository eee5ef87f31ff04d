package billing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"math/rand"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/internal/testenv"
	"github.com/billonce/billonce/lock"
)

// wantAllOnce checks at the fake that every customer was charged exactly
// once for the period.
func wantAllOnce(t *testing.T, srv *billingtest.Server, ids []string) {
	t.Helper()
	bad := 0
	for _, c := range ids {
		if n := srv.CountPeriod(c, period); n != 1 {
			if bad++; bad <= 5 {
				t.Errorf("%s charged %d times; want 1", c, n)
			}
		}
	}
	if bad > 0 {
		t.Fatalf("%d of %d customers not charged exactly once", bad, len(ids))
	}
	if st := srv.Stats(); st.Paid != int64(len(ids)) {
		t.Fatalf("Stripe moved money %d times for %d customers", st.Paid, len(ids))
	}
}

// A thousand customers, one charge each; a rerun charges nobody; progress
// adds up at every step.
func TestRunThousandCustomersOnceEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(1000)
	var progress []billing.Progress
	opts := &billing.RunOptions{Concurrency: 8, BatchSize: 100, Total: len(ids),
		Progress: func(p billing.Progress) { progress = append(progress, p) }}
	sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), opts)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(billing.Progress{Total: 1000, Done: 1000, Created: 1000}, sum.Progress); diff != "" || !sum.Complete() || sum.Period != period || len(sum.Failures) != 0 {
		t.Fatalf("summary (-want +got):\n%s\nfailures: %v", diff, sum.Failures)
	}
	wantAllOnce(t, e.srv, ids)
	if len(progress) != 1000 {
		t.Fatalf("%d progress reports; want one per customer", len(progress))
	}
	for i, p := range progress {
		if p.Done != i+1 || p.Done != p.Created+p.AlreadyBilled+p.Declined+p.Pending+p.Invalid || p.Total != 1000 {
			t.Fatalf("progress report %d: %+v does not add up", i, p)
		}
	}
	if progress[999] != sum.Progress {
		t.Fatalf("last progress %+v, summary %+v", progress[999], sum.Progress)
	}

	requests := e.srv.Stats().Requests
	sum, err = e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(billing.Progress{Done: 1000, AlreadyBilled: 1000}, sum.Progress); diff != "" {
		t.Fatalf("rerun: want all 1000 already done (-want +got):\n%s", diff)
	}
	if n := e.srv.Stats().Requests; n != requests {
		t.Fatalf("the rerun made %d requests; want none", n-requests)
	}
	wantAllOnce(t, e.srv, ids)
}

// Declines are counted and recorded; the run goes on.
func TestRunCountsDeclinesAndContinues(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(40)
	for _, c := range ids[:4] {
		e.srv.Decline(c, "card_declined")
	}
	sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(billing.Progress{Done: 40, Created: 36, Declined: 4}, sum.Progress); diff != "" || len(sum.Failures) != 4 || sum.Complete() {
		t.Fatalf("summary (-want +got):\n%s\nfailures: %v", diff, sum.Failures)
	}
	for _, f := range sum.Failures {
		var fe *billing.ChargeError
		if !(errors.As(f, &fe) && errors.Is(f, billing.ErrDeclined)) || fe.DeclineCode != "card_declined" {
			t.Fatalf("failure %v; want ErrDeclined", f)
		}
	}
	for _, c := range ids[:4] {
		wantCount(t, e, c, 0)
	}
	wantAllOnceOf(t, e, ids[4:])
	requests := e.srv.Stats().Requests
	sum, err = e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Declined != 4 || sum.AlreadyBilled != 36 || e.srv.Stats().Requests != requests {
		t.Fatalf("rerun: %+v, %v; declines must stay recorded, not be retried", sum.Progress, err)
	}
}

func wantAllOnceOf(t *testing.T, e *env, ids []string) {
	t.Helper()
	for _, c := range ids {
		wantCount(t, e, c, 1)
	}
}

// seq yields ids, then err.
func seq(ids []string, err error) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for _, id := range ids {
			if !yield(billing.Item{Customer: id}, nil) {
				return
			}
		}
		if err != nil {
			yield(billing.Item{}, err)
		}
	}
}

// An iterator error stops the run; what was claimed is sent, nothing is
// lost, and a rerun finishes the job.
func TestRunIteratorErrorLosesNoClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(40)
	broken := errors.New("customer export truncated")
	sum, err := e.b.Run(context.Background(), period, seq(ids[:25], broken), &billing.RunOptions{BatchSize: 10})
	if !errors.Is(err, broken) {
		t.Fatalf("Run: %v; want the iterator's error", err)
	}
	if sum.Created != 25 {
		t.Fatalf("summary %+v; the 25 customers read before the error must be billed", sum.Progress)
	}
	if n := e.claimRows(); n != 25 {
		t.Fatalf("%d claims; want 25", n)
	}
	for _, c := range ids[:25] {
		if cl := e.claimOf(c); cl.State != claim.StateSucceeded {
			t.Fatalf("claim of %s is %s", c, cl.State)
		}
	}
	sum, err = e.b.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Created != 15 || sum.AlreadyBilled != 25 {
		t.Fatalf("rerun: %+v, %v", sum.Progress, err)
	}
	wantAllOnce(t, e.srv, ids)
}

// Cancelling a run leaves every customer charged once or not at all, never
// a claim another runner cannot resume; a second run, by another replica,
// finishes with exactly one charge each.
func TestRunCancelledMidway(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ids := customers(300)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// Some faults, so that cancellation also lands in retries.
	e.srv.SetScript(faults(3, map[billingtest.FaultKind]float64{billingtest.FaultCut: 0.05, billingtest.FaultErrorBefore: 0.05}))
	sum, err := e.b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 4, BatchSize: 50,
		Progress: func(p billing.Progress) {
			if p.Done == 60 {
				cancel()
			}
		}})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run: %v; want context.Canceled", err)
	}
	if sum.Done >= len(ids) && sum.Complete() {
		t.Fatalf("summary %+v: the run was not cut short", sum.Progress)
	}
	charged := 0
	for _, c := range ids {
		n := e.count(c)
		charged += n
		cl, gerr := e.store.Get(context.Background(), e.key(c))
		switch {
		case n > 1:
			t.Fatalf("%s charged %d times", c, n)
		case errors.Is(gerr, claim.ErrNotFound):
			if n != 0 {
				t.Fatalf("%s charged without a claim", c)
			}
		case gerr != nil:
			t.Fatal(gerr)
		case cl.State == claim.StateSucceeded && n != 1:
			t.Fatalf("%s recorded as charged, Stripe has %d", c, n)
		case cl.State == claim.StateFailed:
			t.Fatalf("%s failed", c)
		}
	}
	if charged == 0 || charged == len(ids) {
		t.Fatalf("%d charged before the stop", charged)
	}
	e.srv.SetScript(nil)
	other := e.biller()
	sum, err = other.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || !sum.Complete() || sum.Done != len(ids) {
		t.Fatalf("second run: %+v, %v; want every customer settled", sum.Progress, err)
	}
	wantAllOnce(t, e.srv, ids)
}

// Two Runs of one period at once, with faults: claims decide, nobody is
// charged twice.
func TestRunTwoConcurrentRuns(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{Script: faults(11, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.03, billingtest.FaultErrorBefore: 0.03, billingtest.FaultLockTimeout: 0.03})})
	ids := customers(300)
	runners := []*billing.Biller{e.b, e.biller()}
	sums := make([]billing.Summary, len(runners))
	errs := make([]error, len(runners))
	var wg sync.WaitGroup
	for i, b := range runners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sums[i], errs[i] = b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{BatchSize: 20})
		}()
	}
	wg.Wait()
	created := 0
	for i := range runners {
		if errs[i] != nil {
			t.Fatalf("run %d: %v", i, errs[i])
		}
		created += sums[i].Created
	}
	if created != len(ids) {
		t.Fatalf("runs created %d charges (%+v, %+v); want %d", created, sums[0].Progress, sums[1].Progress, len(ids))
	}
	wantAllOnce(t, e.srv, ids)
}

// Environment of the helper process of TestRunThreeProcesses.
const (
	envHelper = "BILLONCE_TEST_HELPER"
	envStripe = "BILLONCE_TEST_STRIPE_URL"
	envN      = "BILLONCE_TEST_CUSTOMERS"
)

// TestHelperProcess is one replica of a billing cron job, started by
// TestRunThreeProcesses in a process of its own.
func TestHelperProcess(t *testing.T) {
	if os.Getenv(envHelper) == "" {
		t.Skip("a replica started by TestRunThreeProcesses")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(pgtest.EnvURL))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(os.Getenv(envN))
	if err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: os.Getenv(envStripe), Claims: store,
		Price: flatPrice(amount), RateLimit: -1, Retry: fastRetry(), Owner: "replica-" + os.Getenv(envHelper)})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := b.Run(ctx, period, billing.Customers(customers(n)...), &billing.RunOptions{BatchSize: 25})
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(sum.Progress)
	fmt.Printf("SUMMARY %s\n", out)
}

// Seed: a cron job on three replicas bills the same period at once. Three
// OS processes, one database, one Stripe: each customer is charged once.
func TestRunThreeProcesses(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{Script: faults(5, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.03, billingtest.FaultErrorBefore: 0.03, billingtest.FaultLockTimeout: 0.03})})
	n := testenv.Size(100, 400)
	ids := customers(n)
	dbURL := e.pool.Config().ConnString()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var wg sync.WaitGroup
	sums := make([]billing.Progress, 3)
	for i := range sums {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperProcess$", "-test.count=1")
		cmd.Env = append(os.Environ(), envHelper+"="+strconv.Itoa(i), envStripe+"="+e.srv.URL,
			envN+"="+strconv.Itoa(n), pgtest.EnvURL+"="+dbURL)
		wg.Add(1)
		go func() {
			defer wg.Done()
			out, err := cmd.CombinedOutput()
			if err != nil {
				t.Errorf("replica %d: %v\n%s", i, err, out)
				return
			}
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if js, ok := strings.CutPrefix(sc.Text(), "SUMMARY "); ok {
					if err := json.Unmarshal([]byte(js), &sums[i]); err != nil {
						t.Errorf("replica %d: %v", i, err)
					}
					return
				}
			}
			t.Errorf("replica %d printed no summary:\n%s", i, out)
		}()
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	created := 0
	for i, s := range sums {
		if s.Done != n || s.Declined != 0 || s.Invalid != 0 {
			t.Fatalf("replica %d: %+v", i, s)
		}
		created += s.Created
	}
	t.Logf("replicas: %+v", sums)
	if created != n {
		t.Fatalf("replicas created %d charges; want %d", created, n)
	}
	wantAllOnce(t, e.srv, ids)
}

// With a lock.Locker, a second Run of the period is turned away while the
// first holds the lock, before it claims or sends anything.
func TestRunLockHeldElsewhere(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	guard, err := lock.NewAdvisory(e.pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	blocking := func(yield func(billing.Item, error) bool) {
		if !yield(billing.Item{Customer: "cus_a"}, nil) {
			return
		}
		close(started)
		<-release
		yield(billing.Item{Customer: "cus_b"}, nil)
	}
	type result struct {
		sum billing.Summary
		err error
	}
	first := make(chan result, 1)
	go func() {
		s, err := e.b.Run(context.Background(), period, blocking, &billing.RunOptions{Lock: guard})
		first <- result{s, err}
	}()
	<-started
	other := e.biller()
	sum, err := other.Run(context.Background(), period, billing.Customers("cus_a", "cus_b"), &billing.RunOptions{Lock: guard})
	if !errors.Is(err, billing.ErrRunHeldElsewhere) || sum.Done != 0 {
		t.Fatalf("second Run: %+v, %v; want ErrRunHeldElsewhere", sum, err)
	}
	if n, r := e.claimRows(), e.srv.Stats().Requests; n != 0 || r != 0 {
		t.Fatalf("%d claims, %d requests while the first run held the lock", n, r)
	}
	close(release)
	r := <-first
	if r.err != nil || r.sum.Created != 2 {
		t.Fatalf("first Run: %+v, %v", r.sum.Progress, r.err)
	}
	sum, err = other.Run(context.Background(), period, billing.Customers("cus_a", "cus_b"), &billing.RunOptions{Lock: guard})
	if err != nil || sum.AlreadyBilled != 2 {
		t.Fatalf("Run after the lock was released: %+v, %v", sum.Progress, err)
	}
	wantAllOnce(t, e.srv, []string{"cus_a", "cus_b"})
}

// Stop on refusals: a key Stripe refuses stops the run at once; unsent claims stay
// pending and another replica with a good key finishes the job.
func TestRunStopsOnStripeAuth(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{APIKeys: []string{"sk_test_the_account_key_is_another_0000"}})
	ids := customers(30)
	const workers = 3
	sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{Concurrency: workers, BatchSize: 10})
	if !errors.Is(err, billing.ErrStripeAuth) {
		t.Fatalf("Run: %v; want ErrStripeAuth", err)
	}
	if n := e.srv.Stats().Requests; n > workers {
		t.Fatalf("%d requests; a 401 must stop the run (at most one per worker in flight)", n)
	}
	if sum.Created != 0 || sum.Declined != 0 {
		t.Fatalf("summary %+v", sum.Progress)
	}
	var notPending int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM billonce_claims WHERE state <> 'pending'").Scan(&notPending); err != nil {
		t.Fatal(err)
	}
	if notPending != 0 {
		t.Fatalf("%d claims left succeeded or failed; a refused key decides nothing", notPending)
	}

	// The key is fixed: another replica resumes every claim at once.
	good := newServer(t, billingtest.Config{})
	fixed := e.biller(func(c *billing.Config) { c.StripeURL = good.URL })
	sum, err = fixed.Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Created != len(ids) {
		t.Fatalf("Run with a good key: %+v, %v", sum.Progress, err)
	}
	wantAllOnce(t, good, ids)
}

// A customer listed twice in one batch is claimed once and reported once as
// a repeat, instead of failing the whole batch.
func TestRunSameCustomerTwiceChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	sum, err := e.b.Run(context.Background(), period, billing.Customers("cus_1", "cus_2", "cus_1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []string{"cus_1", "cus_2"} {
		if n := e.srv.CountPeriod(c, period); n != 1 {
			t.Errorf("%s charged %d times, want 1", c, n)
		}
	}
	if sum.Created != 2 || sum.Invalid != 1 || !errors.Is(sum.Failures[0], billing.ErrInvalid) {
		t.Errorf("summary %+v, failures %v: want 2 created and the repeat reported as invalid", sum.Progress, sum.Failures)
	}
}

// A Run cancelled after every customer was claimed, while charges are still
// being sent, reports the cancellation instead of a nil error.
func TestRunCancelledAfterClaimingReportsIt(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.Customer == "cus_00005" {
			cancel()
		}
		return billingtest.Fault{}
	}}, func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	ids := customers(20)
	sum, err := e.b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run after cancel: err = %v, want context.Canceled (summary %+v)", err, sum.Progress)
	}
	for _, id := range ids {
		if n := e.count(id); n > 1 {
			t.Fatalf("%s charged %d times", id, n)
		}
	}
	// The next run finishes the job: everyone charged exactly once.
	if _, err := e.b.Run(context.Background(), period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if n := e.count(id); n != 1 {
			t.Errorf("%s charged %d times after the second run, want 1", id, n)
		}
	}
}

// A changed amount against an existing claim is counted as invalid input,
// not as an unknown outcome, and nothing is sent for it.
func TestRunChangedAmountIsInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	other := billing.Price{Amount: amount + 1, Currency: "usd"}
	sum, err := e.b.Run(ctx, period, func(yield func(billing.Item, error) bool) {
		yield(billing.Item{Customer: "cus_1", Price: &other}, nil)
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var mismatch *claim.MismatchError
	if sum.Invalid != 1 || sum.Pending != 0 || len(sum.Failures) != 1 || !errors.As(sum.Failures[0], &mismatch) {
		t.Errorf("summary %+v, failures %v: want the changed amount counted as invalid", sum.Progress, sum.Failures)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Errorf("cus_1 charged %d times, want 1", n)
	}
}

// The claim pool is closed, or every backend of the claim database is
// terminated (a PostgreSQL restart as its clients see it), in the middle
// of a Run, just after a Stripe call. The Run does not report the period
// complete; the next Run, on a new pool, finishes it, and a Run a day later
// charges nobody again.
func TestRunClaimDatabaseLostMidRunFinishesNextRun(t *testing.T) {
	t.Parallel()
	for _, how := range []string{"pool closed", "backends terminated"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			ids := customers(60)
			pool2, err := pgxpool.New(ctx, e.pool.Config().ConnString())
			if err != nil {
				t.Fatal(err)
			}
			store2, err := claim.NewPostgres(pool2, claim.Config{})
			if err != nil {
				t.Fatal(err)
			}
			var calls atomic.Int64
			b := e.biller(func(c *billing.Config) {
				c.Claims = store2
				c.Observe = func(ev billing.Event) {
					if ev.Kind != billing.EventStripeCall || calls.Add(1) != 20 {
						return
					}
					if how == "pool closed" {
						go pool2.Close()
						return
					}
					if _, err := e.pool.Exec(ctx, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity
						WHERE datname = current_database() AND pid <> pg_backend_pid()`); err != nil {
						t.Error(err)
					}
				}
			})
			sum, err := b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 4, BatchSize: 10})
			t.Logf("interrupted run: %+v, %v", sum.Progress, err)
			if err == nil && sum.Complete() && len(e.srv.Payments()) != len(ids) {
				t.Errorf("run reported complete with %d of %d customers charged", len(e.srv.Payments()), len(ids))
			}
			if sum.Created > len(e.srv.Payments()) {
				t.Errorf("run reported %d created, the fake holds %d", sum.Created, len(e.srv.Payments()))
			}
			pool2.Close()
			e.exec(`UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE state = 'pending'`)
			sum, err = e.biller().Run(ctx, period, billing.Customers(ids...), nil)
			if err != nil || !sum.Complete() {
				t.Fatalf("next run: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, ids)
			e.srv.Advance(25 * time.Hour)
			e.ageAll(25 * time.Hour)
			sum, err = e.biller().Run(ctx, period, billing.Customers(ids...), nil)
			if err != nil || !sum.Complete() || sum.Created != 0 {
				t.Fatalf("run a day later: %+v, %v", sum.Progress, err)
			}
			wantAllOnce(t, e.srv, ids)
		})
	}
}

// Many replicas and goroutines bill the same customers through seeded
// faults (lost answers, stored and unstored 500s, lock timeouts); a clean
// run then finishes. Everyone is charged exactly once. Run with -race.
func TestConcurrentReplicasWithFaultsChargeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.SetScript(faults(7, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.15, billingtest.FaultErrorBefore: 0.1, billingtest.FaultErrorAfter: 0.1,
		billingtest.FaultLockTimeout: 0.1, billingtest.FaultDrop: 0.05,
	}))
	cs := customers(20)
	var wg sync.WaitGroup
	for i := range 4 {
		b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 2 })
		for g := range 3 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				rng := rand.New(rand.NewSource(int64(i*10 + g)))
				if g == 0 {
					b.Run(ctx, period, billing.Customers(cs...), &billing.RunOptions{Concurrency: 4, BatchSize: 7})
					return
				}
				for _, k := range rng.Perm(len(cs)) {
					b.Charge(ctx, cs[k], period, nil)
				}
			}()
		}
	}
	wg.Wait()
	faults := 0
	for _, n := range e.srv.Stats().Faults {
		faults += int(n)
	}
	if faults < 10 {
		t.Fatalf("only %d faults injected; the scenario did not happen", faults)
	}
	e.srv.SetScript(nil)
	e.exec("UPDATE billonce_claims SET lease_until = now() WHERE state = 'pending'")
	sum, err := e.biller().Run(ctx, period, billing.Customers(cs...), nil)
	for _, c := range cs {
		if n := e.count(c); n != 1 {
			t.Errorf("%s charged %d times", c, n)
		}
	}
	if err != nil || !sum.Complete() {
		t.Errorf("final run = %+v, %v", sum.Progress, err)
	}
}
