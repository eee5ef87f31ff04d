package billing_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/retry"
)

func wantHow(t *testing.T, r billing.Receipt, err error, how billing.Outcome) {
	t.Helper()
	if err != nil {
		t.Fatalf("Charge: %v", err)
	}
	if r.Outcome != how {
		t.Fatalf("receipt How = %v, want %v", r.Outcome, how)
	}
}

func wantCount(t *testing.T, e *env, customer string, n int) {
	t.Helper()
	if got := e.count(customer); got != n {
		t.Fatalf("Stripe holds %d charges for %s, period %s; want %d", got, customer, period, n)
	}
}

// Every request the fake saw for customer carried the same key.
func wantOneKey(t *testing.T, e *env, customer, key string) {
	t.Helper()
	for _, l := range e.srv.Log() {
		if l.Method == "POST" && l.Customer == customer && l.IdempotencyKey != key {
			t.Fatalf("a request for %s carried key %q, want %q (key from intent; every write carries a key)", customer, l.IdempotencyKey, key)
		}
	}
}

func TestChargeCreatedOnceThenAlreadyRecorded(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	r, err := e.b.Charge(ctx, "cus_a", period, nil)
	wantHow(t, r, err, billing.Created)
	if r.Outcome != billing.Created || r.StripeID == "" || r.Amount != amount || r.Currency != "usd" || r.Key.String() != e.key("cus_a") || r.Attempt != 1 {
		t.Fatalf("receipt %+v", r)
	}
	r2, err := e.b.Charge(ctx, "cus_a", period, nil)
	wantHow(t, r2, err, billing.AlreadyBilled)
	if r2.StripeID != r.StripeID {
		t.Fatalf("second receipt names %s, first %s", r2.StripeID, r.StripeID)
	}
	if n := e.srv.Stats().Requests; n != 1 {
		t.Fatalf("Stripe got %d requests; want 1 (the second Charge must not call Stripe)", n)
	}
	wantCount(t, e, "cus_a", 1)
	p := e.srv.Payments()[0]
	if p.IdempotencyKey != e.key("cus_a") || p.Metadata[billing.MetaKey] != e.key("cus_a") ||
		p.Metadata[billing.MetaCustomer] != "cus_a" || p.Metadata[billing.MetaPeriod] != period {
		t.Fatalf("charge %+v does not carry its key and metadata", p)
	}
	if c := e.claimOf("cus_a"); c.State != claim.StateSucceeded || c.StripeID != r.StripeID {
		t.Fatalf("claim %+v; want succeeded with %s", c, r.StripeID)
	}
}

// Seed: the response is lost after Stripe committed (commit, then the
// connection is cut). The retry carries the same key and gets the replay.
func TestChargeLostResponseIsReplayed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.FailNext(billingtest.Match{Customer: "cus_cut"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := e.b.Charge(context.Background(), "cus_cut", period, nil)
	wantHow(t, r, err, billing.Replayed)
	wantCount(t, e, "cus_cut", 1)
	wantOneKey(t, e, "cus_cut", e.key("cus_cut"))
	if st := e.srv.Stats(); st.Faults[billingtest.FaultCut] != 1 || st.Replays != 1 {
		t.Fatalf("stats %+v; want one cut and one replay", st)
	}
	if c := e.claimOf("cus_cut"); c.State != claim.StateSucceeded || c.StripeID != r.StripeID {
		t.Fatalf("claim %+v", c)
	}
}

// Seed: a slow response beyond the client's timeout while the first attempt
// is still executing at Stripe. The retry meets 409, waits, and gets the
// replay. The first request is held until a retry has met the 409, however
// slow the machine.
func TestChargeSlowBeyondAttemptTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var once sync.Once
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.Method == "POST" && r.Attempt == 1 {
			return billingtest.Fault{Kind: billingtest.FaultSlow, Delay: time.Minute, Release: release}
		}
		return billingtest.Fault{}
	}}, func(c *billing.Config) {
		c.Retry.AttemptTimeout = 200 * time.Millisecond
		c.Retry.MaxAttempts = 20
		c.Observe = func(ev billing.Event) {
			var se *stripe.Error
			if errors.As(ev.Err, &se) && se.HTTPStatusCode == 409 {
				once.Do(func() { close(release) })
			}
		}
	})
	r, err := e.b.Charge(context.Background(), "cus_slow", period, nil)
	wantHow(t, r, err, billing.Replayed)
	wantCount(t, e, "cus_slow", 1)
	wantOneKey(t, e, "cus_slow", e.key("cus_slow"))
	if st := e.srv.Stats(); st.InUse < 1 || st.Created != 1 {
		t.Fatalf("stats %+v; want at least one 409 and one object", st)
	}
}

