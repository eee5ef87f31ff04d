package billing_test

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// envRecordCrash starts TestHelperRecordCrash as the runner that dies.
const envRecordCrash = "BILLONCE_TEST_RECORD_CRASH"

// A Run records the charges Stripe made many per round trip. A runner
// killed after Stripe answered but before the round trip that records the
// answer leaves those claims pending: the next run resumes them with the
// same keys and Stripe replays the charges, inside the key's window; past
// the window it finds them by search instead of sending. Either way every
// customer is charged once, counted at the fake.
func TestRunCrashBeforeRecording(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		after time.Duration   // time passing after the crash; 0: the lease only
		want  billing.Outcome // how the next run settles a charge made before the crash
	}{
		{"inside the window", 0, billing.Replayed},
		{"after the window", 25 * time.Hour, billing.Reconciled},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			const n = 40
			ids := customers(n)
			paid := killBeforeRecording(t, e, n)
			if paid == 0 {
				t.Fatal("the runner died before Stripe made any charge")
			}
			var succeeded int
			if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM billonce_claims WHERE state <> 'pending'").Scan(&succeeded); err != nil {
				t.Fatal(err)
			}
			if succeeded != 0 {
				t.Fatalf("%d claims were settled although no outcome was written", succeeded)
			}
			t.Logf("the runner died with %d charges made at Stripe and none recorded", paid)

			if tc.after > 0 {
				e.exec(`UPDATE billonce_claims SET created_at = created_at - $1 * interval '1 microsecond',
					first_sent_at = first_sent_at - $1 * interval '1 microsecond', lease_until = lease_until - $1 * interval '1 microsecond'`,
					tc.after.Microseconds())
				e.srv.Advance(tc.after)
			} else {
				time.Sleep(recordCrashLease + 100*time.Millisecond) // the dead runner's leases run out
			}
			var mu sync.Mutex
			hows := map[billing.Outcome]int{}
			b := e.biller(func(c *billing.Config) {
				c.Observe = func(ev billing.Event) {
					if ev.Kind == billing.EventOutcome && ev.Err == nil {
						mu.Lock()
						hows[ev.Outcome]++
						mu.Unlock()
					}
				}
			})
			sum, err := b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 4})
			if err != nil {
				t.Fatal(err)
			}
			if !sum.Complete() || sum.Done != n {
				t.Fatalf("next run: %+v, failures %v", sum.Progress, sum.Failures)
			}
			t.Logf("next run: %v", hows)
			if hows[tc.want] != paid {
				t.Errorf("next run settled %d charges as %v; want the %d made before the crash", hows[tc.want], tc.want, paid)
			}
			wantAllOnce(t, e.srv, ids)
			if got := e.srv.Stats().Paid; got != n {
				t.Fatalf("the fake made %d charges; want %d", got, n)
			}
		})
	}
}

// recordCrashLease is the lease of the runner that dies.
const recordCrashLease = 500 * time.Millisecond

// dyingRunnerApp is the application_name of the dying runner's sessions.
const dyingRunnerApp = "billonce_dying_runner"

