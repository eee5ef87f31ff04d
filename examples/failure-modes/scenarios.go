package main

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// clientTimeout is how long a caller waits for Stripe before giving up on
// an attempt; slowCharge is how long the fake takes over a slow charge.
const (
	clientTimeout = 100 * time.Millisecond
	slowCharge    = 400 * time.Millisecond
)

var postCharges = billingtest.Match{Method: http.MethodPost, Path: "/v1/charges"}

// scenarios are the ways billing code charges twice or not at all, each as
// the unsafe code and as billonce.
var scenarios = append([]scenario{
	{
		id:        "retried-closure",
		name:      "retried closure makes the key; response lost after commit",
		customers: []string{"cus_closure"},
		naive:     naiveRetriedClosure,
		billonce: func(ctx context.Context, e *env) error {
			cutNextCharge(e)
			return chargeOnce(ctx, e, "cus_closure", nil)
		},
	},
	{
		id:        "roundtripper",
		name:      "RoundTripper inside the retry layer makes the key",
		customers: []string{"cus_transport"},
		naive:     naiveKeyPerRequest,
		billonce: func(ctx context.Context, e *env) error {
			cutNextCharge(e)
			// The same retrying transport, now under billonce: the key is
			// set above it, so its resends carry the same key.
			return chargeOnce(ctx, e, "cus_transport", func(c *billing.Config, _ *claim.Config) {
				c.HTTPClient = &http.Client{Transport: &retryingTransport{Base: newTransport(), Attempts: 3}}
			})
		},
	},
	{
		id:        "shared-key",
		name:      "key made once at construction, shared by 3 customers",
		customers: []string{"cus_a", "cus_b", "cus_c"},
		naive:     naiveSharedKey,
		billonce:  billonceRun("cus_a", "cus_b", "cus_c"),
	},
	{
		id:        "goroutine-timeout",
		name:      "goroutine retried after a client timeout, first still in flight",
		customers: []string{"cus_slow"},
		naive:     naiveGoroutineRetry,
		billonce:  billonceSlow("cus_slow"),
	},
	{
		id:        "409-in-flight",
		name:      "409 idempotency_key_in_use treated as a failure",
		customers: []string{"cus_409"},
		naive:     naive409,
		billonce:  billonceSlow("cus_409"),
	},
	{
		id:        "replicas",
		name:      "three replicas race the cron",
		customers: []string{"cus_cron"},
		naive:     naiveReplicas,
		billonce:  billonceReplicas,
	},
	{
		id:        "crash",
		name:      "crash between Stripe and the database",
		customers: []string{"cus_crash"},
		naive:     naiveCrash,
		billonce:  billonceCrash,
	},
	{
		id:        "25h-later",
		name:      "retry 25 hours later, after Stripe forgot the key",
		customers: []string{"cus_late"},
		naive:     naive25h,
		billonce:  billonce25h,
	},
}, append(append(append(meterScenarios(), invoiceScenarios()...), refundScenarios()...), accountScenarios()...)...)

// cutNextCharge makes the fake commit the next charge and cut the
// connection before the client has the answer.
func cutNextCharge(e *env) {
	e.stripe.FailNext(postCharges, billingtest.Fault{Kind: billingtest.FaultCut})
}

// chargeOnce is billonce's side of the simplest rows: one Charge.
func chargeOnce(ctx context.Context, e *env, customer string, tune func(*billing.Config, *claim.Config)) error {
	b, err := e.biller(ctx, "billing-0", tune)
	if err != nil {
		return err
	}
	r, err := b.Charge(ctx, customer, period, nil)
	e.logf("billonce: Charge(%s): %s %s, err=%v", customer, r.Outcome, r.StripeID, err)
	return nil
}

// ---- 1. retried closure ----

func naiveRetriedClosure(ctx context.Context, e *env) error {
	cutNextCharge(e)
	charges := e.stripeClient(nil)
	attempt := 0
	op := func() error {
		attempt++
		key := uuid.NewString() // inside the closure: a new key per attempt
		ch, err := charges.New(chargeParams(ctx, "cus_closure", key))
		if err == nil {
			e.logf("unsafe: attempt %d (key %s…): charged %s", attempt, key[:8], ch.ID)
		} else {
			e.logf("unsafe: attempt %d (key %s…): %v", attempt, key[:8], err)
		}
		return err
	}
	b := backoff.WithContext(backoff.WithMaxRetries(backoff.NewConstantBackOff(5*time.Millisecond), 3), ctx)
	if err := backoff.Retry(op, b); err != nil {
		e.logf("unsafe: gave up: %v", err)
	}
	return nil
}

// ---- 2. RoundTripper making the key under the retry layer ----

// keyPerRequest is idempotency middleware that makes the key itself. Under
// a retry layer it runs once per attempt.
type keyPerRequest struct{ Base http.RoundTripper }

func (t keyPerRequest) RoundTrip(req *http.Request) (*http.Response, error) {
	r := req.Clone(req.Context())
	if r.Method == http.MethodPost {
		r.Header.Set("Idempotency-Key", uuid.NewString())
	}
	return t.Base.RoundTrip(r)
}

