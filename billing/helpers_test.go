package billing_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"
	"sync"
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
	if raw := os.Getenv(usageReporterEnv); raw != "" {
		os.Exit(usageReporter(raw)) // a reporting process of TestOverlappingUsageWindowsFromTwoProcessesSendOne
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

// serverWaitsSkipped keeps Classify's decisions but not the waits it asks
// for on a 409 or a 429 rate_limit: the retries happen after fastRetry's
// backoff instead. It is for tests in which those waits are only time
// spent; the number of attempts and every answer stay the same. The waits
// themselves are checked in classify_test.go.
func serverWaitsSkipped(c *billing.Config) {
	c.Retry.Classify = func(err error) retry.Decision {
		if d := billing.Classify(err); d.Retry() {
			return retry.After(0)
		}
		return retry.Stop()
	}
}

func flatPrice(amount int64) func(context.Context, string, string) (billing.Price, error) {
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

// rotatedKey is the Stripe key after a rotation.
const rotatedKey = "sk_test_rotatedKey000000000000000000000000000abcd"

// lateTransport delivers the first POST carrying key late: the request has
// left the Biller (its CheckSend passed) but reaches Stripe only when
// release is closed, as a request does that sits in a network or proxy
// queue for part of its attempt timeout.
type lateTransport struct {
	base    http.RoundTripper
	key     string
	held    chan struct{} // closed once the request is held
	release chan struct{}
	once    sync.Once
}

func newLateTransport(key string) *lateTransport {
	return &lateTransport{base: testTransport, key: key, held: make(chan struct{}), release: make(chan struct{})}
}

func (t *lateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && r.Header.Get("Idempotency-Key") == t.key {
		first := false
		t.once.Do(func() { first = true })
		if first {
			close(t.held)
			<-t.release
		}
	}
	return t.base.RoundTrip(r)
}

// dropThenRefuse is a fault script for customer's key: its first POST is
// committed and the connection closed before a byte of the answer (a load
// balancer closing a keep-alive connection); net/http resends the POST by
// itself, as it does for any request with an Idempotency-Key on a reused
// connection, and that resend is refused with refusal before execution.
// Searches are down.
func dropThenRefuse(key string, refusal billingtest.Fault) func(billingtest.Request) billingtest.Fault {
	return func(r billingtest.Request) billingtest.Fault {
		switch {
		case strings.HasSuffix(r.Path, "/search"):
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		case r.Method == http.MethodPost && r.IdempotencyKey == key && r.Attempt == 1:
			return billingtest.Fault{Kind: billingtest.FaultDrop}
		case r.Method == http.MethodPost && r.IdempotencyKey == key:
			return refusal
		}
		return billingtest.Fault{}
	}
}

// chargeEvent builds a signable event about a charge, as Stripe would send it.
func chargeEvent(t *testing.T, id, typ, chargeID, status, key, customer string, created time.Time) billingtest.Event {
	t.Helper()
	obj := map[string]any{"id": chargeID, "object": "charge", "amount": amount, "amount_refunded": 0, "status": status,
		"currency": "usd", "customer": customer, "created": created.Unix(), "failure_code": "insufficient_funds",
		"metadata": map[string]string{billing.MetaKey: key, billing.MetaCustomer: customer, billing.MetaPeriod: period}}
	body, err := json.Marshal(map[string]any{"id": id, "object": "event", "api_version": billingtest.APIVersion,
		"created": created.Unix(), "type": typ, "livemode": false, "pending_webhooks": 1,
		"data": map[string]any{"object": obj}})
	if err != nil {
		t.Fatal(err)
	}
	return billingtest.Event{ID: id, Type: typ, ObjectID: chargeID, Created: created, Body: body}
}

func (h *hookEnv) deliverAll() {
	h.tb.Helper()
	for _, ev := range h.srv.Events() {
		h.deliver(ev)
	}
}

func (h *hookEnv) claimOf2(customer string, attempt int) claim.Claim {
	h.tb.Helper()
	k, err := h.b.Key(customer, period, attempt)
	if err != nil {
		h.tb.Fatal(err)
	}
	c, err := h.store.Get(context.Background(), k.String())
	if err != nil {
		h.tb.Fatal(err)
	}
	return c
}

func firstSendSafeDBClockJump(t *testing.T, change func(*billing.Config)) {
	e := newEnv(t)
	ctx := context.Background()
	rotated := e.biller(change)
	var once bool
	var bErr error
	a := e.biller(func(c *billing.Config) {
		c.Observe = func(ev billing.Event) {
			if ev.Kind != billing.EventStripeCall || ev.Customer != "cus_1" || once {
				return
			}
			once = true
			// The database's clock jumps 25 hours: cus_2's lease and
			// window are over as the database sees them.
			e.exec(`UPDATE billonce_claims SET lease_until = now() - interval '1 second',
				first_sent_at = first_sent_at - interval '25 hours', created_at = created_at - interval '25 hours'
				WHERE key = $1`, e.key("cus_2"))
			_, bErr = rotated.Charge(ctx, "cus_2", period, nil)
		}
	})
	sum, err := a.Run(ctx, period, billing.Customers("cus_1", "cus_2"), &billing.RunOptions{Concurrency: 1, BatchSize: 2})
	if !once {
		t.Fatal("setup: the intrusion never ran")
	}
	if n := e.count("cus_2"); n != 1 {
		t.Fatalf("cus_2 charged %d times; the rotated replica's Charge = %v; Run = %+v, %v", n, bErr, sum, err)
	}
}

// cancelStore cancels the caller's context after its n-th call (counted
// across all methods) returns, so that every later step meets a cancelled
// context: a runner whose caller gives up at exactly that point.
type cancelStore struct {
	testStore
	mu     sync.Mutex
	calls  int
	at     int
	before bool // cancel before the n-th call instead of after it
	cancel context.CancelFunc
}

func (s *cancelStore) step() func() {
	s.mu.Lock()
	s.calls++
	n := s.calls
	s.mu.Unlock()
	if n == s.at && s.before {
		s.cancel()
	}
	return func() {
		if n == s.at && !s.before {
			s.cancel()
		}
	}
}

func (s *cancelStore) Claim(ctx context.Context, r claimengine.Request) (claimResult, error) {
	defer s.step()()
	return s.claimEngine.Claim(ctx, r)
}

func (s *cancelStore) ClaimBatch(ctx context.Context, r []claimengine.Request) ([]claimResult, error) {
	defer s.step()()
	return s.claimEngine.ClaimBatch(ctx, r)
}

func (s *cancelStore) CheckSend(ctx context.Context, key, owner string, w time.Duration) error {
	defer s.step()()
	return s.claimEngine.CheckSend(ctx, key, owner, w)
}

func (s *cancelStore) Succeed(ctx context.Context, key, id string) error {
	defer s.step()()
	return s.claimEngine.Succeed(ctx, key, id)
}

func (s *cancelStore) Release(ctx context.Context, key, owner, stripeID, why string) error {
	defer s.step()()
	return s.claimEngine.Release(ctx, key, owner, stripeID, why)
}

func (s *cancelStore) Abandon(ctx context.Context, key, owner string) error {
	defer s.step()()
	return s.claimEngine.Abandon(ctx, key, owner)
}

func (s *cancelStore) Get(ctx context.Context, key string) (claim.Claim, error) {
	defer s.step()()
	return s.Store.Get(ctx, key)
}

func (s *cancelStore) Reopen(ctx context.Context, key, owner, ep, cred string) error {
	defer s.step()()
	return s.claimEngine.Reopen(ctx, key, owner, ep, cred)
}

// batchCancelStore is a cancelStore that also records in batches, as
// claim.Postgres does, so that a Run takes the batching path; with
// failDone its n-th batch fails to record the successes it carries (the
// database went away after Stripe answered).
type batchCancelStore struct {
	*cancelStore
	pg     *claim.Postgres
	failAt int // fail the failAt-th batch that records successes; 0: never
	mu     sync.Mutex
	dones  int
}

func (s *batchCancelStore) failed() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.failAt > 0 && s.dones >= s.failAt
}

func (s *batchCancelStore) CheckSendSucceed(ctx context.Context, w time.Duration, checks []claimengine.SendCheck, done []claimengine.Success) ([]error, []error) {
	if s.failAt > 0 {
		if len(done) > 0 {
			s.mu.Lock()
			s.dones++
			n := s.dones
			s.mu.Unlock()
			if n == s.failAt {
				checkErrs, _ := batcherOf(s.pg).CheckSendSucceed(ctx, w, checks, nil)
				doneErrs := make([]error, len(done))
				for i := range doneErrs {
					doneErrs[i] = errors.New("connection reset by peer")
				}
				return checkErrs, doneErrs
			}
		}
		return batcherOf(s.pg).CheckSendSucceed(ctx, w, checks, done)
	}
	defer s.step()()
	return batcherOf(s.pg).CheckSendSucceed(ctx, w, checks, done)
}

// cancelTransport cancels the request's context once Stripe has answered,
// before the body is read: the charge exists and the caller stops.
type cancelTransport struct {
	mu     sync.Mutex
	n, at  int
	cancel context.CancelFunc
}

func (t *cancelTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := testTransport.RoundTrip(r)
	t.mu.Lock()
	t.n++
	hit := t.n == t.at
	t.mu.Unlock()
	if hit {
		t.cancel()
	}
	return resp, err
}

// ageAll moves every claim's times back by d on the database clock.
func (e *env) ageAll(d time.Duration) {
	e.tb.Helper()
	e.exec(`UPDATE billonce_claims SET created_at = created_at - $1 * interval '1 microsecond',
		first_sent_at = first_sent_at - $1 * interval '1 microsecond',
		updated_at = updated_at - $1 * interval '1 microsecond',
		lease_until = lease_until - $1 * interval '1 microsecond'`, d.Microseconds())
}

// pausingStore is a real claim store whose Claim and Abandon of chosen keys
// first run a hook: it stands for a replica that is slow between two
// statements (a GC pause, a slow network), placed exactly.
//
// A Claim of the key dieAfterClaim commits and then answers an error, as if
// its process died right after the statement: the claim is won and
// pending, and nothing was sent.
type pausingStore struct {
	batchingStore
	beforeClaim   map[string]func()
	beforeAbandon map[string]func()
	dieAfterClaim string
}

func (s *pausingStore) Claim(ctx context.Context, req claimengine.Request) (claimResult, error) {
	if f := s.beforeClaim[req.Key]; f != nil {
		f()
	}
	res, err := s.claimEngine.Claim(ctx, req)
	if err == nil && req.Key == s.dieAfterClaim {
		return res, errors.New("the runner died")
	}
	return res, err
}

func (s *pausingStore) Abandon(ctx context.Context, key, owner string) error {
	if f := s.beforeAbandon[key]; f != nil {
		f()
	}
	return s.claimEngine.Abandon(ctx, key, owner)
}

// rebill3PastAbandoned2 declines cus's attempt 1, then runs the race: Rebill(3)
// looks for attempt 2's claim while Rebill(2) is under way, and finds it;
// Rebill(2) is then refused before execution (a revoked key) and abandons
// its claim, which deletes it; Rebill(3) then claims. Attempt 2 has no
// claim: if attempt 3 paid, that is the skipped number the check is there
// to refuse. With die, Rebill(3)'s replica dies right after its claim
// commits.
func rebill3PastAbandoned2(t *testing.T, e *env, cus string, die bool) (billing.Receipt, error) {
	t.Helper()
	ctx := context.Background()
	e.srv.Decline(cus, "insufficient_funds")
	if _, err := e.b.Charge(ctx, cus, period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor(cus)
	k2, _ := e.b.Key(cus, period, 2)
	k3, _ := e.b.Key(cus, period, 3)

	checked := make(chan struct{}) // Rebill(3) has looked at attempt 2
	done2 := make(chan struct{})   // Rebill(2) has returned
	s2 := &pausingStore{batchingStore: wrapBatching(e.store), beforeAbandon: map[string]func(){k2.String(): func() { <-checked }}}
	s3 := &pausingStore{batchingStore: wrapBatching(e.store), beforeClaim: map[string]func(){k3.String(): func() { close(checked); <-done2 }}}
	if die {
		s3.dieAfterClaim = k3.String()
	}
	b2 := e.biller(func(c *billing.Config) { c.Claims = s2 })
	b3 := e.biller(func(c *billing.Config) { c.Claims = s3 })

	e.srv.FailNext(billingtest.Match{Customer: cus}, billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized})
	go func() {
		defer close(done2)
		_, err := b2.Rebill(ctx, cus, period, 2, nil)
		t.Logf("Rebill(2): %v", err)
	}()
	// Rebill(3) may start only once Rebill(2) holds its claim.
	waitFor(t, func() bool { _, err := e.store.Get(ctx, k2.String()); return err == nil })
	r3, err3 := b3.Rebill(ctx, cus, period, 3, nil)
	<-done2
	t.Logf("Rebill(3) = %+v, %v", r3, err3)
	return r3, err3
}

// requireBilledOnceAfter checks the end of a re-bill race: a Rebill(3) that
// paid nothing was refused as invalid, so Rebill(2) bills; either way
// Charge reports the period billed and the fake holds one charge.
func requireBilledOnceAfter(t *testing.T, e *env, cus string, r3 billing.Receipt, err3 error) {
	t.Helper()
	ctx := context.Background()
	if n := e.srv.CountPeriod(cus, period); n == 0 {
		// Refused: the re-bill that follows the decline is attempt 2 again.
		if !errors.Is(err3, billing.ErrInvalid) {
			t.Fatalf("Rebill(3) paid nothing but reported %+v, %v; want ErrInvalid", r3, err3)
		}
		if _, err := e.b.Rebill(ctx, cus, period, 2, nil); err != nil {
			t.Fatalf("Rebill(2) once the key is fixed: %v", err)
		}
	}
	r, err := e.b.Charge(ctx, cus, period, nil)
	if err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("the customer paid, but Charge reports %+v, %v", r, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, cus, period)
}

// cancelAfterClaim is a real claim store whose caller stops (a shutdown, a
// request's deadline) just as its claim of key returns.
type cancelAfterClaim struct {
	testStore
	key    string
	cancel context.CancelFunc
}

func (s cancelAfterClaim) Claim(ctx context.Context, req claimengine.Request) (claimResult, error) {
	res, err := s.claimEngine.Claim(ctx, req)
	if req.Key == s.key {
		s.cancel()
	}
	return res, err
}

var errAfterDelegating = errors.New("the store answered after the row was written: connection lost")

// failAfter is a claim store that writes, then reports a failure, for the
// methods named in fail: a crash point after the database committed.
type failAfter struct {
	testStore
	fail map[string]bool
	mu   sync.Mutex
}

func (s *failAfter) should(m string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail[m] {
		delete(s.fail, m) // once
		return true
	}
	return false
}

func (s *failAfter) Succeed(ctx context.Context, key, id string) error {
	if err := s.claimEngine.Succeed(ctx, key, id); err != nil || !s.should("Succeed") {
		return err
	}
	return errAfterDelegating
}

func (s *failAfter) Reopen(ctx context.Context, key, owner, endpoint, credential string) error {
	if err := s.claimEngine.Reopen(ctx, key, owner, endpoint, credential); err != nil || !s.should("Reopen") {
		return err
	}
	return errAfterDelegating
}

func (s *failAfter) Fail(ctx context.Context, key, stripeID, reason string) error {
	if err := s.claimEngine.Fail(ctx, key, stripeID, reason); err != nil || !s.should("Fail") {
		return err
	}
	return errAfterDelegating
}

func searchDown(r billingtest.Request) billingtest.Fault {
	if strings.HasSuffix(r.Path, "/search") {
		return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
	}
	return billingtest.Fault{}
}

// searchDownFrom fails every search from the n-th of its path on.
func searchDownFrom(n int) func(billingtest.Request) billingtest.Fault {
	return func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") && r.Attempt >= n {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	}
}

func posts(e *env, from int) int {
	n := 0
	for _, l := range e.srv.Log()[from:] {
		if l.Method == http.MethodPost {
			n++
		}
	}
	return n
}
