package retrykey

import (
	"context"
	crand "crypto/rand"
	"errors"
	"fmt"
	"math/rand"
	"net/http"
	"time"

	"github.com/avast/retry-go/v4"
	backoff "github.com/cenkalti/backoff/v4"
	backoff5 "github.com/cenkalti/backoff/v5"
	"github.com/google/uuid"
	"github.com/matryer/try"
	goretry "github.com/sethvargo/go-retry"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/idemkey"
)

var charges charge.Client

func params(customer string) *stripe.ChargeParams {
	return &stripe.ChargeParams{Customer: stripe.String(customer), Amount: stripe.Int64(100)}
}

// ---- reported ----

func closureVar(customer string) error {
	op := func() error {
		p := params(customer)
		p.IdempotencyKey = stripe.String(uuid.NewString()) // want `idempotency key changes between attempts: this function literal runs once per attempt of backoff.Retry, and it is made by uuid.NewString\(\) inside it`
		_, err := charges.New(p)
		return err
	}
	return backoff.Retry(op, backoff.NewExponentialBackOff())
}

func closureInline(customer string) error {
	return retry.Do(func() error {
		key := fmt.Sprintf("%s-%d", customer, time.Now().UnixNano())
		p := params(customer)
		p.SetIdempotencyKey(key) // want `retry.Do, and it is made by time.Now\(\) inside it`
		_, err := charges.New(p)
		return err
	})
}

func backoffV5(ctx context.Context, customer string) error {
	_, err := backoff5.Retry(ctx, func() (*stripe.Charge, error) {
		p := params(customer)
		p.IdempotencyKey = stripe.String(uuid.New().String()) // want `backoff.Retry, and it is made by uuid.New\(\)`
		return charges.New(p)
	})
	return err
}

func sethvargo(ctx context.Context, b goretry.Backoff, customer string) error {
	return goretry.Do(ctx, b, func(ctx context.Context) error {
		p := params(customer)
		p.IdempotencyKey = stripe.String(crand.Text()) // want `retry.Do, and it is made by rand.Text\(\)`
		_, err := charges.New(p)
		return err
	})
}