// killBeforeRecording runs TestHelperRecordCrash against e and kills it
// once a round trip carrying Stripe's answers has begun and before it
// writes them. It returns the charges Stripe made.
func killBeforeRecording(t *testing.T, e *env, n int) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// The runner's sessions carry their own application_name, so that the
	// test can wait for the database to have ended them.
	dbURL, err := url.Parse(e.pool.Config().ConnString())
	if err != nil {
		t.Fatal(err)
	}
	q := dbURL.Query()
	q.Set("application_name", dyingRunnerApp)
	dbURL.RawQuery = q.Encode()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestHelperRecordCrash$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), envRecordCrash+"=1", envStripe+"="+e.srv.URL,
		envN+"="+strconv.Itoa(n), pgtest.EnvURL+"="+dbURL.String())
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var lines []string
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "HOLDING ") {
			cmd.Process.Kill()
			cmd.Wait()
			// A statement the runner sent before it died (a batch of
			// claims) may still commit: wait until the server has ended
			// its sessions, so that what the test reads and changes next
			// is all the runner left behind.
			waitFor(t, func() bool {
				var sessions int
				err := e.pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
					WHERE datname = current_database() AND application_name = $1`, dyingRunnerApp).Scan(&sessions)
				return err == nil && sessions == 0
			})
			return int(e.srv.Stats().Paid)
		}
	}
	cmd.Wait()
	t.Fatalf("the runner never held an outcome:\n%s", strings.Join(lines, "\n"))
	return 0
}

// holdingStore is a claim store whose round trips carrying successes never
// reach the database: the process is killed while they wait.
type holdingStore struct {
	batchingStore
	gate *sendGate
}

func (s holdingStore) CheckSendSucceed(ctx context.Context, window time.Duration, checks []claimengine.SendCheck, done []claimengine.Success) ([]error, []error) {
	if len(done) > 0 {
		// Stripe's answers to the requests other workers have in flight
		// are awaited, so that every charge the runner made is at the fake
		// when it is killed.
		s.gate.close()
		fmt.Printf("HOLDING %d outcomes\n", len(done))
		select {}
	}
	return s.Batcher.CheckSendSucceed(ctx, window, checks, done)
}

// sendGate carries the dying runner's requests to Stripe until it is
// closed; close waits for the answers to those in flight, and requests
// after it never leave.
type sendGate struct {
	mu       sync.Mutex
	closed   bool
	inflight sync.WaitGroup
}

func (g *sendGate) RoundTrip(req *http.Request) (*http.Response, error) {
	g.mu.Lock()
	if g.closed {
		g.mu.Unlock()
		select {}
	}
	g.inflight.Add(1)
	g.mu.Unlock()
	defer g.inflight.Done()
	return testTransport.RoundTrip(req)
}

func (g *sendGate) close() {
	g.mu.Lock()
	g.closed = true
	g.mu.Unlock()
	g.inflight.Wait()
}

// TestHelperRecordCrash is the runner TestRunCrashBeforeRecording kills.
func TestHelperRecordCrash(t *testing.T) {
	if os.Getenv(envRecordCrash) == "" {
		t.Skip("the runner started and killed by TestRunCrashBeforeRecording")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(pgtest.EnvURL))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{Lease: recordCrashLease})
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.Atoi(os.Getenv(envN))
	if err != nil {
		t.Fatal(err)
	}
	gate := &sendGate{}
	b, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: os.Getenv(envStripe), Claims: holdingStore{wrapBatching(store), gate},
		HTTPClient: &http.Client{Transport: gate}, Price: flatPrice(amount), RateLimit: -1, Retry: fastRetry(), Owner: "dies"})
	if err != nil {
		t.Fatal(err)
	}
	b.Run(ctx, period, billing.Customers(customers(n)...), &billing.RunOptions{Concurrency: 4, BatchSize: 10})
	t.Fatal("the run ended; it should have been killed")
}

// A Run sends the first attempt of a claim it has just won without asking
// the store again only while half the claim's lease is left. A customer
// that waited longer in the run is checked: if another runner took its
// claim over meanwhile, this run does not send the key at all.
func TestRunChecksClaimsThatWaited(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	short, err := claim.NewPostgres(e.pool, claim.Config{Lease: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	// cus_00000 takes a second to answer; cus_00001 waits for the one
	// worker meanwhile, and another runner resumes its claim.
	e.srv.FailNext(billingtest.Match{Customer: "cus_00000"}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: time.Second})
	first := e.biller(func(c *billing.Config) { c.Claims = short })
	done := make(chan billing.Summary, 1)
	go func() {
		sum, _ := first.Run(context.Background(), period, billing.Customers("cus_00000", "cus_00001"), &billing.RunOptions{Concurrency: 1})
		done <- sum
	}()
	// Once the run has claimed both and cus_00001's lease has run out on
	// the database clock (cus_00000 is still at Stripe), take it over.
	waitFor(t, func() bool {
		var expired bool
		err := e.pool.QueryRow(context.Background(), "SELECT lease_until < now() FROM billonce_claims WHERE customer = 'cus_00001'").Scan(&expired)
		return err == nil && expired
	})
	if _, err := e.biller(func(c *billing.Config) { c.Claims = short }).Charge(context.Background(), "cus_00001", period, nil); err != nil {
		t.Fatal(err)
	}
	sum := <-done
	t.Logf("first run: %+v %v", sum.Progress, sum.Failures)
	sends := 0
	for _, en := range e.srv.Log() {
		if en.Customer == "cus_00001" && en.Method == "POST" {
			sends++
		}
	}
	if sends != 1 {
		t.Errorf("cus_00001's key was sent %d times; want once, by the runner that took it over", sends)
	}
	wantAllOnce(t, e.srv, []string{"cus_00000", "cus_00001"})
}