// Answers that say "try again" are retried with the same key.
func TestChargeRetriesTransientAnswers(t *testing.T) {
	t.Parallel()
	for _, kind := range []billingtest.FaultKind{
		billingtest.FaultInFlight,    // 409 idempotency_key_in_use
		billingtest.FaultLockTimeout, // 429 lock_timeout
		billingtest.FaultRateLimit,   // 429 rate_limit
		billingtest.FaultErrorBefore, // 500 before commit
	} {
		t.Run(string(kind), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			e.srv.FailNext(billingtest.Match{Customer: "cus_t"}, billingtest.Fault{Kind: kind})
			r, err := e.b.Charge(context.Background(), "cus_t", period, nil)
			wantHow(t, r, err, billing.Created)
			wantCount(t, e, "cus_t", 1)
			wantOneKey(t, e, "cus_t", e.key("cus_t"))
			if st := e.srv.Stats(); st.Requests != 2 || st.Faults[kind] != 1 {
				t.Fatalf("stats %+v; want 2 requests, one %s", st, kind)
			}
		})
	}
}

// A 500 stored after commit is replayed forever (Stripe-Should-Retry: false),
// so the charge is found with Stripe's search instead.
func TestChargeErrorAfterCommitSettledFromSearch(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.FailNext(billingtest.Match{Customer: "cus_500"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	r, err := e.b.Charge(context.Background(), "cus_500", period, nil)
	wantHow(t, r, err, billing.Reconciled)
	wantCount(t, e, "cus_500", 1)
	p := e.srv.Payments()[0]
	if r.StripeID != p.ID {
		t.Fatalf("receipt names %s, Stripe made %s", r.StripeID, p.ID)
	}
	if c := e.claimOf("cus_500"); c.State != claim.StateSucceeded || c.StripeID != p.ID {
		t.Fatalf("claim %+v", c)
	}
	posts := 0
	for _, l := range e.srv.Log() {
		if l.Method == "POST" {
			posts++
		}
	}
	if posts != 1 {
		t.Fatalf("%d POSTs; a 500 with Stripe-Should-Retry: false must not be resent", posts)
	}
}

// Seed: declines recorded and not retried (outcomes are final). Billing again is an
// explicit re-bill under a new key.
func TestChargeDeclineIsFinalUntilRebill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_d", "insufficient_funds")
	_, err := e.b.Charge(ctx, "cus_d", period, nil)
	var fe *billing.ChargeError
	if !(errors.As(err, &fe) && errors.Is(err, billing.ErrDeclined)) {
		t.Fatalf("Charge: %v; want ErrDeclined", err)
	}
	if fe.DeclineCode != "insufficient_funds" || fe.Code != "card_declined" || fe.Key != e.key("cus_d") || fe.Attempt != 1 {
		t.Fatalf("FailedError %+v", fe)
	}
	if n := e.srv.Stats().Requests; n != 1 {
		t.Fatalf("%d requests; a decline must not be retried", n)
	}
	if c := e.claimOf("cus_d"); c.State != claim.StateFailed {
		t.Fatalf("claim %+v; want failed", c)
	}

	// Later calls return the recorded failure without calling Stripe.
	_, err = e.b.Charge(ctx, "cus_d", period, nil)
	var again *billing.ChargeError
	if !(errors.As(err, &again) && errors.Is(err, billing.ErrDeclined)) || again.Key != fe.Key || again.Err.Error() != fe.Err.Error() {
		t.Fatalf("second Charge: %v; want the recorded decline %q", err, fe.Err)
	}
	if n := e.srv.Stats().Requests; n != 1 {
		t.Fatalf("%d requests after the second Charge; want still 1", n)
	}
	wantCount(t, e, "cus_d", 0)

	// Attempt 1 is Charge's: Rebill refuses it.
	if _, err := e.b.Rebill(ctx, "cus_d", period, 1, nil); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("Rebill(attempt 1): %v; want ErrInvalid", err)
	}
	e.srv.Honor("cus_d")
	r, err := e.b.Rebill(ctx, "cus_d", period, 2, nil)
	wantHow(t, r, err, billing.Created)
	if r.Attempt != 2 || r.Key.String() == fe.Key {
		t.Fatalf("re-bill receipt %+v; want attempt 2 under a new key", r)
	}
	wantCount(t, e, "cus_d", 1)
	r, err = e.b.Rebill(ctx, "cus_d", period, 2, nil)
	wantHow(t, r, err, billing.AlreadyBilled)
	wantCount(t, e, "cus_d", 1)
	if n := len(e.srv.Payments()); n != 2 {
		t.Fatalf("%d payments; want the declined one and the re-bill", n)
	}
}