func counter(customer string) error {
	attempt := 0
	return backoff.Retry(func() error {
		attempt++
		p := params(customer)
		p.IdempotencyKey = stripe.String(fmt.Sprintf("%s-%d", customer, attempt)) // want `it includes the counter attempt, which changes on every pass`
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

func retryLoop(customer string) error {
	var err error
	for attempt := 1; attempt <= 3; attempt++ {
		p := params(customer)
		p.IdempotencyKey = stripe.String(fmt.Sprint(customer, attempt)) // want `the loop at line 83 repeats the request after an error, and it includes the counter attempt`
		if _, err = charges.New(p); err == nil {
			return nil
		}
	}
	return err
}

func retryLoopRand(customer string) error {
	for {
		p := params(customer)
		p.IdempotencyKey = stripe.String(fmt.Sprint(rand.Int63())) // want `it is made by rand.Int63\(\) inside it`
		_, err := charges.New(p)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		return nil
	}
}

// A key that looks burnt after a 409 is replaced: the first request was
// only still running.
func newKeyOn409(customer string) {
	key := "charge-" + customer
	for range 4 {
		p := params(customer)
		p.IdempotencyKey = stripe.String(key) // want `it is made by uuid.NewString\(\) inside it`
		_, err := charges.New(p)
		if err == nil {
			return
		}
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusConflict {
			key = uuid.NewString()
		}
	}
}

// A goroutine per attempt, abandoned on timeout.
func goroutinePerAttempt(customer string) {
	for attempt := 1; attempt <= 3; attempt++ {
		key := uuid.NewString()
		done := make(chan error, 1)
		go func() {
			p := params(customer)
			p.IdempotencyKey = stripe.String(key) // want `the loop at line 126 repeats the request after an error, and it is made by uuid.NewString\(\) inside it`
			_, err := charges.New(p)
			done <- err
		}()
		select {
		case err := <-done:
			if err == nil {
				return
			}
		case <-time.After(time.Second):
		}
	}
}

type keyTransport struct{ base http.RoundTripper }

func (t keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Idempotency-Key", uuid.NewString()) // want `RoundTrip runs once per attempt of every retrying transport`
	return t.base.RoundTrip(r)
}

type headerMapTransport struct{ base http.RoundTripper }

func (t headerMapTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r.Header["Idempotency-Key"] = []string{fmt.Sprint(time.Now().UnixNano())} // want `RoundTrip runs once per attempt`
	return t.base.RoundTrip(r)
}

// A helper called from the retried function makes the key.
func chargeWithFreshKey(customer string) error {
	p := params(customer)
	p.IdempotencyKey = stripe.String(uuid.NewString()) // want `chargeWithFreshKey runs once per attempt of backoff.Retry`
	_, err := charges.New(p)
	return err
}

func callsHelper(customer string) error {
	return backoff.Retry(func() error { return chargeWithFreshKey(customer) }, backoff.NewExponentialBackOff())
}

// The attempt number handed to the retried function.
func attemptParam(customer string) error {
	return try.Do(func(attempt int) (bool, error) {
		p := params(customer)
		p.IdempotencyKey = stripe.String(fmt.Sprint(customer, "-", attempt)) // want `runs once per attempt of try.Do, and it includes the attempt number attempt`
		_, err := charges.New(p)
		return attempt < 3, err
	})
}

// ---- not reported ----

// The key comes from the operation's identity inside the closure: the same
// on every attempt.
func identityKey(customer, period string) error {
	return backoff.Retry(func() error {
		key, err := idemkey.For("charge", customer, period)
		if err != nil {
			return backoff.Permanent(err)
		}
		p := params(customer)
		p.IdempotencyKey = stripe.String(key.String())
		_, err = charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

// The key is made before the loop and captured.
func keyBeforeLoop(customer string) error {
	key := uuid.NewString()
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		p := params(customer)
		p.IdempotencyKey = stripe.String(key)
		if _, err = charges.New(p); err == nil {
			return nil
		}
	}
	return err
}

// The key is made before the retry and captured by the closure.
func keyBeforeRetry(customer string) error {
	key := uuid.NewString()
	return backoff.Retry(func() error {
		p := params(customer)
		p.IdempotencyKey = stripe.String(key)
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

// The clock is used inside the closure, but not for the key.
func clockNotKey(customer, period string) error {
	key, _ := idemkey.For("charge", customer, period)
	return backoff.Retry(func() error {
		p := params(customer)
		p.IdempotencyKey = stripe.String(key.String())
		p.AddMetadata("attempted_at", time.Now().String())
		_, err := charges.New(p)
		return err
	}, backoff.NewExponentialBackOff())
}

// A loop over customers is not a retry loop: a key per customer is right.
func perCustomer(customers []string, period string) {
	for i := 0; i < len(customers); i++ {
		p := params(customers[i])
		p.IdempotencyKey = stripe.String("charge-" + customers[i] + "-" + period)
		if _, err := charges.New(p); err == nil {
			continue
		}
	}
}

// A RoundTrip that copies the key from the request's context.
type ctxKey struct{}

type ctxTransport struct{ base http.RoundTripper }

func (t ctxTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if k, ok := r.Context().Value(ctxKey{}).(string); ok {
		r.Header.Set("Idempotency-Key", k)
	}
	return t.base.RoundTrip(r)
}

// A request id (not the key) from a random source in RoundTrip.
type idTransport struct{ base http.RoundTripper }

func (t idTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r.Header.Set("X-Request-Id", uuid.NewString())
	return t.base.RoundTrip(r)
}

// A loop with a stable key that waits after 409.
func stableAfter409(customer, period string) {
	key := "charge-" + customer + "-" + period
	for range 4 {
		p := params(customer)
		p.IdempotencyKey = stripe.String(key)
		if _, err := charges.New(p); err == nil {
			return
		}
		time.Sleep(time.Second)
	}
}
