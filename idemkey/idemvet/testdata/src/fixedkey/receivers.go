package fixedkey

import (
	"context"
	"time"

	"github.com/google/uuid"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

// Keys carried by a struct: fixed when the struct is a long-lived client
// serving many customers, right when it is built per operation.

// ---- reported ----

// A service built once per process, its key set in its constructor from
// the billing period.
type Service struct {
	charges charge.Client
	key     string
}

func NewService(c charge.Client) *Service {
	return &Service{charges: c, key: "charge-" + time.Now().Format("2006-01")}
}

func (s *Service) Charge(ctx context.Context, customer string, amount int64) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer), Amount: stripe.Int64(amount)}
	p.Context = ctx
	p.IdempotencyKey = stripe.String(s.key) // want `idempotency key s.key is a field of s, set once when it was built, so every call of Charge sends the same key whatever customer it is given`
	_, err := s.charges.New(p)
	return err
}

// A client whose key comes from its configuration.
type Config struct{ IdempotencyKey string }

type Client struct {
	cfg Config
}

func NewClient(cfg Config) *Client { return &Client{cfg: cfg} }

func (c *Client) Charge(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String(c.cfg.IdempotencyKey) // want `idempotency key c.cfg.IdempotencyKey is a field of c, set once when it was built, so every call of Charge sends the same key whatever customer it is given`
	_, err := charges.New(p)
	return err
}

// A biller built per period, its key made from the period it also keeps:
// the customer is a parameter, so one key serves many customers.
type periodBiller struct{ period, key string }

func newPeriodBiller(period string) *periodBiller {
	return &periodBiller{period: period, key: "charge-" + period}
}

func (b *periodBiller) Charge(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String(b.key) // want `idempotency key b.key is a field of b, set once when it was built, so every call of Charge sends the same key whatever customer it is given`
	_, err := charges.New(p)
	return err
}

// ---- not reported ----

// An operation built per customer and period: its key is its own.
type chargeOp struct {
	customer string
	key      string
}

func newChargeOp(customer, period string) *chargeOp {
	return &chargeOp{customer: customer, key: "charge:" + customer + ":" + period}
}

func (o *chargeOp) Do(ctx context.Context, amount int64) error {
	p := &stripe.ChargeParams{Customer: stripe.String(o.customer), Amount: stripe.Int64(amount)}
	p.Context = ctx
	p.IdempotencyKey = stripe.String(o.key)
	_, err := charges.New(p)
	return err
}

// The same, its request built on an assignment.
func (o *chargeOp) Retry(ctx context.Context, amount int64) error {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amount)}
	p.Customer = stripe.String(o.customer)
	p.SetIdempotencyKey(o.key)
	_, err := charges.New(p)
	return err
}

// An operation whose key is made once when it is built (the random key
// travels with the operation through every retry).
type attempt struct {
	customer string
	key      string
}

func newAttempt(customer string) *attempt { return &attempt{customer: customer, key: uuid.NewString()} }

func (a *attempt) send(ctx context.Context, amount int64) error {
	p := &stripe.ChargeParams{Customer: stripe.String(a.customer), Amount: stripe.Int64(amount)}
	p.IdempotencyKey = stripe.String(a.key)
	_, err := charges.New(p)
	return err
}

// Known limit: a long-lived biller keyed by the period it also keeps, its
// request naming no customer (the customer goes in metadata here), is
// taken for a value built per operation.
type metaBiller struct{ period, key string }

func newMetaBiller(period string) *metaBiller {
	return &metaBiller{period: period, key: "charge-" + period}
}

func (b *metaBiller) Charge(customer string, amount int64) error {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amount)}
	p.AddMetadata("customer", customer)
	p.IdempotencyKey = stripe.String(b.key)
	_, err := charges.New(p)
	return err
}
