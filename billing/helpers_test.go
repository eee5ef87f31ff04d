package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"os"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

func TestMain(m *testing.M) {
	if raw := os.Getenv(replicaEnv); raw != "" {
		os.Exit(webhookReplica(raw)) // a webhook handler process of TestWebhookChaos
	}
	pgtest.Main(m)
}

// secretKey is the Stripe key every test Biller uses. The secrets test
// checks that it never shows up in logs, errors or the Biller's String.
const secretKey = "sk_test_51BillonceS3cretNeverLogMe00000000wxyz"

const (
	period = "2026-09"
	amount = 2500
)

// fastRetry keeps retry waits tiny so that failure-mode tests run fast. The
// 409 and 429 rate_limit waits asked for by Classify (1s and 2s) still
// apply.
func fastRetry() retry.Policy {
	return retry.Policy{
		InitialInterval: time.Millisecond,
		MaxInterval:     10 * time.Millisecond,
		MaxAttempts:     6,
		AttemptTimeout:  5 * time.Second,
		MaxElapsed:      30 * time.Second,
	}
}

func flatPrice(amount int64) billing.PriceFunc {
	return func(context.Context, string, string) (billing.Price, error) {
		return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
	}
}

// env is one test's world: a fake Stripe, a fresh PostgreSQL database with
// the claim table, and a Biller wired to both.
type env struct {
	tb    testing.TB
	srv   *billingtest.Server
	pool  *pgxpool.Pool
	store *claim.Postgres
	b     *billing.Biller
	opts  []func(*billing.Config) // the options e.b was made with
}

// testTransport carries every test client's requests.
var testTransport = http.DefaultTransport.(*http.Transport).Clone()

func newServer(tb testing.TB, cfg billingtest.Config) *billingtest.Server {
	tb.Helper()
	return billingtest.Start(tb, cfg)
}

func newStore(tb testing.TB, pool *pgxpool.Pool) *claim.Postgres {
	tb.Helper()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return store
}

// newEnv starts a fake Stripe and a database and returns a Biller on them;
// opts adjust the Biller's Config.
func newEnv(tb testing.TB, opts ...func(*billing.Config)) *env {
	tb.Helper()
	return newEnvWith(tb, billingtest.Config{}, opts...)
}

func newEnvWith(tb testing.TB, srvCfg billingtest.Config, opts ...func(*billing.Config)) *env {
	tb.Helper()
	e := &env{tb: tb, srv: newServer(tb, srvCfg), pool: pgtest.Pool(tb), opts: opts}
	e.store = newStore(tb, e.pool)
	e.b = e.biller(opts...)
	return e
}

