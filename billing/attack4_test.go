package billing_test

// Attacks through the public API: re-bill numbering, a context cancelled
// at every step, configuration that changes between runs. The oracle is
// the fake Stripe's ledger.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// A re-bill that skips a number (attempt 3 after a declined attempt 1,
// with no attempt 2) would bill the period where Charge and Run, walking
// the attempts in order from the decline, cannot see it: they would report
// attempt 1's decline for a customer who has paid, and send a dunning
// process after them. Such a re-bill is refused before anything is sent;
// the consecutive one bills, and is then reported as billed.
func TestAttack4RebillSkippedNumberThenCharge(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_s", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_s", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor("cus_s")
	if _, err := e.b.Rebill(ctx, "cus_s", period, 3, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("Rebill(3) with no attempt 2: %v; want ErrInvalid", err)
	}
	billingtest.RequireNotCharged(t, e.srv, "cus_s", period)
	// A re-bill of a customer never charged is refused too: Charge would
	// then meet its claim as a mismatch and report the customer unbilled.
	if _, err := e.b.Rebill(ctx, "cus_never", period, 2, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("Rebill(2) of a customer never charged: %v; want ErrInvalid", err)
	}
	billingtest.RequireNotCharged(t, e.srv, "cus_never", period)

	r2, err := e.b.Rebill(ctx, "cus_s", period, 2, nil)
	if err != nil {
		t.Fatalf("Rebill(2): %v", err)
	}
	r, err := e.b.Charge(ctx, "cus_s", period, nil)
	if err != nil || r.StripeID != r2.StripeID {
		t.Errorf("Charge after Rebill(2) = %+v, %v; want AlreadyBilled with %s", r, err, r2.StripeID)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_s"), nil)
	if err != nil || !sum.Complete() {
		t.Errorf("Run after Rebill(2) = %+v, %v; want complete", sum.Progress, err)
	}
	if r3, err := e.b.Rebill(ctx, "cus_s", period, 3, nil); err != nil || r3.Outcome != billing.AlreadyBilled || r3.StripeID != r2.StripeID {
		t.Errorf("Rebill(3) after a paid Rebill(2) = %+v, %v; want AlreadyBilled with %s", r3, err, r2.StripeID)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_s", period)
}

// Rebill with an attempt number already used by a re-bill that is paid, a
// negative one, or one past the limit: nothing more is charged.
func TestAttack4RebillNumbersReusedNegativeHuge(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_n", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_n", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("first charge: %v, want declined", err)
	}
	e.srv.Honor("cus_n")
	if _, err := e.b.Rebill(ctx, "cus_n", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	for _, a := range []int{2, 2, -1, 0, 1, 10_001, 1 << 40, 3, 10_000} {
		r, err := e.b.Rebill(ctx, "cus_n", period, a, nil)
		t.Logf("Rebill(%d) = %v, %v", a, r.Outcome, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_n", period)
}

// A refunded or disputed payment is not a reason to bill again: Rebill,
// Charge and Run after it charge nothing, even a day later.
func TestAttack4RebillAfterRefundAndDispute(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	for _, c := range []string{"cus_rf", "cus_dp"} {
		r, err := e.b.Charge(ctx, c, period, nil)
		if err != nil {
			t.Fatal(err)
		}
		if c == "cus_rf" {
			if err := e.srv.Refund(r.StripeID, amount); err != nil {
				t.Fatal(err)
			}
		} else if _, err := e.srv.Dispute(r.StripeID, "fraudulent"); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Advance(25 * time.Hour)
	e.exec(`UPDATE billonce_claims SET created_at = created_at - interval '25 hours', first_sent_at = first_sent_at - interval '25 hours'`)
	for _, c := range []string{"cus_rf", "cus_dp"} {
		for a := 2; a <= 3; a++ {
			_, err := e.b.Rebill(ctx, c, period, a, nil)
			t.Logf("%s Rebill(%d): %v", c, a, err)
		}
		if _, err := e.b.Charge(ctx, c, period, nil); err != nil {
			t.Errorf("%s Charge: %v", c, err)
		}
	}
	if _, err := e.b.Run(ctx, period, billing.Customers("cus_rf", "cus_dp"), nil); err != nil {
		t.Fatal(err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_rf", period)
	billingtest.RequireChargedOnce(t, e.srv, "cus_dp", period)
}

// Rebill(2) racing a Run that bills the declined customer's neighbours and
// finds the customer declined: the re-bill charges once, the Run none.
func TestAttack4RebillRacingRun(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := customers(40)
	for _, id := range ids[:20] {
		e.srv.Decline(id, "insufficient_funds")
	}
	if _, err := e.b.Run(ctx, period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids[:20] {
		e.srv.Honor(id)
	}
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			b := e.biller()
			if i == 0 {
				_, _ = b.Run(ctx, period, billing.Customers(ids...), nil)
				return
			}
			for _, id := range ids[:20] {
				_, _ = b.Rebill(ctx, id, period, 2, nil)
			}
		}()
	}
	wg.Wait()
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
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

func (s *cancelStore) Release(ctx context.Context, key, owner, why string) error {
	defer s.step()()
	return s.claimEngine.Release(ctx, key, owner, why)
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

// A caller that gives up at every step of Charge and of Run, before and
// after each claim-store call and after Stripe answered: no call that
// returned without an error left the customer unbilled, and the next runs
// (at once, and a day later) bill each customer exactly once. A step past
// the last one the flow takes ends the loop.
func TestAttack4CancelAtEveryStep(t *testing.T) {
	type flow struct {
		name string
		run  func(ctx context.Context, b *billing.Biller, id string) error
	}
	flows := []flow{
		{"charge", func(ctx context.Context, b *billing.Biller, id string) error {
			_, err := b.Charge(ctx, id, period, nil)
			return err
		}},
		{"batched run", func(ctx context.Context, b *billing.Biller, id string) error {
			s, err := b.Run(ctx, period, billing.Customers(id), nil)
			if err == nil && !s.Complete() {
				err = errors.New("run not complete")
			}
			return err
		}},
		{"run", func(ctx context.Context, b *billing.Biller, id string) error {
			s, err := b.Run(ctx, period, billing.Customers(id), nil)
			if err == nil && !s.Complete() {
				err = errors.New("run not complete")
			}
			return err
		}},
	}
	e := newEnv(t)
	for _, f := range flows {
		wheres := []string{"store-before", "store-after", "http"}
		if f.name == "batched run" {
			wheres = append(wheres, "record-fails")
		}
		for _, where := range wheres {
			for at := 1; at <= 12; at++ {
				id := "cus_" + strings.ReplaceAll(f.name, " ", "_") + "_" + where + "_" + string(rune('a'+at))
				ctx, cancel := context.WithCancel(context.Background())
				cs := &cancelStore{testStore: wrapStore(e.store), at: at, before: where == "store-before", cancel: cancel}
				var store claim.Store = cs
				var bs *batchCancelStore
				if f.name == "batched run" {
					bs = &batchCancelStore{cancelStore: cs, pg: e.store}
					if where == "record-fails" {
						bs.failAt = at
					}
					store = bs
				}
				ct := &cancelTransport{at: at, cancel: cancel}
				switch where {
				case "http":
					cs.at = -1
				case "record-fails":
					cs.at, ct.at = -1, -1
				default:
					ct.at = -1
				}
				b := e.biller(func(c *billing.Config) {
					c.Claims = store
					c.HTTPClient = &http.Client{Transport: ct}
				})
				err := f.run(ctx, b, id)
				cancel()
				if err == nil && e.count(id) != 1 {
					t.Errorf("%s: reported success with %d charges", id, e.count(id))
				}
				if err == nil && where == "record-fails" && bs.failed() {
					t.Errorf("%s: a run whose success was not recorded returned no error", id)
				}
				// The next run, once the first one's lease is over (a
				// runner whose database went away cannot release).
				e.exec(`UPDATE billonce_claims SET lease_until = now() WHERE customer = $1 AND state = 'pending'`, id)
				if err := f.run(context.Background(), e.biller(), id); err != nil {
					t.Errorf("%s: next run: %v", id, err)
				}
				billingtest.RequireChargedOnce(t, e.srv, id, period)
				cs.mu.Lock()
				calls := cs.calls
				cs.mu.Unlock()
				ct.mu.Lock()
				reqs := ct.n
				ct.mu.Unlock()
				if where == "record-fails" {
					bs.mu.Lock()
					calls = bs.dones
					bs.mu.Unlock()
				}
				if (where == "http" && at > reqs) || (where != "http" && at > calls) {
					t.Logf("%s %s: %d steps", f.name, where, at-1)
					break
				}
			}
		}
	}
	// A day later, every customer again: nothing more is charged.
	e.srv.Advance(25 * time.Hour)
	e.exec(`UPDATE billonce_claims SET created_at = created_at - interval '25 hours', first_sent_at = first_sent_at - interval '25 hours', lease_until = now() - interval '1 second'`)
	var ids []string
	for _, p := range e.srv.Payments() {
		ids = append(ids, p.Customer)
	}
	if _, err := e.biller().Run(context.Background(), period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
}

// The claim pool is closed, or every backend of the claim database is
// terminated (a PostgreSQL restart as its clients see it), in the middle
// of a Run, just after a Stripe call. The Run does not report the period
// complete; the next Run, on a new pool, finishes it, and a Run a day later
// charges nobody again.
func TestAttack4ClaimDatabaseLostMidRun(t *testing.T) {
	for _, how := range []string{"pool closed", "backends terminated"} {
		t.Run(how, func(t *testing.T) {
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

// ageAll moves every claim's times back by d on the database clock.
func (e *env) ageAll(d time.Duration) {
	e.tb.Helper()
	e.exec(`UPDATE billonce_claims SET created_at = created_at - $1 * interval '1 microsecond',
		first_sent_at = first_sent_at - $1 * interval '1 microsecond',
		updated_at = updated_at - $1 * interval '1 microsecond',
		lease_until = lease_until - $1 * interval '1 microsecond'`, d.Microseconds())
}

// The price function answers "usd" for the attempt whose answer is lost,
// and "USD" for the retry: one currency, one claim, one charge.
func TestAttack4CurrencyCaseBetweenAttempts(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_c"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(searchDown)
	b1 := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	if _, err := b1.Charge(ctx, "cus_c", period, nil); err == nil {
		t.Fatal("lost answer reported success")
	}
	e.srv.SetScript(nil)
	b2 := e.biller(func(c *billing.Config) {
		c.Price = func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: "USD"}, nil
		}
	})
	e.exec(`UPDATE billonce_claims SET lease_until = now() - interval '1 second'`)
	r, err := b2.Charge(ctx, "cus_c", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	if r.Currency != "usd" {
		t.Errorf("receipt currency %q", r.Currency)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_c", period)
}

// The claim table is renamed between two runs (claim.Config.Table, or a
// search_path that finds another schema's table): the new table knows no
// claim, so the next run claims afresh. Within Stripe's 24-hour window it
// sends the same keys and Stripe replays them: nobody is charged twice.
// (Past the window, a table that knows no claim is a lost claim table: see
// the README's "What billonce does not protect against".)
func TestAttack4ClaimTableChangedWithinWindow(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	ids := customers(20)
	e.srv.FailNext(billingtest.Match{Customer: ids[3]}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 }).Run(ctx, period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	other, err := claim.NewPostgres(e.pool, claim.Config{Table: "billonce_claims_v2"})
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	e.srv.Advance(20 * time.Hour)
	sum, err := e.biller(func(c *billing.Config) { c.Claims = other }).Run(ctx, period, billing.Customers(ids...), nil)
	if err != nil || !sum.Complete() {
		t.Fatalf("run on the new table: %+v, %v", sum.Progress, err)
	}
	t.Logf("run on the new table: %+v", sum.Progress)
	wantAllOnce(t, e.srv, ids)
}

// A configuration printed whole, the way start-up code and panics print
// them (fmt verbs, slog's text and JSON handlers), shows no secret: not the
// Stripe key in billing.Config, nor the vault key in spendcap.Config.
func TestAttack4ConfigsPrintNoSecret(t *testing.T) {
	const vault = "vault_live_S3cretVaultKeyNeverPrint9876"
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4]
	vsecret := vault[:len(vault)-4]
	values := map[string]any{
		"billing.Config":                   billing.Config{SecretKey: secretKey, StripeURL: "https://api.stripe.com", Scope: "s"},
		"billing.Config with a credential": billing.Config{SecretKey: vault, Credential: secretKey},
		"*billing.Config":                  &billing.Config{SecretKey: secretKey},
		"spendcap.Config":                  spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vault},
		"*spendcap.Config":                 &spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vault},
	}
	px, err := spendcap.NewProxy(spendcap.ProxyConfig{Upstream: "https://api.stripe.com", StripeKey: secretKey, Store: spendcap.NewMemoryStore()})
	if err != nil {
		t.Fatal(err)
	}
	values["spendcap.ProxyConfig"] = spendcap.ProxyConfig{Upstream: "https://api.stripe.com", StripeKey: secretKey}
	values["*spendcap.Proxy"] = px
	for name, v := range values {
		var outs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%t", "%o"} {
			outs = append(outs, verb+" "+fmt.Sprintf(verb, v))
		}
		var text, js bytes.Buffer
		slog.New(slog.NewTextHandler(&text, nil)).Info("start", "config", v)
		slog.New(slog.NewJSONHandler(&js, nil)).Info("start", "config", v)
		outs = append(outs, "slog text "+text.String(), "slog json "+js.String())
		for _, out := range outs {
			if strings.Contains(out, secret) || strings.Contains(out, vsecret) {
				t.Errorf("%s prints a secret: %.200s", name, out)
			}
		}
	}
}

// A customer declined 120 times in a row (a dunning process re-billing
// daily, say), then paid by re-bill 122: Charge and Run report the period
// as billed, however many re-bills came before.
func TestAttack4ManyRebillsThenPaid(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_m", "insufficient_funds")
	if _, err := e.b.Charge(ctx, "cus_m", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatal(err)
	}
	for a := 2; a <= 121; a++ {
		if _, err := e.b.Rebill(ctx, "cus_m", period, a, nil); !errors.Is(err, billing.ErrDeclined) {
			t.Fatalf("Rebill(%d): %v", a, err)
		}
	}
	e.srv.Honor("cus_m")
	paid, err := e.b.Rebill(ctx, "cus_m", period, 122, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := e.b.Charge(ctx, "cus_m", period, nil)
	if err != nil || r.StripeID != paid.StripeID {
		t.Errorf("Charge after re-bill 122 paid: %v, %v; want AlreadyBilled %s", r.Outcome, err, paid.StripeID)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_m"), nil)
	if err != nil || !sum.Complete() {
		t.Errorf("Run after re-bill 122 paid: %+v, %v", sum.Progress, err)
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_m", period)
}