// Same key, same charge: the price is part of the claim. A different amount for a pending
// claim is refused before anything is sent.
func TestChargePriceChangedUnderPendingClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *billing.Config) { c.Price = flatPrice(3000) })
	e.crashedClaim("cus_p", amount)
	_, err := e.b.Charge(context.Background(), "cus_p", period, nil)
	var me *claim.MismatchError
	if !errors.As(err, &me) || me.Field != "amount" {
		t.Fatalf("Charge: %v; want *claim.MismatchError on amount", err)
	}
	if n := e.srv.Stats().Requests; n != 0 {
		t.Fatalf("%d requests; want none", n)
	}
}

// Stripe's idempotency_error (same key, other parameters) is a loud
// ErrKeyReused, never a new charge: a claim whose amount was edited after
// its charge was sent reaches it. (Switching Config.API while a claim is
// pending no longer does: the claim records its endpoint, and the Biller
// reports an ErrSentElsewhere without sending; see window_test.go.)
func TestChargeKeyReuse(t *testing.T) {
	t.Parallel()
	cases := map[string]func(e *env) *billing.Biller{
		"amount edited in the claim table": func(e *env) *billing.Biller {
			e.exec("UPDATE billonce_claims SET amount = 3000")
			return e.biller(func(c *billing.Config) { c.Price = flatPrice(3000) })
		},
	}
	for name, setup := range cases {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			key := e.crashedClaim("cus_k", amount)
			ch := e.chargeDirect("cus_k", key, amount)
			b := setup(e)
			_, err := b.Charge(context.Background(), "cus_k", period, nil)
			var kr *billing.ChargeError
			if !(errors.As(err, &kr) && errors.Is(err, billing.ErrKeyReused)) || kr.Key != key {
				t.Fatalf("Charge: %v; want ErrKeyReused for %s", err, key)
			}
			if st := e.srv.Stats(); st.IdempotencyErrors != 1 || st.Created != 1 {
				t.Fatalf("stats %+v; want one idempotency_error and only the first object", st)
			}
			wantCount(t, e, "cus_k", 1)
			if c := e.claimOf("cus_k"); c.State != claim.StatePending {
				t.Fatalf("claim %+v; want it left pending for a person", c)
			}
			_ = ch
		})
	}
}

