package billing_test

// Attacks on the exactly-once guarantee across time and configuration. Each
// is a regression test counting
// payments at the fake Stripe; each runs in well under a second.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/retry"
)

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

func (s *failAfter) Fail(ctx context.Context, key, reason string) error {
	if err := s.claimEngine.Fail(ctx, key, reason); err != nil || !s.should("Fail") {
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

// A runner paused between retries (here: rate-limited, 25 hours pass)
// while another runner takes its claim over, reconciles and charges: when
// it wakes, its next attempt is refused by CheckSend (lease lost).
func TestAttackHeldPausedRunnerWakesAfterTakeover(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	var once sync.Once
	var bR billing.Receipt
	var bErr error
	a := e.biller(func(c *billing.Config) {
		c.Retry.Notify = func(retry.Event) {
			once.Do(func() {
				e.advance(25 * time.Hour)
				bR, bErr = e.biller().Charge(ctx, "cus_1", period, nil)
			})
		}
	})
	_, aErr := a.Charge(ctx, "cus_1", period, nil)
	if n := e.count("cus_1"); n != 1 || bErr != nil || !errors.Is(aErr, claimengine.ErrLeaseLost) {
		t.Fatalf("cus_1 charged %d times; B = %+v, %v; A = %v", n, bR, bErr, aErr)
	}
}

// Rebill while attempt 1's outcome is unknown is refused (the period's live
// claim holds), and nothing is sent; the charge is then found once.
func TestAttackHeldRebillWhileAttemptOnePending(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.lostAnswer(e.b, "cus_1")
	before := len(e.srv.Log())
	// Attempt 1's outcome decides whether a re-bill may bill: it waits.
	_, err := e.b.Rebill(ctx, "cus_1", period, 2, nil)
	if !errors.Is(err, billing.ErrInProgress) || posts(e, before) != 0 {
		t.Fatalf("Rebill while attempt 1 is pending = %v, %d POSTs", err, posts(e, before))
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || e.count("cus_1") != 1 {
		t.Fatalf("Charge = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// A decline whose answer was lost is found by search past the deadline:
// the claim fails, nothing is re-billed on its own, an explicit Rebill
// charges once, and later Charges report the re-bill.
func TestAttackHeldLostDeclineFoundBySearch(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.srv.Decline("cus_1", "insufficient_funds")
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(searchDown)
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("charge with a lost answer succeeded")
	}
	e.srv.SetScript(nil)
	e.srv.Honor("cus_1")
	e.advance(25 * time.Hour)
	before := len(e.srv.Log())
	_, err := e.b.Charge(ctx, "cus_1", period, nil)
	var failed *billing.ChargeError
	if !(errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined)) || posts(e, before) != 0 {
		t.Fatalf("Charge past the deadline = %v (%d POSTs), want ErrDeclined and nothing sent", err, posts(e, before))
	}
	if _, err := e.b.Rebill(ctx, "cus_1", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Attempt != 2 || e.count("cus_1") != 1 {
		t.Fatalf("Charge after the re-bill = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// A decline answered with a stored 500 (outcome unknown) is found by the
// in-window search and fails the claim; it is not retried.
func TestAttackHeldDeclineBehindStored500(t *testing.T) {
	e := newEnv(t)
	e.srv.Decline("cus_1", "")
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	var failed *billing.ChargeError
	if !(errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined)) || len(e.srv.Payments()) != 1 {
		t.Fatalf("Charge = %v; %d payments", err, len(e.srv.Payments()))
	}
}

// Several payments for one key (Stripe forgot the key once): search finds
// both, nothing more is sent, and the caller is told to reconcile.
func TestAttackHeldSeveralPaymentsForOneKey(t *testing.T) {
	e := newEnv(t)
	key := e.crashedClaim("cus_1", amount)
	e.chargeDirect("cus_1", key, amount)
	e.advance(25 * time.Hour)
	e.chargeDirect("cus_1", key, amount)
	before := len(e.srv.Log())
	_, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	var needs *billing.ChargeError
	if !(errors.As(err, &needs) && errors.Is(err, billing.ErrNeedsReconciliation)) || posts(e, before) != 0 || e.count("cus_1") != 2 {
		t.Fatalf("Charge = %v; %d POSTs, %d charges", err, posts(e, before), e.count("cus_1"))
	}
}

// PaymentIntents: the payment method changed between runs. The key's
// stored request had the old one: Stripe refuses the key as reused;
// nothing is charged; past the deadline search settles it.
func TestAttackHeldPaymentMethodChanged(t *testing.T) {
	pis := func(c *billing.Config) { c.API = billing.PaymentIntents }
	e := newEnv(t, oneAttempt, pis)
	ctx := context.Background()
	e.lostAnswer(e.b, "cus_1")
	pm2 := e.biller(oneAttempt, pis, func(c *billing.Config) {
		c.Price = func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_new_card"}, nil
		}
	})
	_, err := pm2.Charge(ctx, "cus_1", period, nil)
	var reuse *billing.ChargeError
	if !(errors.As(err, &reuse) && errors.Is(err, billing.ErrKeyReused)) || e.count("cus_1") != 1 {
		t.Fatalf("Charge with a new payment method = %v; %d charges", err, e.count("cus_1"))
	}
	e.advance(25 * time.Hour)
	r, err := pm2.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Outcome != billing.Reconciled || e.count("cus_1") != 1 {
		t.Fatalf("Charge past the deadline = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// API switched charges → payment_intents → charges: the first send never
// executed; after the key's 24-hour window the PI Biller reopens and sends (answer
// lost, search down); the charges Biller, back within the new window,
// sends nothing blind, and finds the PI once search is back.
func TestAttackHeldAPISwitchBackAndForth(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("first send succeeded")
	}
	e.advance(24*time.Hour + time.Minute)
	pi := e.biller(oneAttempt, func(c *billing.Config) { c.API = billing.PaymentIntents })
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(searchDownFrom(3)) // the unknown-outcome and reconciling searches work, later ones fail
	if _, err := pi.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("PI send with a cut answer succeeded")
	}
	e.advance(time.Hour)
	before := len(e.srv.Log())
	_, err := e.b.Charge(ctx, "cus_1", period, nil)
	var moved *billing.ChargeError
	if !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) || posts(e, before) != 0 {
		t.Fatalf("charges Biller with search down = %v, %d POSTs", err, posts(e, before))
	}
	e.srv.SetScript(nil)
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || !strings.HasPrefix(r.StripeID, "pi_") || e.count("cus_1") != 1 {
		t.Fatalf("charges Biller with search up = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// Credential rotated after the key's window (reopened under the new key, answer
// lost), then rotated back: the old key sends nothing blind.
func TestAttackHeldCredentialRotationAndBack(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("first send succeeded")
	}
	e.advance(24*time.Hour + time.Minute)
	rot := e.biller(oneAttempt, func(c *billing.Config) { c.SecretKey = rotatedKey })
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(searchDownFrom(3)) // the unknown-outcome and reconciling searches work, later ones fail
	if _, err := rot.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("rotated send with a cut answer succeeded")
	}
	if c := e.claimOf("cus_1"); c.ReconciledAt.IsZero() || e.count("cus_1") != 1 {
		t.Fatalf("claim %+v, %d charges; want reopened and charged once", c, e.count("cus_1"))
	}
	before := len(e.srv.Log())
	_, err := e.b.Charge(ctx, "cus_1", period, nil)
	var moved *billing.ChargeError
	if !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) || posts(e, before) != 0 {
		t.Fatalf("old key, search down = %v, %d POSTs", err, posts(e, before))
	}
	e.srv.SetScript(nil)
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Outcome != billing.Reconciled || e.count("cus_1") != 1 {
		t.Fatalf("old key, search up = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// Config.Credential set after claims were made with it unset (and the
// reverse) is another credential: nothing is sent blind.
func TestAttackHeldCredentialSetUnset(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.Charge(ctx, "cus_1", period, nil); err == nil {
		t.Fatal("first send succeeded")
	}
	named := e.biller(oneAttempt, func(c *billing.Config) { c.Credential = "acct_1/billing-key-2026" })
	before := len(e.srv.Log())
	_, err := named.Charge(ctx, "cus_1", period, nil)
	var moved *billing.ChargeError
	if !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) || posts(e, before) != 0 || strings.Contains(err.Error(), "billing-key-2026") {
		t.Fatalf("Credential set = %v, %d POSTs", err, posts(e, before))
	}
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	if err != nil || e.count("cus_1") != 1 {
		t.Fatalf("original = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// The window margin lowered to MinWindowMargin between runs: a claim made
// under 23 h is reconciled by search at 1 h, never resent blind.
func TestAttackHeldMarginLoweredBetweenRuns(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	e.lostAnswer(e.b, "cus_1")
	e.advance(time.Hour)
	short := e.biller(func(c *billing.Config) { c.WindowMargin = time.Hour })
	r, err := short.Charge(ctx, "cus_1", period, nil)
	if err != nil || r.Outcome != billing.Reconciled || e.count("cus_1") != 1 {
		t.Fatalf("Charge = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
	// And with nothing to find: reopened, sent once.
	e.crashedClaim("cus_2", amount)
	e.advance(time.Hour)
	r, err = short.Charge(ctx, "cus_2", period, nil)
	if err != nil || r.Outcome != billing.Created || e.count("cus_2") != 1 {
		t.Fatalf("Charge = %+v, %v; %d charges", r, err, e.count("cus_2"))
	}
}

// Scope changed while a claim is pending: the new keys meet the live claim
// and nothing is sent.
func TestAttackHeldScopeChangeWhilePending(t *testing.T) {
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_1")
	before := len(e.srv.Log())
	_, err := e.biller(func(c *billing.Config) { c.Scope = "renamed" }).Charge(context.Background(), "cus_1", period, nil)
	var mm *claim.MismatchError
	if !errors.As(err, &mm) || posts(e, before) != 0 || e.count("cus_1") != 1 {
		t.Fatalf("Charge under a new scope = %v, %d POSTs", err, posts(e, before))
	}
}

// Crash points after the database committed: Succeed, Fail and Reopen
// that wrote their row but reported an error. The next call settles once.
func TestAttackHeldStoreFailsAfterCommit(t *testing.T) {
	e := newEnv(t, oneAttempt)
	ctx := context.Background()
	st := &failAfter{testStore: wrapStore(e.store), fail: map[string]bool{"Succeed": true, "Fail": true, "Reopen": true}}
	b := e.biller(oneAttempt, func(c *billing.Config) { c.Claims = st })

	var rec *billing.ChargeError
	if _, err := b.Charge(ctx, "cus_ok", period, nil); !(errors.As(err, &rec) && errors.Is(err, billing.ErrNotRecorded)) {
		t.Fatalf("Succeed failing after commit = %v", err)
	}
	if r, err := b.Charge(ctx, "cus_ok", period, nil); err != nil || r.Outcome != billing.AlreadyBilled || e.count("cus_ok") != 1 {
		t.Fatalf("after = %+v, %v; %d", r, err, e.count("cus_ok"))
	}

	e.srv.Decline("cus_decl", "")
	b.Charge(ctx, "cus_decl", period, nil)
	var failed *billing.ChargeError
	if _, err := b.Charge(ctx, "cus_decl", period, nil); !(errors.As(err, &failed) && errors.Is(err, billing.ErrDeclined)) {
		t.Fatalf("after Fail failing after commit = %v", err)
	}

	e.crashedClaim("cus_reopen", amount)
	e.advance(24 * time.Hour)
	if _, err := b.Charge(ctx, "cus_reopen", period, nil); err == nil {
		t.Fatal("Reopen failing after commit reported success")
	}
	e.exec("UPDATE billonce_claims SET lease_until = now() WHERE key = $1", e.key("cus_reopen"))
	if r, err := b.Charge(ctx, "cus_reopen", period, nil); err != nil || e.count("cus_reopen") != 1 {
		t.Fatalf("after = %+v, %v; %d", r, err, e.count("cus_reopen"))
	}
	if n := len(e.srv.Payments()); n != 3 {
		t.Fatalf("%d payments, want 3", n)
	}
}

// Many replicas and goroutines bill the same customers through seeded
// faults (lost answers, stored and unstored 500s, lock timeouts); a clean
// run then finishes. Everyone is charged exactly once. Run with -race.
func TestAttackHeldConcurrentReplicasWithFaults(t *testing.T) {
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

// Secrets around the identity checks: neither the secret key nor the
// Credential name shows in IdentityError or the log lines of a rotation.
func TestAttackHeldNoSecretInIdentityErrors(t *testing.T) {
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, oneAttempt, func(c *billing.Config) { c.Logger = logger })
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	e.b.Charge(ctx, "cus_1", period, nil)
	rot := e.biller(oneAttempt, func(c *billing.Config) { c.Logger = logger; c.SecretKey = rotatedKey })
	_, err := rot.Charge(ctx, "cus_1", period, nil)
	if err == nil {
		t.Fatal("rotated Charge succeeded within the window")
	}
	text := fmt.Sprintf("%v %+v %#v %s", err, err, err, logs.String())
	for _, s := range []string{secretKey[8 : len(secretKey)-4], rotatedKey[8 : len(rotatedKey)-4]} {
		if strings.Contains(text, s) {
			t.Fatalf("a secret leaked: %s", text)
		}
	}
}
