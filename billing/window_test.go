package billing_test

import (
	"context"
	"errors"
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

// advance moves time forward by d for the fake Stripe and for the claim
// table at once: the fake's clock moves, and every time on the claim table
// moves back by d, which is what d passing on the database clock looks like
// to billonce. A usage report's window is its identity, not a reading of
// the clock, and stays.
func (e *env) advance(d time.Duration) {
	e.tb.Helper()
	ctx := context.Background()
	rows, err := e.pool.Query(ctx, `SELECT column_name FROM information_schema.columns
		WHERE table_name = 'billonce_claims' AND data_type LIKE 'timestamp%' AND column_name NOT IN ('window_start', 'window_end')`)
	if err != nil {
		e.tb.Fatal(err)
	}
	var sets []string
	for rows.Next() {
		var col string
		if err := rows.Scan(&col); err != nil {
			e.tb.Fatal(err)
		}
		sets = append(sets, col+" = "+col+" - $1 * interval '1 microsecond'")
	}
	if err := rows.Err(); err != nil {
		e.tb.Fatal(err)
	}
	e.exec("UPDATE billonce_claims SET "+strings.Join(sets, ", "), d.Microseconds())
	e.srv.Advance(d)
}

// lostAnswer charges customer through b while the answer is lost after
// Stripe committed and Stripe's search is down, with no retry: the charge
// exists, the claim stays pending, and the key was first sent now.
func (e *env) lostAnswer(b *billing.Biller, customer string) {
	e.tb.Helper()
	e.srv.FailNext(billingtest.Match{Customer: customer}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	defer e.srv.SetScript(nil)
	_, err := b.Charge(context.Background(), customer, period, nil)
	var unknown *billing.ChargeError
	if !(errors.As(err, &unknown) && errors.Is(err, billing.ErrOutcomeUnknown)) {
		e.tb.Fatalf("charge with a lost answer = %v, want ErrOutcomeUnknown", err)
	}
	if n := e.count(customer); n != 1 {
		e.tb.Fatalf("%d charges after the lost answer, want 1", n)
	}
}

func oneAttempt(c *billing.Config) { c.Retry.MaxAttempts = 1 }

// The deadline: a pending claim resumed just inside the window margin whose retries
// run past 24 hours since its key was first sent must not send the key
// again blind: Stripe has forgotten it, and a resend is a second charge.
func TestWindowDeadlineHoldsAcrossRetries(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_1")
	e.advance(22*time.Hour + 59*time.Minute)

	// The resumed send meets rate limits (nothing stored at Stripe), and
	// two hours pass while it retries.
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"},
		billingtest.Fault{Kind: billingtest.FaultRateLimit}, billingtest.Fault{Kind: billingtest.FaultRateLimit})
	var once sync.Once
	b := e.biller(serverWaitsSkipped, func(c *billing.Config) {
		c.Retry.Notify = func(retry.Event) { once.Do(func() { e.advance(2 * time.Hour) }) }
	})
	r, err := b.Charge(context.Background(), "cus_1", period, nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1 (Charge = %+v, %v)", n, r, err)
	}
	if err != nil || r.Outcome != billing.Reconciled {
		t.Errorf("Charge = %+v, %v; want the first charge, reconciled", r, err)
	}
}

// The deadline in a Run: a claim waiting in the queue behind a slow customer while
// its key's window closes goes to reconciliation, not to a blind resend.
func TestWindowDeadlineHoldsInRunQueue(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_2")
	e.advance(22*time.Hour + 59*time.Minute)

	// cus_1 is sent first and takes two hours; cus_2 waits its turn.
	var once sync.Once
	b := e.biller(func(c *billing.Config) {
		c.Observe = func(ev billing.Event) {
			if ev.Kind == billing.EventStripeCall && ev.Customer == "cus_1" {
				once.Do(func() { e.advance(2 * time.Hour) })
			}
		}
	})
	sum, err := b.Run(context.Background(), period, billing.Customers("cus_1", "cus_2"), &billing.RunOptions{Concurrency: 1})
	for _, c := range []string{"cus_1", "cus_2"} {
		if n := e.count(c); n != 1 {
			t.Errorf("%s charged %d times, want 1", c, n)
		}
	}
	if err != nil || !sum.Complete() {
		t.Errorf("Run = %+v, %v; want complete", sum.Progress, err)
	}
}

// A claim knows where its key went: it remembers which API its key went to. A Biller switched to
// the other API that resumes it past the window must find the first
// payment, whatever its object type, and not make a second one.
func TestClaimRemembersEndpointAcrossAPISwitch(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_1")
	e.advance(25 * time.Hour)

	pi := e.biller(func(c *billing.Config) { c.API = billing.PaymentIntents })
	r, err := pi.Charge(context.Background(), "cus_1", period, nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1 (Charge = %+v, %v)", n, r, err)
	}
	if err != nil || !strings.HasPrefix(r.StripeID, "ch_") {
		t.Errorf("Charge = %+v, %v; want the first charge (ch_…)", r, err)
	}
}

// A claim knows where its key went: within the window, a Biller on the other API that finds no payment
// for the key must neither send (Stripe would refuse the key as reused, or
// a payment not yet searchable would be made twice) nor fail the claim: it
// reports where the key went and leaves the claim for the Biller that made
// it.
func TestClaimOnOtherAPIWithinWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	// The first send fails before Stripe stores anything.
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	var unknown *billing.ChargeError
	if _, err := e.b.Charge(context.Background(), "cus_1", period, nil); !(errors.As(err, &unknown) && errors.Is(err, billing.ErrOutcomeUnknown)) {
		t.Fatalf("first Charge = %v, want ErrOutcomeUnknown", err)
	}
	e.advance(time.Hour)

	pi := e.biller(func(c *billing.Config) { c.API = billing.PaymentIntents })
	sent := len(e.srv.Log())
	_, err := pi.Charge(context.Background(), "cus_1", period, nil)
	var moved *billing.ChargeError
	if !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) {
		t.Fatalf("Charge on the other API = %v, want ErrSentElsewhere", err)
	}
	for _, l := range e.srv.Log()[sent:] {
		if l.Method == "POST" {
			t.Errorf("the key was sent again: %+v", l)
		}
	}
	if c := e.claimOf("cus_1"); c.State != claim.StatePending {
		t.Errorf("claim is %s, want pending", c.State)
	}
	// The Biller that made the claim finishes it.
	r, err := e.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil || e.count("cus_1") != 1 {
		t.Errorf("Charge by the original Biller = %+v, %v; %d charges", r, err, e.count("cus_1"))
	}
}

