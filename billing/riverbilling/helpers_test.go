package riverbilling_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

const (
	period    = "2026-09"
	amount    = 2500
	secretKey = "sk_test_51RiverS3cretNeverLogMe000000000000wxyz"
)

var testTransport = http.DefaultTransport.(*http.Transport).Clone()

// env is one test's world: a fake Stripe, a fresh database with River's
// tables (applied with rivermigrate) and the claim table.
type env struct {
	tb     testing.TB
	srv    *billingtest.Server
	pool   *pgxpool.Pool
	store  *claim.Postgres
	driver *riverpgxv5.Driver
}

func newEnv(tb testing.TB, srvCfg billingtest.Config) *env {
	tb.Helper()
	ctx := context.Background()
	srv := billingtest.NewServer(srvCfg)
	tb.Cleanup(srv.Close)
	e := &env{tb: tb, srv: srv, pool: pgtest.Pool(tb)}
	e.driver = riverpgxv5.New(e.pool)
	m, err := rivermigrate.New(e.driver, nil)
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		tb.Fatal(err)
	}
	if e.store, err = claim.NewPostgres(e.pool, claim.Config{}); err != nil {
		tb.Fatal(err)
	}
	if err := e.store.Migrate(ctx); err != nil {
		tb.Fatal(err)
	}
	return e
}

// biller returns a Biller on the env's fake and claims, like one replica.
func (e *env) biller(opts ...func(*billing.Config)) *billing.Biller {
	e.tb.Helper()
	cfg := billing.Config{
		SecretKey: secretKey,
		StripeURL: e.srv.URL,
		Claims:    e.store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: "usd"}, nil
		},
		RateLimit:  -1,
		HTTPClient: &http.Client{Transport: testTransport},
		Retry: retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond,
			MaxAttempts: 6, AttemptTimeout: 5 * time.Second, MaxElapsed: 30 * time.Second},
	}
	for _, o := range opts {
		o(&cfg)
	}
	b, err := billing.New(cfg)
	if err != nil {
		e.tb.Fatal(err)
	}
	return b
}

func oneAttempt(c *billing.Config) { c.Retry.MaxAttempts = 1 }

// worker returns a charge worker on b whose retries come back at once.
func (e *env) worker(b *billing.Biller) *riverbilling.Worker {
	e.tb.Helper()
	w, err := riverbilling.NewWorker(b, riverbilling.WorkerConfig{RetryInterval: 10 * time.Millisecond, MaxRetryInterval: 50 * time.Millisecond})
	if err != nil {
		e.tb.Fatal(err)
	}
	return w
}

// usageWorker returns a usage worker on b whose retries come back at once.
func (e *env) usageWorker(b *billing.Biller) *riverbilling.UsageWorker {
	e.tb.Helper()
	w, err := riverbilling.NewUsageWorker(b, riverbilling.WorkerConfig{RetryInterval: 10 * time.Millisecond, MaxRetryInterval: 50 * time.Millisecond})
	if err != nil {
		e.tb.Fatal(err)
	}
	return w
}

// riverConfig is a River configuration with the charge, usage and
// money-out workers on b and a fan-out worker over customers.
func (e *env) riverConfig(b *billing.Biller, customers []string) *river.Config {
	e.tb.Helper()
	workers := river.NewWorkers()
	river.AddWorker(workers, e.worker(b))
	river.AddWorker(workers, e.usageWorker(b))
	river.AddWorker(workers, e.moneyOutWorker(b))
	fo, err := riverbilling.NewFanOutWorker(riverbilling.FanOutConfig{
		DB: e.pool,
		Customers: func(context.Context, string) iter.Seq2[billing.Item, error] {
			return billing.Customers(customers...)
		},
		BatchSize: 50,
	})
	if err != nil {
		e.tb.Fatal(err)
	}
	river.AddWorker(workers, fo)
	return &river.Config{
		Queues:            map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: 8}},
		Workers:           workers,
		FetchCooldown:     10 * time.Millisecond,
		FetchPollInterval: 50 * time.Millisecond,
		Logger:            quietLogger,
		TestOnly:          true,
	}
}

// client returns a River client on cfg, not started.
func (e *env) client(cfg *river.Config) *river.Client[pgx.Tx] {
	e.tb.Helper()
	c, err := river.NewClient(e.driver, cfg)
	if err != nil {
		e.tb.Fatal(err)
	}
	return c
}

// start starts c and stops it when the test ends.
func (e *env) start(c *river.Client[pgx.Tx]) {
	e.tb.Helper()
	if err := c.Start(context.Background()); err != nil {
		e.tb.Fatal(err)
	}
	e.tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = c.Stop(ctx)
	})
}

// state reads the period's state.
func (e *env) state() riverbilling.PeriodState {
	e.tb.Helper()
	st, err := riverbilling.State(context.Background(), e.pool, e.store, period)
	if err != nil {
		e.tb.Fatal(err)
	}
	return st
}