// Unknown outcome: retries run out; the claim stays pending and the next
// Charge resumes it with the same key.
func TestChargeRetriesExhaustedThenResumed(t *testing.T) {
	t.Parallel()
	few := func(c *billing.Config) { c.Retry.MaxAttempts = 3 }
	fivehundred := billingtest.Fault{Kind: billingtest.FaultErrorBefore}

	t.Run("nothing committed", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, few)
		e.srv.FailNext(billingtest.Match{Customer: "cus_x"}, fivehundred, fivehundred, fivehundred)
		_, err := e.b.Charge(context.Background(), "cus_x", period, nil)
		var ue *billing.ChargeError
		var ex *retry.ExhaustedError
		if !(errors.As(err, &ue) && errors.Is(err, billing.ErrOutcomeUnknown)) || !errors.As(err, &ex) || ex.Attempts != 3 {
			t.Fatalf("Charge: %v; want ErrOutcomeUnknown after 3 attempts", err)
		}
		if c := e.claimOf("cus_x"); c.State != claim.StatePending {
			t.Fatalf("claim %+v; want pending", c)
		}
		wantCount(t, e, "cus_x", 0)
		r, err := e.b.Charge(context.Background(), "cus_x", period, nil)
		wantHow(t, r, err, billing.Created)
		wantCount(t, e, "cus_x", 1)
		wantOneKey(t, e, "cus_x", e.key("cus_x"))
	})

	t.Run("first attempt committed, search down", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, few)
		e.srv.FailNext(billingtest.Match{Customer: "cus_y"}, billingtest.Fault{Kind: billingtest.FaultCut}, fivehundred, fivehundred)
		e.srv.FailNext(billingtest.Match{Path: "/v1/charges/search"}, fivehundred)
		_, err := e.b.Charge(context.Background(), "cus_y", period, nil)
		var ue *billing.ChargeError
		if !(errors.As(err, &ue) && errors.Is(err, billing.ErrOutcomeUnknown)) {
			t.Fatalf("Charge: %v; want ErrOutcomeUnknown", err)
		}
		if c := e.claimOf("cus_y"); c.State != claim.StatePending {
			t.Fatalf("claim %+v; want pending", c)
		}
		wantCount(t, e, "cus_y", 1)
		r, err := e.b.Charge(context.Background(), "cus_y", period, nil)
		wantHow(t, r, err, billing.Replayed)
		wantCount(t, e, "cus_y", 1)
		wantOneKey(t, e, "cus_y", e.key("cus_y"))
	})
}

// Seed: the runner crashed after claiming, before sending. Another runner
// resumes the claim with the same key once the lease has run out.
func TestChargeCrashAfterClaimBeforeStripe(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.crashedClaim("cus_c", amount)
	r, err := e.b.Charge(context.Background(), "cus_c", period, nil)
	wantHow(t, r, err, billing.Created)
	wantCount(t, e, "cus_c", 1)
	if c := e.claimOf("cus_c"); c.State != claim.StateSucceeded || c.Leases != 2 {
		t.Fatalf("claim %+v; want succeeded on its second attempt", c)
	}
}

// Seed: the runner crashed after Stripe charged, before recording it. The
// resumed claim sends the same key and gets Stripe's replay.
func TestChargeCrashAfterStripeBeforeSucceed(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := e.crashedClaim("cus_s", amount)
	ch := e.chargeDirect("cus_s", key, amount)
	r, err := e.b.Charge(context.Background(), "cus_s", period, nil)
	wantHow(t, r, err, billing.Replayed)
	if r.StripeID != ch.ID {
		t.Fatalf("receipt names %s; the crashed runner's charge is %s", r.StripeID, ch.ID)
	}
	wantCount(t, e, "cus_s", 1)
	if c := e.claimOf("cus_s"); c.State != claim.StateSucceeded || c.StripeID != ch.ID {
		t.Fatalf("claim %+v", c)
	}
}