func naiveKeyPerRequest(ctx context.Context, e *env) error {
	cutNextCharge(e)
	hc := &http.Client{Transport: &retryingTransport{Base: keyPerRequest{Base: newTransport()}, Attempts: 3}}
	ch, err := e.stripeClient(hc).New(chargeParams(ctx, "cus_transport", ""))
	if err == nil {
		e.logf("unsafe: charged %s (the transport retried with a new key)", ch.ID)
	} else {
		e.logf("unsafe: %v", err)
	}
	return nil
}

// ---- 3. key fixed at construction ----

// sharedKeyBiller computes its key when it is built, not per charge.
type sharedKeyBiller struct {
	charges interface {
		New(*stripe.ChargeParams) (*stripe.Charge, error)
	}
	key string
}

func naiveSharedKey(ctx context.Context, e *env) error {
	nb := &sharedKeyBiller{charges: e.stripeClient(nil), key: uuid.NewString()}
	for _, c := range []string{"cus_a", "cus_b", "cus_c"} {
		ch, err := nb.charges.New(chargeParams(ctx, c, nb.key))
		if err != nil {
			e.logf("unsafe: %s: %v (logged; next customer)", c, err)
			continue
		}
		e.logf("unsafe: %s: %s", c, ch.ID)
	}
	return nil
}

func billonceRun(customers ...string) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		b, err := e.biller(ctx, "billing-0", nil)
		if err != nil {
			return err
		}
		sum, err := b.Run(ctx, period, billing.Customers(customers...), nil)
		e.logf("billonce: Run: created %d, already done %d, failed %d, pending %d, err=%v",
			sum.Created, sum.AlreadyBilled, sum.Declined, sum.Pending, err)
		return nil
	}
}

// ---- 4. goroutine retried after a timeout ----

func naiveGoroutineRetry(ctx context.Context, e *env) error {
	e.stripe.FailNext(postCharges, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: slowCharge})
	charges := e.stripeClient(nil)
	var wg sync.WaitGroup
	defer wg.Wait() // the program ends when every request has
	for attempt := 1; attempt <= 3; attempt++ {
		key := uuid.NewString()
		done := make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := charges.New(chargeParams(ctx, "cus_slow", key))
			done <- err
		}()
		select {
		case err := <-done:
			e.logf("unsafe: attempt %d: err=%v", attempt, err)
			if err == nil {
				return nil
			}
		case <-time.After(clientTimeout):
			// The attempt is abandoned, not stopped: it is still at Stripe.
			e.logf("unsafe: attempt %d timed out after %v; starting another with a new key", attempt, clientTimeout)
		}
	}
	return nil
}

// billonceSlow charges with an attempt timeout shorter than the fake's
// answer: the second attempt meets the first still in flight (409), waits,
// and gets the first one's charge replayed.
func billonceSlow(customer string) func(context.Context, *env) error {
	return func(ctx context.Context, e *env) error {
		e.stripe.FailNext(postCharges, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: slowCharge})
		return chargeOnce(ctx, e, customer, func(c *billing.Config, _ *claim.Config) {
			c.Retry.AttemptTimeout = clientTimeout
		})
	}
}

// ---- 5. 409 in flight ----

func naive409(ctx context.Context, e *env) error {
	e.stripe.FailNext(postCharges, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: slowCharge})
	charges := e.stripeClient(nil)
	key := "charge-cus_409-" + period // a stable key: this code learned row 1
	for attempt := 1; attempt <= 4; attempt++ {
		actx, cancel := context.WithTimeout(ctx, clientTimeout)
		ch, err := charges.New(chargeParams(actx, "cus_409", key))
		cancel()
		if err == nil {
			e.logf("unsafe: attempt %d: charged %s", attempt, ch.ID)
			return nil
		}
		e.logf("unsafe: attempt %d: %v", attempt, err)
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusConflict {
			// "Key in use": the key looks burnt, so the code takes a new
			// one. The first request was only still running.
			key = uuid.NewString()
		}
		time.Sleep(5 * time.Millisecond)
	}
	return nil
}

// ---- 6. replicas racing the cron ----

const replicas = 3

func naiveReplicas(ctx context.Context, e *env) error {
	if err := e.billedTable(ctx); err != nil {
		return err
	}
	var checked, wg sync.WaitGroup
	checked.Add(replicas)
	errs := make([]error, replicas)
	for i := range replicas {
		db, err := e.newPool(ctx)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			billed, err := e.alreadyBilled(ctx, db, "cus_cron")
			// The replicas' cron ticks fire in the same second: each
			// checks before any of them has written its row.
			checked.Done()
			checked.Wait()
			if err != nil || billed {
				errs[i] = err
				return
			}
			ch, err := e.stripeClient(nil).New(chargeParams(ctx, "cus_cron", uuid.NewString()))
			if err != nil {
				e.logf("unsafe: replica %d: %v", i, err)
				return
			}
			err = e.markBilled(ctx, db, "cus_cron", ch.ID)
			e.logf("unsafe: replica %d charged %s; recording it: err=%v", i, ch.ID, err)
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

func billonceReplicas(ctx context.Context, e *env) error {
	billers := make([]*billing.Biller, replicas)
	for i := range billers {
		var err error
		if billers[i], err = e.biller(ctx, "replica-"+string(rune('a'+i)), nil); err != nil {
			return err
		}
	}
	var start, wg sync.WaitGroup
	start.Add(1)
	for i, b := range billers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start.Wait()
			sum, err := b.Run(ctx, period, billing.Customers("cus_cron"), nil)
			e.logf("billonce: replica %d: created %d, already done %d, pending %d, err=%v",
				i, sum.Created, sum.AlreadyBilled, sum.Pending, err)
		}()
	}
	start.Done()
	wg.Wait()
	return nil
}