// biller returns a Biller on the env's fake and store. Each has an owner of
// its own unless opts set one, like a separate replica.
func (e *env) biller(opts ...func(*billing.Config)) *billing.Biller {
	e.tb.Helper()
	cfg := billing.Config{
		SecretKey: secretKey,
		StripeURL: e.srv.URL,
		Claims:    e.store,
		Price:     flatPrice(amount),
		RateLimit: -1,
		// Timeout is replaced by Retry.AttemptTimeout.
		HTTPClient: &http.Client{Transport: testTransport},
		Retry:      fastRetry(),
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

func (e *env) key(customer string) string {
	e.tb.Helper()
	k, err := e.b.Key(customer, period, 1)
	if err != nil {
		e.tb.Fatal(err)
	}
	return k.String()
}

// claimOf returns the claim row of customer's first attempt for period.
func (e *env) claimOf(customer string) claim.Claim {
	e.tb.Helper()
	c, err := e.store.Get(context.Background(), e.key(customer))
	if err != nil {
		e.tb.Fatalf("claim of %s: %v", customer, err)
	}
	return c
}

func (e *env) claimRows() int {
	e.tb.Helper()
	var n int
	if err := e.pool.QueryRow(context.Background(), "SELECT count(*) FROM billonce_claims").Scan(&n); err != nil {
		e.tb.Fatal(err)
	}
	return n
}

func (e *env) exec(sql string, args ...any) {
	e.tb.Helper()
	if _, err := e.pool.Exec(context.Background(), sql, args...); err != nil {
		e.tb.Fatal(err)
	}
}

// crashedClaim leaves the state of a runner configured like e.b that
// claimed customer and died before sending: a pending claim, owned by
// someone else, whose lease has run out.
func (e *env) crashedClaim(customer string, amt int64) string {
	e.tb.Helper()
	opts := append(append([]func(*billing.Config){}, e.opts...), func(c *billing.Config) {
		c.Claims = crashAfterClaim{wrapStore(e.store)}
		c.Price = flatPrice(amt)
	})
	if _, err := e.biller(opts...).Charge(context.Background(), customer, period, nil); !errors.Is(err, errCrashed) {
		e.tb.Fatalf("crashing runner: %v", err)
	}
	key := e.key(customer)
	e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE key = $1", key)
	return key
}

var errCrashed = errors.New("the runner crashed")

// The claim engine, as billing drives it.
type (
	claimEngine  = claimengine.Engine[claim.Claim]
	claimResult  = claimengine.Result[claim.Claim]
	claimApplied = claimengine.Applied[claim.Claim]
)

// engineOf returns the engine of s.
func engineOf(s claim.Store) claimEngine { return claimengine.Of[claim.Claim](s) }

// batcherOf returns the batching engine of s.
func batcherOf(s *claim.Postgres) claimengine.Batcher {
	return engineOf(s).(claimengine.Batcher)
}

// A testStore is a claim store a test wraps: a wrapper embeds it and
// overrides the engine methods it intercepts. It does not batch, so a Run
// over it checks and records each charge on its own, through the
// wrapper's methods.
type testStore struct {
	claim.Store
	claimEngine
}

func wrapStore(s claim.Store) testStore { return testStore{s, engineOf(s)} }

func (s testStore) Get(ctx context.Context, key string) (claim.Claim, error) {
	return s.claimEngine.Get(ctx, key)
}

// A batchingStore is a testStore that batches, as claim.Postgres does.
type batchingStore struct {
	testStore
	claimengine.Batcher
}

func wrapBatching(s *claim.Postgres) batchingStore { return batchingStore{wrapStore(s), batcherOf(s)} }

// crashAfterClaim is a claim store whose runner dies as soon as its claim
// is committed.
type crashAfterClaim struct{ testStore }

func (s crashAfterClaim) Claim(ctx context.Context, r claimengine.Request) (claimResult, error) {
	if _, err := s.claimEngine.Claim(ctx, r); err != nil {
		return claimResult{}, err
	}
	return claimResult{}, errCrashed
}

// ageClaim moves a claim's creation back on the database's clock.
func (e *env) ageClaim(key string, age time.Duration) {
	e.tb.Helper()
	e.exec(`UPDATE billonce_claims SET created_at = now() - $2 * interval '1 microsecond', first_sent_at = now() - $2 * interval '1 microsecond',
		lease_until = now() - interval '1 second' WHERE key = $1`,
		key, age.Microseconds())
}

// chargeDirect makes, with stripe-go and the Biller's own key, parameters and
// API key, the charge a Biller would make: what a runner that crashed after
// Stripe answered left behind.
func (e *env) chargeDirect(customer, key string, amt int64) *stripe.Charge {
	e.tb.Helper()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.srv.URL),
		HTTPClient:        &http.Client{Transport: testTransport, Timeout: 10 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	c := charge.Client{B: backend, Key: secretKey}
	params := &stripe.ChargeParams{Amount: stripe.Int64(amt), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
	params.IdempotencyKey = stripe.String(key)
	params.Metadata = map[string]string{billing.MetaKey: key, billing.MetaCustomer: customer, billing.MetaPeriod: period}
	ch, err := c.New(params)
	if err != nil {
		e.tb.Fatalf("direct charge: %v", err)
	}
	return ch
}

func (e *env) count(customer string) int { return e.srv.CountPeriod(customer, period) }

func customers(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("cus_%05d", i)
	}
	return out
}

// faults is billingtest.RandomFaults for rates known to be valid.
func faults(seed int64, rates map[billingtest.FaultKind]float64) func(billingtest.Request) billingtest.Fault {
	f, err := billingtest.RandomFaults(seed, rates)
	if err != nil {
		panic(err)
	}
	return f
}