// Seed: the window closes. A claim pending for 25 hours is reconciled with
// Stripe's search before its key is sent again (the deadline).
func TestChargeResumeAfterKeyWindow(t *testing.T) {
	t.Parallel()
	t.Run("charge exists: reconciled, not resent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		key := e.crashedClaim("cus_w", amount)
		ch := e.chargeDirect("cus_w", key, amount)
		e.ageClaim(key, 25*time.Hour)
		e.srv.Advance(25 * time.Hour)
		r, err := e.b.Charge(context.Background(), "cus_w", period, nil)
		wantHow(t, r, err, billing.Reconciled)
		if r.StripeID != ch.ID {
			t.Fatalf("receipt names %s, want %s", r.StripeID, ch.ID)
		}
		wantCount(t, e, "cus_w", 1)
		if c := e.claimOf("cus_w"); c.State != claim.StateSucceeded || c.StripeID != ch.ID {
			t.Fatalf("claim %+v", c)
		}
		// The fake really forgot the key: resending it now, as code
		// without reconciliation would, makes a second charge.
		e.chargeDirect("cus_w", key, amount)
		wantCount(t, e, "cus_w", 2)
	})
	t.Run("no charge: resent with the same key", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		key := e.crashedClaim("cus_n", amount)
		e.ageClaim(key, 25*time.Hour)
		e.srv.Advance(25 * time.Hour)
		r, err := e.b.Charge(context.Background(), "cus_n", period, nil)
		wantHow(t, r, err, billing.Created)
		wantCount(t, e, "cus_n", 1)
		wantOneKey(t, e, "cus_n", key)
	})
	t.Run("search fails: nothing sent", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t, func(c *billing.Config) { c.Retry.MaxAttempts = 2 })
		key := e.crashedClaim("cus_f", amount)
		e.chargeDirect("cus_f", key, amount)
		e.ageClaim(key, 25*time.Hour)
		e.srv.Advance(25 * time.Hour)
		down := billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		e.srv.FailNext(billingtest.Match{Path: "/v1/charges/search"}, down, down)
		_, err := e.b.Charge(context.Background(), "cus_f", period, nil)
		var ne *billing.ChargeError
		if !(errors.As(err, &ne) && errors.Is(err, billing.ErrNeedsReconciliation)) || ne.Key != key || !strings.Contains(ne.Error(), "claimed 25h") {
			t.Fatalf("Charge: %v; want ErrNeedsReconciliation", err)
		}
		wantCount(t, e, "cus_f", 1)
		if st := e.srv.Stats(); st.Created != 1 {
			t.Fatalf("stats %+v; nothing may be sent while the outcome is unknown", st)
		}
		if c := e.claimOf("cus_f"); c.State != claim.StatePending {
			t.Fatalf("claim %+v; want pending", c)
		}
	})
}

// A live claim of another runner is reported, not charged.
func TestChargeInProgress(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := e.key("cus_i")
	if _, err := engineOf(e.store).Claim(context.Background(), claimengine.Request{Customer: "cus_i", Period: period, Key: key,
		Amount: amount, Currency: "usd", Owner: "other-runner"}); err != nil {
		t.Fatal(err)
	}
	_, err := e.b.Charge(context.Background(), "cus_i", period, nil)
	var ip *billing.ChargeError
	if !(errors.As(err, &ip) && errors.Is(err, billing.ErrInProgress)) || !strings.Contains(ip.Error(), "other-runner") || ip.Key != key || ip.Until.IsZero() {
		t.Fatalf("Charge: %v; want ErrInProgress naming other-runner", err)
	}
	if n := e.srv.Stats().Requests; n != 0 {
		t.Fatalf("%d requests; want none", n)
	}
}

// watchStore passes every call to the real store and reports Claim
// outcomes, so a test can act once a Biller has seen one.
type watchStore struct {
	testStore
	outcomes chan claimengine.Outcome
}