// ---- 7. crash between Stripe and the database ----

func naiveCrash(ctx context.Context, e *env) error {
	if err := e.billedTable(ctx); err != nil {
		return err
	}
	bill := func(db *pgxpool.Pool) error {
		billed, err := e.alreadyBilled(ctx, db, "cus_crash")
		if err != nil || billed {
			return err
		}
		ch, err := e.stripeClient(nil).New(chargeParams(ctx, "cus_crash", uuid.NewString()))
		if err != nil {
			return err
		}
		return e.markBilled(ctx, db, "cus_crash", ch.ID)
	}
	db, err := e.newPool(ctx)
	if err != nil {
		return err
	}
	err = crashDuringCharge(ctx, e, db, func() error { return bill(db) })
	e.logf("unsafe: first run died after Stripe charged: %v", err)
	db, err = e.newPool(ctx)
	if err != nil {
		return err
	}
	err = bill(db)
	e.logf("unsafe: restart found no record and charged again: err=%v", err)
	return nil
}

func billonceCrash(ctx context.Context, e *env) error {
	// A short lease, so the restart does not wait the default two minutes
	// for the dead replica's claim to expire.
	tune := func(c *billing.Config, cc *claim.Config) {
		cc.Lease = time.Second
		c.InProgressWait = 10 * time.Second
	}
	db, err := e.newPool(ctx)
	if err != nil {
		return err
	}
	b, err := e.billerOn(ctx, db, "billing-0", tune)
	if err != nil {
		return err
	}
	err = crashDuringCharge(ctx, e, db, func() error { _, err := b.Charge(ctx, "cus_crash", period, nil); return err })
	e.logf("billonce: first run died after Stripe charged: %v", err)
	b, err = e.biller(ctx, "billing-0-restarted", tune)
	if err != nil {
		return err
	}
	r, err := b.Charge(ctx, "cus_crash", period, nil)
	e.logf("billonce: restart resumed the claim with its key: %s %s, err=%v", r.Outcome, r.StripeID, err)
	return nil
}

// ---- 8. 25 hours later ----

// failTheNight makes the fake commit the next charge and cut its answer,
// then answer 500 to the retry (an incident at Stripe), so the run gives up
// without knowing whether the charge exists.
func failTheNight(e *env) {
	e.stripe.FailNext(postCharges, billingtest.Fault{Kind: billingtest.FaultCut}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
}

const day = 25 * time.Hour

func naive25h(ctx context.Context, e *env) error {
	failTheNight(e)
	charges := e.stripeClient(nil)
	key := "charge-cus_late-" + period // stable, and reused the next day
	for attempt := 1; attempt <= 2; attempt++ {
		_, err := charges.New(chargeParams(ctx, "cus_late", key))
		e.logf("unsafe: day 1, attempt %d: %v", attempt, err)
	}
	e.stripe.Advance(day)
	ch, err := charges.New(chargeParams(ctx, "cus_late", key))
	if err == nil {
		e.logf("unsafe: day 2, same key: charged %s (Stripe had forgotten the key)", ch.ID)
	} else {
		e.logf("unsafe: day 2: %v", err)
	}
	return nil
}

func billonce25h(ctx context.Context, e *env) error {
	failTheNight(e)
	// The search billonce makes after an unknown outcome fails too.
	e.stripe.FailNext(billingtest.Match{Method: http.MethodGet, Path: "/v1/charges/search"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	b, err := e.biller(ctx, "cron-day-1", func(c *billing.Config, _ *claim.Config) { c.Retry.MaxAttempts = 2 })
	if err != nil {
		return err
	}
	_, err = b.Charge(ctx, "cus_late", period, nil)
	e.logf("billonce: day 1: %v", err)

	// 25 hours pass: on Stripe's clock, and on the database's, which dates
	// the claim.
	e.stripe.Advance(day)
	if _, err := e.pool.Exec(ctx, "UPDATE "+e.schema+"."+claim.DefaultTable+" SET created_at = created_at - make_interval(secs => $1), first_sent_at = first_sent_at - make_interval(secs => $1)", day.Seconds()); err != nil {
		return err
	}
	if b, err = e.biller(ctx, "cron-day-2", nil); err != nil {
		return err
	}
	r, err := b.Charge(ctx, "cus_late", period, nil)
	e.logf("billonce: day 2: %s %s, err=%v", r.Outcome, r.StripeID, err)
	return nil
}