// A claim knows where its key went: idempotency keys may be scoped per API key. A rotated secret key
// resuming a claim within the window must not send it under the new key;
// search finds the first charge.
func TestClaimRemembersCredentialAcrossRotation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_1")
	e.advance(time.Hour)

	rotated := e.biller(func(c *billing.Config) { c.SecretKey = "sk_test_rotatedKey000000000000000000000000000abcd" })
	r, err := rotated.Charge(context.Background(), "cus_1", period, nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times after a key rotation, want 1 (%v)", n, err)
	}
	if err != nil || r.Outcome != billing.Reconciled {
		t.Errorf("Charge after rotation = %+v, %v; want the first charge, reconciled", r, err)
	}
}

// A claim knows where its key went, with no payment to find: within the key's 24-hour window the rotated
// Biller sends nothing; after it, and the hour search is given to index
// the old credential's last possible request, a search miss is trusted,
// the window is reopened for the new credential and the customer is
// billed once.
func TestRotatedCredentialWithNoPayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.Charge(context.Background(), "cus_1", period, nil); err == nil {
		t.Fatal("first Charge succeeded despite the fault")
	}
	rotated := e.biller(func(c *billing.Config) { c.SecretKey = "sk_test_rotatedKey000000000000000000000000000abcd" })
	var moved *billing.ChargeError
	if _, err := rotated.Charge(context.Background(), "cus_1", period, nil); !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) || !moved.Until.After(time.Now()) {
		t.Fatalf("Charge after rotation within the window = %v, want ErrSentElsewhere", err)
	}
	e.advance(24 * time.Hour)
	if _, err := rotated.Charge(context.Background(), "cus_1", period, nil); !errors.Is(err, billing.ErrSentElsewhere) {
		t.Fatalf("Charge after rotation 24 hours on = %v, want ErrSentElsewhere: the old key may have been sent 23 hours in, and search gets an hour to index it", err)
	}
	e.advance(time.Hour)
	r, err := rotated.Charge(context.Background(), "cus_1", period, nil)
	if err != nil || r.Outcome != billing.Created || e.count("cus_1") != 1 {
		t.Errorf("Charge past the deadline = %+v, %v; %d charges, want 1 created", r, err, e.count("cus_1"))
	}
	if c := e.claimOf("cus_1"); c.ReconciledAt.IsZero() || c.SentAge > time.Hour {
		t.Errorf("claim %+v; want its window reopened by the search", c)
	}
}

// Reconcile settles only the claims of its own scope: a second product's
// Biller on the same table must leave the first one's claims alone.
func TestReconcileTouchesOnlyItsScope(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt, func(c *billing.Config) { c.Scope = "product-a"; c.API = billing.PaymentIntents })
	e.lostAnswer(e.b, "cus_1")
	e.advance(25 * time.Hour)

	other := e.biller(func(c *billing.Config) { c.Scope = "product-b" })
	sum, err := other.Reconcile(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1 (Reconcile of another scope = %+v)", n, sum.Progress)
	}
	if sum.Total != 0 {
		t.Errorf("Reconcile of product-b looked at %d claims, want 0", sum.Total)
	}
	// product-a's own Reconcile settles it.
	sum, err = e.b.Reconcile(context.Background(), nil)
	if err != nil || sum.AlreadyBilled != 1 || e.count("cus_1") != 1 {
		t.Errorf("Reconcile of product-a = %+v, %v; %d charges", sum.Progress, err, e.count("cus_1"))
	}
}

