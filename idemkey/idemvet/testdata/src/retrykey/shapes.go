package retrykey

import (
	"context"
	"fmt"
	"math/rand"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bwmarrin/snowflake"
	"github.com/go-resty/resty/v2"
	"github.com/google/uuid"
	"github.com/oklog/ulid/v2"
	"github.com/rs/xid"
	"github.com/segmentio/ksuid"
	stripe "github.com/stripe/stripe-go/v79"
	"golang.org/x/sync/errgroup"
	"k8s.io/apimachinery/pkg/util/wait"
)

// Retry loops of other shapes, keys from other sources, keys set in other
// ways. Every case here makes a new key per attempt.

// ---- reported ----

func breakOnSuccess(customer string, n int) error {
	var err error
	for attempt := 0; attempt < n; attempt++ {
		p := params(customer)
		p.IdempotencyKey = stripe.String(customer + "-" + strconv.Itoa(attempt)) // want `the loop at line [0-9]+ repeats the request after an error, and it includes the counter attempt`
		_, err = charges.New(p)
		if err == nil {
			break
		}
	}
	return err
}

func sleepContinue(customer string) error {
	for {
		p := params(customer)
		p.IdempotencyKey = stripe.String(time.Now().Format(time.RFC3339Nano)) // want `the loop at line [0-9]+ repeats the request after an error, and it is made by time.Now\(\) inside it`
		_, err := charges.New(p)
		if err != nil {
			time.Sleep(time.Second)
			continue
		}
		return nil
	}
}

func labelled(customer string) error {
	var err error
attempts:
	for i := 0; i < 5; i++ {
		p := params(customer)
		p.SetIdempotencyKey(fmt.Sprintf("%d", time.Now().Unix())) // want `repeats the request after an error, and it is made by time.Now\(\) inside it`
		_, err = charges.New(p)
		switch {
		case err == nil:
			break attempts
		default:
			time.Sleep(time.Second)
		}
	}
	return err
}

func labelledContinue(customer string) error {
outer:
	for {
		p := params(customer)
		p.IdempotencyKey = stripe.String(uuid.NewString()) // want `repeats the request after an error, and it is made by uuid.NewString\(\) inside it`
		if _, err := charges.New(p); err != nil {
			select {
			case <-time.After(time.Second):
				continue outer
			}
		}
		return nil
	}
}

// Retried by calling itself.
func recursive(customer string, left int) error {
	p := params(customer)
	p.IdempotencyKey = stripe.String(ksuid.New().String()) // want `recursive calls itself again after an error, and it is made by ksuid.New\(\) inside it`
	_, err := charges.New(p)
	if err != nil && left > 0 {
		return recursive(customer, left-1)
	}
	return err
}

func recursiveAttempt(customer string, attempt int) error {
	p := params(customer)
	p.IdempotencyKey = stripe.String(customer + "/" + strconv.Itoa(attempt)) // want `recursiveAttempt calls itself again after an error, and it includes the attempt number attempt`
	if _, err := charges.New(p); err != nil {
		if attempt < 3 {
			return recursiveAttempt(customer, attempt+1)
		}
		return err
	}
	return nil
}

// An errgroup per attempt.
func errgroupPerAttempt(ctx context.Context, customer string) error {
	for attempt := 0; attempt < 3; attempt++ {
		g, ctx := errgroup.WithContext(ctx)
		g.Go(func() error {
			p := params(customer)
			p.Context = ctx
			p.IdempotencyKey = stripe.String(xid.New().String()) // want `the loop at line [0-9]+ repeats the request after an error, and it is made by xid.New\(\) inside it`
			_, err := charges.New(p)
			return err
		})
		if g.Wait() == nil {
			return nil
		}
	}
	return fmt.Errorf("charging %s: gave up", customer)
}

// Sources: ulid with per-call entropy, a generator's method, rand, an
// atomic counter.
var seq atomic.Int64
var hits int64
var node, _ = snowflake.NewNode(1)

func sources(customer string) {
	for range 3 {
		p := params(customer)
		entropy := rand.New(rand.NewSource(time.Now().UnixNano()))
		p.IdempotencyKey = stripe.String(ulid.MustNew(ulid.Timestamp(time.Now()), entropy).String()) // want `it is made by ulid.MustNew\(\) inside it`
		if _, err := charges.New(p); err == nil {
			return
		}
		p.IdempotencyKey = stripe.String(node.Generate().String()) // want `it is made by Node.Generate\(\) inside it`
		if _, err := charges.New(p); err == nil {
			return
		}
		p.IdempotencyKey = stripe.String(strconv.FormatInt(rand.Int63(), 36)) // want `it is made by rand.Int63\(\) inside it`
		if _, err := charges.New(p); err == nil {
			return
		}
		p.IdempotencyKey = stripe.String(fmt.Sprint(customer, seq.Add(1))) // want `it includes the atomic counter seq.Add\(1\), which changes on every pass`
		if _, err := charges.New(p); err == nil {
			return
		}
		p.IdempotencyKey = stripe.String(fmt.Sprint(customer, atomic.AddInt64(&hits, 1))) // want `it includes the atomic counter atomic.AddInt64\(&hits, 1\), which changes on every pass`
		if _, err := charges.New(p); err == nil {
			return
		}
	}
}