// waitFinished waits until n charge jobs of the period are completed,
// cancelled or discarded and none is waiting or running.
func (e *env) waitFinished(n int) riverbilling.PeriodState {
	e.tb.Helper()
	for {
		st := e.state()
		j := st.Jobs
		done := j[rivertype.JobStateCompleted] + j[rivertype.JobStateCancelled] + j[rivertype.JobStateDiscarded]
		if done == n && done == sum(j) {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// waitSettled waits until n claims of the period are settled (succeeded
// or failed) and no charge job of it is waiting or running: the jobs of
// several customers and the jobs of one that they handed on are final.
func (e *env) waitSettled(n int) riverbilling.PeriodState {
	e.tb.Helper()
	for {
		st := e.state()
		j := st.Jobs
		final := j[rivertype.JobStateCompleted] + j[rivertype.JobStateCancelled] + j[rivertype.JobStateDiscarded]
		if st.Claims["succeeded"]+st.Claims["failed"] == n && final == sum(j) {
			return st
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func sum[K comparable](m map[K]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// count is how many charges the fake holds for customer in the period.
func (e *env) count(customer string) int { return e.srv.CountPeriod(customer, period) }

// creates counts the create requests (POST, retries included) the fake received for customer.
func (e *env) creates(customer string) int {
	n := 0
	for _, r := range e.srv.Log() {
		if r.Method == http.MethodPost && r.Customer == customer {
			n++
		}
	}
	return n
}

func (e *env) exec(sql string, args ...any) {
	e.tb.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.tb.Fatal(err)
	}
}

// advance moves time forward by d for the fake Stripe and the claim table
// at once, as billing's own tests do: the fake's clock moves, and every
// time on the claim table moves back by d, but a usage report's window,
// which is its identity.
func (e *env) advance(d time.Duration) {
	e.tb.Helper()
	rows, err := e.pool.Query(context.Background(), `SELECT column_name FROM information_schema.columns
		WHERE table_name = 'billonce_claims' AND data_type LIKE 'timestamp%' AND column_name NOT IN ('window_start', 'window_end')`)
	if err != nil {
		e.tb.Fatal(err)
	}
	cols, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		e.tb.Fatal(err)
	}
	sets := make([]string, len(cols))
	for i, c := range cols {
		sets[i] = fmt.Sprintf("%s = %s - $1 * interval '1 microsecond'", c, c)
	}
	e.exec("UPDATE billonce_claims SET "+strings.Join(sets, ", "), d.Microseconds())
	e.srv.Advance(d)
}

// lostAnswer charges customer through b while the answer is lost after
// Stripe committed and Stripe's search is down, with no retry: the charge
// exists, the claim stays pending with b's lease.
func (e *env) lostAnswer(b *billing.Biller, customer string) {
	e.tb.Helper()
	e.srv.FailNext(billingtest.Match{Customer: customer}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	defer e.srv.SetScript(nil)
	_, err := b.Charge(context.Background(), customer, period, nil)
	if err == nil {
		e.tb.Fatalf("charge with a lost answer succeeded, want an unknown outcome")
	}
	if n := e.count(customer); n != 1 {
		e.tb.Fatalf("%d charges after the lost answer, want 1", n)
	}
}

// searchDown makes Stripe's search, and its list of invoices, fail until
// SetScript(nil): nothing can find what a lost answer made.
func (e *env) searchDown() {
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") || r.Method == http.MethodGet && r.Path == "/v1/invoices" {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
}

func customers(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("cus_%05d", i)
	}
	return ids
}

var quietLogger = slog.New(slog.DiscardHandler)

const (
	upstreamKey = "sk_test_51UpstreamHeldByProxyNeverLogMe00000wxyz"
	vaultKey    = "vault_key_river_attack4_secret_tail_0123456789"
)

func pmPrice(context.Context, string, string) (billing.Price, error) {
	return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
}

func lastErr(j *rivertype.JobRow) string {
	if len(j.Errors) == 0 {
		return ""
	}
	return j.Errors[len(j.Errors)-1].Error
}

// waitJob waits until job id's row satisfies done, and returns it.
func waitJob(t *testing.T, e *env, id int64, done func(*rivertype.JobRow) bool) *rivertype.JobRow {
	t.Helper()
	for {
		var state string
		var at *time.Time
		if err := e.pool.QueryRow(context.Background(), "SELECT state::text, attempted_at FROM river_job WHERE id = $1", id).Scan(&state, &at); err != nil {
			t.Fatal(err)
		}
		j := &rivertype.JobRow{ID: id, State: rivertype.JobState(state), AttemptedAt: at}
		if done(j) {
			return j
		}
		time.Sleep(20 * time.Millisecond)
	}
}