// Two replicas configured with the same Owner are still two owners: one
// sees the other's live claim as in progress instead of resuming it.
func TestSameConfiguredOwnerIsTwoOwners(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *billing.Config) { c.Owner = "billing-cron" })
	release := make(chan struct{})
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	done := make(chan error, 1)
	go func() { _, err := e.b.Charge(context.Background(), "cus_1", period, nil); done <- err }()
	waitFor(t, func() bool { return e.claimRows() > 0 })

	twin := e.biller(func(c *billing.Config) { c.Owner = "billing-cron" })
	_, err := twin.Charge(context.Background(), "cus_1", period, nil)
	close(release)
	var inProgress *billing.ChargeError
	if !(errors.As(err, &inProgress) && errors.Is(err, billing.ErrInProgress)) {
		t.Errorf("a second replica with the same Owner = %v, want ErrInProgress", err)
	}
	if err := <-done; err != nil {
		t.Errorf("first replica: %v", err)
	}
	if n := e.count("cus_1"); n != 1 {
		t.Errorf("cus_1 charged %d times", n)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for !cond() { // never met: the test binary's timeout, with every stack
		time.Sleep(5 * time.Millisecond)
	}
}

// A search that Stripe refuses for every request (here a restricted key
// without search permission) stops a Reconcile instead of reporting every
// claim as needing reconciliation; the claims stay pending.
func TestRefusedSearchStopsReconcile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	for _, c := range []string{"cus_1", "cus_2"} {
		e.lostAnswer(e.b, c)
	}
	e.advance(25 * time.Hour)
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if strings.HasSuffix(r.Path, "/search") {
			return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: 403,
				Refusal: billingtest.Refusal{Message: "This API key does not have the rak_charge_read permission"}}
		}
		return billingtest.Fault{}
	})
	sum, err := e.b.Reconcile(context.Background(), nil)
	if !errors.Is(err, billing.ErrStripeAuth) || sum.Done != 1 {
		t.Errorf("Reconcile = %+v, %v; want it stopped by ErrStripeAuth after the first claim", sum.Progress, err)
	}
	for _, c := range []string{"cus_1", "cus_2"} {
		if cl := e.claimOf(c); cl.State != claim.StatePending || e.count(c) != 1 {
			t.Errorf("%s: claim %s, %d charges; want pending and 1", c, cl.State, e.count(c))
		}
	}
}

// New refuses a deadline whose arithmetic cannot hold: the last attempt may
// start just before WindowMargin and reach Stripe an attempt timeout later,
// with clocks ClockAllowance apart, all within Stripe's 24 hours; and a
// search trusted before MinWindowMargin might not have indexed a payment.
func TestNewRefusesImpossibleWindowArithmetic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for name, set := range map[string]func(*billing.Config){
		"margin + attempt + allowance > 24h": func(c *billing.Config) {
			c.WindowMargin = 23*time.Hour + 50*time.Minute
			c.Retry.AttemptTimeout = 10 * time.Minute
		},
		"margin below MinWindowMargin": func(c *billing.Config) { c.WindowMargin = 30 * time.Minute },
	} {
		cfg := billing.Config{SecretKey: secretKey, StripeURL: e.srv.URL, Claims: e.store, Price: flatPrice(amount), Retry: fastRetry()}
		set(&cfg)
		if _, err := billing.New(cfg); !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), "WindowMargin") {
			t.Errorf("%s: New = %v, want ErrInvalid naming WindowMargin", name, err)
		}
	}
	cfg := billing.Config{SecretKey: secretKey, StripeURL: e.srv.URL, Claims: e.store, Price: flatPrice(amount), Retry: fastRetry(),
		WindowMargin: 23*time.Hour + 50*time.Minute}
	if _, err := billing.New(cfg); err != nil {
		t.Errorf("New with a margin that fits = %v", err)
	}
}

// A Run's first send of a claim it has just won trusts the claim's own
// lease instead of asking the store again. Here the database clock jumps
// forward (by more than the lease and a day, as a restored or re-synced
// database server's would) between the claim and that send: the lease
// ends early on the database's clock and another replica, on the other
// API, takes the claim over. Stripe refuses the key on the other endpoint,
// so the customer is charged once.
func TestFirstSendAfterDBClockJumpChargesOnce(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		change func(*billing.Config)
	}{
		// A replica with a rotated secret key is not in this table: it
		// searches, finds nothing (the Run has not sent yet) and, with the
		// claim 25 hours old on the database clock, sends under its own
		// key, while the Run's first send goes out under the old one. A
		// database clock that jumps forward by a day breaks the deadline
		// whatever the shortcut (a request in flight at the jump meets the
		// same replica); billonce assumes the database clock does not jump
		// (see the package documentation, "Clocks").
		{"payment intents", func(c *billing.Config) { c.API = billing.PaymentIntents }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			firstSendSafeDBClockJump(t, tc.change)
		})
	}
}

// A runner paused between retries (here: rate-limited, 25 hours pass)
// while another runner takes its claim over, reconciles and charges: when
// it wakes, its next attempt is refused by CheckSend (lease lost).
func TestPausedRunnerWakingAfterTakeoverSendsNothing(t *testing.T) {
	t.Parallel()
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