// Headers set in other ways.
func headers(ctx context.Context, body string) error {
	for attempt := 0; attempt < 3; attempt++ {
		req, _ := http.NewRequestWithContext(ctx, "POST", "https://api.stripe.com/v1/charges", nil)
		req.Header = http.Header{"Idempotency-Key": {uuid.NewString()}} // want `the loop at line [0-9]+ repeats the request after an error, and it is made by uuid.NewString\(\) inside it`
		resp, err := http.DefaultClient.Do(req)
		if err != nil || resp.StatusCode >= 500 {
			continue
		}
		return nil
	}
	return nil
}

func restyHeader(c *resty.Client, body string) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		_, err = c.R().SetHeader("Idempotency-Key", uuid.NewString()).SetBody(body).Post("/v1/charges") // want `it is made by uuid.NewString\(\) inside it`
		if err == nil {
			return nil
		}
	}
	return err
}

func restyHeaders(c *resty.Client, body string) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		_, err = c.R().SetHeaders(map[string]string{"Idempotency-Key": uuid.NewString()}).SetBody(body).Post("/v1/charges") // want `it is made by uuid.NewString\(\) inside it`
		if err == nil {
			return nil
		}
	}
	return err
}

// A loop over a ticker's channel that stops on success.
func ticker(customer string, tick <-chan time.Time) error {
	n := 0
	for range tick {
		n++
		p := params(customer)
		p.IdempotencyKey = stripe.String(fmt.Sprint(customer, "-", n)) // want `the loop at line [0-9]+ repeats the request after an error, and it includes the counter n`
		if _, err := charges.New(p); err == nil {
			return nil
		}
	}
	return nil
}

// Kubernetes' wait.ExponentialBackoff calls its condition once per attempt.
func k8sWait(customer string) error {
	return wait.ExponentialBackoff(wait.Backoff{Steps: 5}, func() (bool, error) {
		p := params(customer)
		p.IdempotencyKey = stripe.String(uuid.NewString()) // want `runs once per attempt of wait.ExponentialBackoff, and it is made by uuid.NewString\(\)`
		_, err := charges.New(p)
		return err == nil, nil
	})
}

// ---- not reported ----

// A loop over customers by index, bounded by a count rather than len(),
// skipping a customer on error: a walk, not a retry.
func walkByIndex(customers []string, n int, period string) {
	for i := 0; i < n; i++ {
		c := customers[i]
		p := params(c)
		p.IdempotencyKey = stripe.String("charge-" + c + "-" + period)
		if _, err := charges.New(p); err != nil {
			continue
		}
	}
}

// A recursion over a list is a walk, not a retry.
func chargeRest(customers []string, period string) error {
	if len(customers) == 0 {
		return nil
	}
	p := params(customers[0])
	p.IdempotencyKey = stripe.String("charge-" + customers[0] + "-" + period)
	if _, err := charges.New(p); err != nil {
		return err
	}
	return chargeRest(customers[1:], period)
}

// A recursive retry that passes its key down.
func recursiveStable(customer, key string, left int) error {
	p := params(customer)
	p.IdempotencyKey = stripe.String(key)
	_, err := charges.New(p)
	if err != nil && left > 0 {
		return recursiveStable(customer, key, left-1)
	}
	return err
}

// The same key on every attempt, set through resty.
func restyStable(c *resty.Client, customer, period string) error {
	key := "charge-" + customer + "-" + period
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		_, err = c.R().SetHeader("Idempotency-Key", key).Post("/v1/charges")
		if err == nil {
			return nil
		}
	}
	return err
}

// An errgroup charging several customers at once, each under its own key.
func errgroupPerCustomer(ctx context.Context, customers []string, period string) error {
	var g errgroup.Group
	for _, c := range customers {
		g.Go(func() error {
			p := params(c)
			p.IdempotencyKey = stripe.String("charge-" + c + "-" + period)
			_, err := charges.New(p)
			return err
		})
	}
	return g.Wait()
}

// A key store that returns the key saved for this charge, or saves and
// returns the new one it is given: the same key on every attempt.
type keyStore interface {
	Reserve(customer, fresh string) (string, error)
}

func storedKey(ks keyStore, customer string) error {
	for attempt := 0; attempt < 3; attempt++ {
		key, err := ks.Reserve(customer, uuid.NewString())
		if err != nil {
			return err
		}
		p := params(customer)
		p.IdempotencyKey = stripe.String(key)
		if _, err := charges.New(p); err == nil {
			return nil
		}
	}
	return nil
}

// Operations numbered by a shared counter, the customer and the key alike:
// the same numbering on every run.
func numbered(customers []string) {
	for range 3 {
		i := seq.Add(1)
		p := params(customers[i])
		p.IdempotencyKey = stripe.String(fmt.Sprint("k", i))
		charges.New(p)
	}
}

// A loop over a channel of customers, skipping one on error: a walk.
func fromQueue(queue <-chan string, period string) {
	for c := range queue {
		p := params(c)
		p.IdempotencyKey = stripe.String("charge-" + c + "-" + period)
		if _, err := charges.New(p); err != nil {
			continue
		}
	}
}

// Known limit: the request changes with the attempt counter too, so the
// loop is taken for a walk and the counter in the key is not reported.
func attemptInRequest(customer string) error {
	var err error
	for attempt := 0; attempt < 3; attempt++ {
		p := params(customer)
		p.Description = stripe.String("attempt " + strconv.Itoa(attempt))
		p.IdempotencyKey = stripe.String(customer + "-" + strconv.Itoa(attempt))
		if _, err = charges.New(p); err == nil {
			return nil
		}
	}
	return err
}
