package billing_test

// Configuration that changes between runs or while claims are pending
// (secret key, credential, API, scope, claim table, window margin,
// currency spelling) charges nobody twice. The oracle is the fake Stripe's
// ledger.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A key rotation racing a send whose lease expired charges once (the
// deadline, and a claim knows where its key went).
//
// Scenario: replica A (old Stripe key) runs a Run; cus_1's claim was made
// 22h55m ago and is resumed in A's claim batch. cus_1 waits in A's queue
// behind cus_0 for ~5 minutes (rate limits), so its 2-minute lease runs out
// before A sends it; CheckSend does not look at the lease, so A sends at
// 22h59m50s, inside the window. The request takes 20 s to reach Stripe
// (well inside the 30 s attempt timeout). Meanwhile replica B, already
// deployed with the rotated key, bills cus_1: the lease has expired, so B
// takes the claim over; the key is past its deadline and under another
// credential, so B searches, finds nothing (A's request has not landed
// yet), reopens the window and sends under the new key. A's request then
// lands under the old key, where Stripe has never seen the idempotency key.
//
// Expected: cus_1 charged exactly once, not twice (ch from B under the
// rotated key, ch from A under the old one).
func TestRotatedKeyTakeoverRacingExpiredLeaseSendChargesOnce(t *testing.T) {
	t.Parallel()
	// With B on the same key the race holds by itself: B's reopened send
	// and A's late request carry one key in one key space, and Stripe
	// replays.
	for name, bKey := range map[string]string{"same key": secretKey, "rotated key": rotatedKey} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			e.crashedClaim("cus_1", amount) // claimed, never sent
			e.advance(22*time.Hour + 55*time.Minute)

			late := newLateTransport(e.key("cus_1"))
			var once sync.Once
			a := e.biller(func(c *billing.Config) {
				c.HTTPClient = &http.Client{Transport: late}
				c.Retry.AttemptTimeout = 30 * time.Second
				c.Retry.MaxAttempts = 1
				c.Observe = func(ev billing.Event) {
					if ev.Kind == billing.EventStripeCall && ev.Customer == "cus_0" {
						// cus_0 took ~5 minutes of rate-limited retries.
						once.Do(func() { e.advance(4*time.Minute + 50*time.Second) })
					}
				}
			})
			runDone := make(chan error, 1)
			go func() {
				_, err := a.Run(ctx, period, billing.Customers("cus_0", "cus_1"), &billing.RunOptions{Concurrency: 1})
				runDone <- err
			}()
			select {
			case <-late.held:
			case err := <-runDone:
				t.Fatalf("A's run ended before sending cus_1: %v", err)
			}

			// A's request is on its way; 20 seconds pass.
			e.advance(20 * time.Second)
			b := e.biller(func(c *billing.Config) { c.SecretKey = bKey })
			rb, errB := b.Charge(ctx, "cus_1", period, nil)

			close(late.release) // A's request lands
			<-runDone

			if n := e.count("cus_1"); n != 1 {
				var ids []string
				for _, p := range e.srv.Payments() {
					if p.Customer == "cus_1" && p.Paid {
						ids = append(ids, p.ID)
					}
				}
				t.Fatalf("cus_1 charged %d times (%v), want 1; B's Charge = %+v, %v", n, ids, rb, errB)
			}
		})
	}
}

// Two products bill the same customer for the same period. Sharing one
// claim table, the second is refused with a *claim.MismatchError and
// nothing is sent: one live claim per customer and period, whatever the
// scope, is also what keeps a renamed scope from billing everyone again.
// With a claim table each, each product bills the customer once.
func TestProductsBillingOneCustomerUseATableEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	subs := e.biller(func(c *billing.Config) { c.Scope = "subscription" })
	shared := e.biller(func(c *billing.Config) { c.Scope = "overage" })
	if _, err := subs.Charge(ctx, "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	var mm *claim.MismatchError
	if _, err := shared.Charge(ctx, "cus_1", period, nil); !errors.As(err, &mm) || e.count("cus_1") != 1 {
		t.Fatalf("product B on the shared table = %v; %d payments, want a mismatch and 1", err, e.count("cus_1"))
	}
	own, err := claim.NewPostgres(e.pool, claim.Config{Table: "overage_claims"})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	overage := e.biller(func(c *billing.Config) { c.Scope = "overage"; c.Claims = own })
	if r, err := overage.Charge(ctx, "cus_1", period, nil); err != nil || r.Outcome != billing.Created || e.count("cus_1") != 2 {
		t.Fatalf("product B on its own table = %+v, %v; %d payments, want 2", r, err, e.count("cus_1"))
	}
	if r, err := overage.Charge(ctx, "cus_1", period, nil); err != nil || r.Outcome != billing.AlreadyBilled || e.count("cus_1") != 2 {
		t.Fatalf("product B again = %+v, %v; %d payments", r, err, e.count("cus_1"))
	}
}

// The price function answers "usd" for the attempt whose answer is lost,
// and "USD" for the retry: one currency, one claim, one charge.
func TestCurrencyCaseChangedBetweenAttemptsIsOneClaim(t *testing.T) {
	t.Parallel()
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
func TestClaimTableChangedWithinWindowChargesOnce(t *testing.T) {
	t.Parallel()
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

// PaymentIntents: the payment method changed between runs. The key's
// stored request had the old one: Stripe refuses the key as reused;
// nothing is charged; past the deadline search settles it.
func TestPaymentMethodChangedBetweenRuns(t *testing.T) {
	t.Parallel()
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
func TestAPISwitchedBackAndForthChargesOnce(t *testing.T) {
	t.Parallel()
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
func TestCredentialRotatedAndBackChargesOnce(t *testing.T) {
	t.Parallel()
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
func TestCredentialSetThenUnsetChargesOnce(t *testing.T) {
	t.Parallel()
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
func TestWindowMarginLoweredBetweenRuns(t *testing.T) {
	t.Parallel()
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
func TestScopeChangedWhileClaimPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.lostAnswer(e.b, "cus_1")
	before := len(e.srv.Log())
	_, err := e.biller(func(c *billing.Config) { c.Scope = "renamed" }).Charge(context.Background(), "cus_1", period, nil)
	var mm *claim.MismatchError
	if !errors.As(err, &mm) || posts(e, before) != 0 || e.count("cus_1") != 1 {
		t.Fatalf("Charge under a new scope = %v, %d POSTs", err, posts(e, before))
	}
}
