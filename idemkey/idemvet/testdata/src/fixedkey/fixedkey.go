package fixedkey

import (
	"context"
	"fmt"

	"github.com/google/uuid"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

var charges charge.Client

// ---- reported ----

// A key made when the biller is built.
type biller struct {
	key    string
	prefix string
}

func newBiller() *biller { return &biller{key: uuid.NewString(), prefix: "charge"} }

func (b *biller) Charge(ctx context.Context, customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.Context = ctx
	p.IdempotencyKey = stripe.String(b.key) // want `idempotency key b.key is a field of b, set once when it was built, so every call of Charge sends the same key whatever customer it is given`
	_, err := charges.New(p)
	return err
}

// A key shared by every customer of a loop.
func loop(customers []string) {
	key := uuid.NewString()
	for _, c := range customers {
		p := &stripe.ChargeParams{Customer: stripe.String(c)}
		p.IdempotencyKey = stripe.String(key) // want `the same idempotency key key is sent for every element of the range loop at line 35 while the rest of the request changes`
		charges.New(p)
	}
}

// A field of a value built before the loop.
func loopField(customers []string) {
	b := newBiller()
	for _, c := range customers {
		p := &stripe.ChargeParams{Customer: stripe.String(c), Params: stripe.Params{IdempotencyKey: stripe.String(b.key)}} // want `the same idempotency key b.key is sent for every element of the range loop`
		charges.New(p)
	}
}

// A key from the period alone: the same for every customer.
func periodOnly(customers []string, period string) {
	key := "charge-" + period
	for _, c := range customers {
		p := &stripe.ChargeParams{Customer: stripe.String(c)}
		p.IdempotencyKey = stripe.String(key) // want `the same idempotency key key is sent for every element`
		charges.New(p)
	}
}

// A package-level key.
var processKey = uuid.NewString()

func pkgVar(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String(processKey) // want `idempotency key processKey is a package variable, set once per process, so every call of pkgVar sends the same key whatever customer it is given`
	_, err := charges.New(p)
	return err
}

// ---- not reported ----

// The receiver's field combined with the customer.
func (b *biller) ChargeWithPrefix(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String(fmt.Sprintf("%s:%s:%s", b.prefix, customer, period))
	_, err := charges.New(p)
	return err
}

// A per-operation value: the receiver carries the customer too.
type job struct{ customer, key string }

func (j *job) run() error {
	p := &stripe.ChargeParams{Customer: stripe.String(j.customer)}
	p.IdempotencyKey = stripe.String(j.key)
	_, err := charges.New(p)
	return err
}

// A key per element of the loop.
func perElement(customers []string, period string) {
	for _, c := range customers {
		p := &stripe.ChargeParams{Customer: stripe.String(c)}
		p.IdempotencyKey = stripe.String("charge-" + c + "-" + period)
		charges.New(p)
	}
}

// The same request resent to each of several backends: one key is right.
func failover(backends []charge.Client, customer, period string) {
	for _, be := range backends {
		p := &stripe.ChargeParams{Customer: stripe.String(customer)}
		p.IdempotencyKey = stripe.String("charge-" + customer + "-" + period)
		if _, err := be.New(p); err == nil {
			return
		}
	}
}

// Jobs carrying their own keys.
func jobs(js []job) {
	for _, j := range js {
		p := &stripe.ChargeParams{Customer: stripe.String(j.customer)}
		p.IdempotencyKey = stripe.String(j.key)
		charges.New(p)
	}
}

// A literal key in a table of cases, each against its own server.
func cases(servers []charge.Client) {
	for _, s := range servers {
		s.New(&stripe.ChargeParams{Customer: stripe.String("cus_1"), Params: stripe.Params{IdempotencyKey: stripe.String("k")}})
	}
}