func (w watchStore) Claim(ctx context.Context, req claimengine.Request) (claimResult, error) {
	res, err := w.claimEngine.Claim(ctx, req)
	if err == nil {
		select {
		case w.outcomes <- res.Outcome:
		default:
		}
	}
	return res, err
}

// With InProgressWait, a second replica waits for the first one's charge
// and returns its receipt.
func TestChargeInProgressWait(t *testing.T) {
	t.Parallel()
	release, arrived := make(chan struct{}), make(chan struct{}, 1)
	e := newEnvWith(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.Method != "POST" {
			return billingtest.Fault{}
		}
		arrived <- struct{}{}
		return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
	}})
	ctx := context.Background()
	type result struct {
		r   billing.Receipt
		err error
	}
	first := make(chan result, 1)
	go func() {
		r, err := e.b.Charge(ctx, "cus_w", period, nil)
		first <- result{r, err}
	}()
	<-arrived // the first replica's request is executing at Stripe

	w := watchStore{testStore: wrapStore(e.store), outcomes: make(chan claimengine.Outcome, 1)}
	second := e.biller(func(c *billing.Config) { c.Claims = w; c.InProgressWait = 30 * time.Second })
	waiter := make(chan result, 1)
	go func() {
		r, err := second.Charge(ctx, "cus_w", period, nil)
		waiter <- result{r, err}
	}()
	if o := <-w.outcomes; o != claimengine.InProgress {
		t.Fatalf("second replica's claim: %v; want InProgress", o)
	}
	e.srv.SetScript(nil)
	close(release)

	a, b := <-first, <-waiter
	wantHow(t, a.r, a.err, billing.Created)
	wantHow(t, b.r, b.err, billing.AlreadyBilled)
	if a.r.StripeID != b.r.StripeID {
		t.Fatalf("receipts name %s and %s", a.r.StripeID, b.r.StripeID)
	}
	wantCount(t, e, "cus_w", 1)
	if n := e.srv.Stats().Requests; n != 1 {
		t.Fatalf("%d requests; want 1", n)
	}
}

// Claim before send: when the claim cannot be written, nothing is sent.
func TestChargeClaimStoreDown(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.pool.Close()
	if _, err := e.b.Charge(context.Background(), "cus_z", period, nil); err == nil {
		t.Fatal("Charge succeeded on a closed pool")
	}
	if n := e.srv.Stats().Requests; n != 0 {
		t.Fatalf("%d requests; nothing may be sent without a claim", n)
	}
}

