package freshkey

import (
	"fmt"
	"time"

	"github.com/google/uuid"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

var charges charge.Client

// ---- reported ----

func inline(customer string) error {
	_, err := charges.New(&stripe.ChargeParams{
		Params:   stripe.Params{IdempotencyKey: stripe.String(uuid.NewString())}, // want `idempotency key made by uuid.NewString\(\) for this one request: a retry of the code around it, a restart or the next run makes another key`
		Customer: stripe.String(customer),
	})
	return err
}

func viaVar(customer string) error {
	key := fmt.Sprintf("%s-%d", customer, time.Now().Unix())
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.SetIdempotencyKey(key) // want `idempotency key made by time.Now\(\) for this one request`
	_, err := charges.New(p)
	return err
}

// newKey returns a new value on every call: its callers' keys are fresh.
func newKey() string { return "k_" + uuid.NewString() }

func viaHelper(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String(newKey()) // want `idempotency key made by freshkey.newKey\(\) \(which returns uuid.NewString\(\)\) for this one request`
	_, err := charges.New(p)
	return err
}

// A walk over customers by index (not a retry loop) with a random key.
func walkRandom(customers []string, n int) {
	for i := 0; i < n; i++ {
		p := &stripe.ChargeParams{Customer: stripe.String(customers[i])}
		p.IdempotencyKey = stripe.String(uuid.NewString()) // want `idempotency key made by uuid.NewString\(\) for this one request`
		if _, err := charges.New(p); err != nil {
			continue
		}
	}
}

// ---- not reported ----

// Made once and reused by every pass of a loop that resends it.
func reusedInLoop(customer string) {
	key := uuid.NewString()
	for i := 0; i < 3; i++ {
		p := &stripe.ChargeParams{Customer: stripe.String(customer)}
		p.IdempotencyKey = stripe.String(key)
		charges.New(p)
	}
}

// Made once and captured by a function that is called more than once.
func reusedInClosure(customer string) func() error {
	key := uuid.NewString()
	return func() error {
		p := &stripe.ChargeParams{Customer: stripe.String(customer)}
		p.IdempotencyKey = stripe.String(key)
		_, err := charges.New(p)
		return err
	}
}

// A key from the operation's identity.
func identity(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String("charge:" + customer + ":" + period)
	_, err := charges.New(p)
	return err
}

// A fresh value elsewhere in the params is not a key.
func freshMetadata(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String("charge:" + customer + ":" + period)
	p.Metadata = map[string]string{"sent_at": time.Now().String(), "trace": uuid.NewString()}
	_, err := charges.New(p)
	return err
}