// The PaymentIntents API gets the same protections: a lost response is
// replayed, a decline is final, a stored 500 is settled from the payment
// intents search, and an old claim is reconciled.
func TestChargePaymentIntents(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *billing.Config) { c.API = billing.PaymentIntents })
	ctx := context.Background()

	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := e.b.Charge(ctx, "cus_1", period, nil)
	wantHow(t, r, err, billing.Replayed)
	if p := e.srv.Payments()[0]; p.Object != "payment_intent" || p.PaymentMethod != "pm_card_visa" || r.StripeID != p.ID {
		t.Fatalf("payment %+v, receipt %+v", p, r)
	}
	wantCount(t, e, "cus_1", 1)

	e.srv.FailNext(billingtest.Match{Customer: "cus_2"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	r, err = e.b.Charge(ctx, "cus_2", period, nil)
	wantHow(t, r, err, billing.Reconciled)
	wantCount(t, e, "cus_2", 1)

	e.srv.Decline("cus_3", "expired_card")
	_, err = e.b.Charge(ctx, "cus_3", period, nil)
	var fe *billing.ChargeError
	if !(errors.As(err, &fe) && errors.Is(err, billing.ErrDeclined)) || fe.DeclineCode != "expired_card" {
		t.Fatalf("Charge: %v; want ErrDeclined expired_card", err)
	}
	wantCount(t, e, "cus_3", 0)

	// A Run resumes a crashed PaymentIntents claim with the price's
	// payment method.
	e.crashedClaim("cus_4", amount)
	sum, err := e.b.Reconcile(ctx, nil)
	if err != nil || sum.Created != 1 {
		t.Fatalf("Reconcile: %+v, %v", sum.Progress, err)
	}
	wantCount(t, e, "cus_4", 1)
}

// Once a re-bill has succeeded, the period is billed: Charge and Run report
// the customer as done, not as the first attempt's decline.
func TestChargeAfterSuccessfulRebill(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	e.srv.Decline("cus_r", "")
	if _, err := e.b.Charge(ctx, "cus_r", period, nil); err == nil {
		t.Fatal("the decline did not fail")
	}
	if _, err := e.b.Rebill(ctx, "cus_r", period, 2, nil); err == nil {
		t.Fatal("the second decline did not fail")
	}
	_, err := e.b.Charge(ctx, "cus_r", period, nil)
	var fe *billing.ChargeError
	if !(errors.As(err, &fe) && errors.Is(err, billing.ErrDeclined)) || fe.Attempt != 2 {
		t.Fatalf("Charge after two declines: %v; want the latest failure, attempt 2", err)
	}
	e.srv.Honor("cus_r")
	rebill, err := e.b.Rebill(ctx, "cus_r", period, 3, nil)
	wantHow(t, rebill, err, billing.Created)
	requests := e.srv.Stats().Requests

	r, err := e.b.Charge(ctx, "cus_r", period, nil)
	wantHow(t, r, err, billing.AlreadyBilled)
	if r.StripeID != rebill.StripeID || r.Attempt != 3 || r.Key != rebill.Key {
		t.Fatalf("Charge after the re-bill: %+v; want the re-bill's receipt %+v", r, rebill)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_r"), nil)
	if err != nil || sum.AlreadyBilled != 1 || !sum.Complete() {
		t.Fatalf("Run after the re-bill: %+v, %v", sum.Progress, err)
	}
	if n := e.srv.Stats().Requests; n != requests {
		t.Fatalf("%d more requests; want none", n-requests)
	}
	wantCount(t, e, "cus_r", 1)
}

// A re-bill of a period that is billed already charges nothing and says
// which attempt paid, as Charge does.
func TestRebillOfABilledPeriodReportsIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	paid, err := e.b.Charge(ctx, "cus_paid", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, attempt := range []int{2, 3, 2} {
		r, err := e.b.Rebill(ctx, "cus_paid", period, attempt, nil)
		if err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != paid.StripeID || r.Attempt != 1 {
			t.Fatalf("Rebill(%d) after attempt 1 paid = %+v, %v; want AlreadyBilled by attempt 1 with %s", attempt, r, err, paid.StripeID)
		}
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_paid", period)

	// Declined, re-billed with success, then re-billed again.
	e.srv.Decline("cus_late", "card_declined")
	if _, err := e.b.Charge(ctx, "cus_late", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("Charge: %v; want declined", err)
	}
	e.srv.Honor("cus_late")
	r2, err := e.b.Rebill(ctx, "cus_late", period, 2, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, attempt := range []int{3, 4} {
		r, err := e.b.Rebill(ctx, "cus_late", period, attempt, nil)
		if err != nil || r.Outcome != billing.AlreadyBilled || r.StripeID != r2.StripeID || r.Attempt != 2 {
			t.Fatalf("Rebill(%d) after attempt 2 paid = %+v, %v; want AlreadyBilled by attempt 2 with %s", attempt, r, err, r2.StripeID)
		}
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_late", period)
}

// Crash points after the database committed: Succeed, Fail and Reopen
// that wrote their row but reported an error. The next call settles once.
func TestStoreFailingAfterCommitChargesOnce(t *testing.T) {
	t.Parallel()
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
