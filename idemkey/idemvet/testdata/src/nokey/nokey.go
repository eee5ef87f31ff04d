package nokey

import (
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/customer"
	"github.com/stripe/stripe-go/v79/paymentintent"
	"github.com/stripe/stripe-go/v79/testhelpers/testclock"

	stripe72 "github.com/stripe/stripe-go/v72"
	"github.com/stripe/stripe-go/v72/sub"
)

var charges charge.Client

// ---- reported ----

func literal(customer string) error {
	_, err := charges.New(&stripe.ChargeParams{Customer: stripe.String(customer)}) // want `charges.New sends a Stripe write without an idempotency key: stripe-go then makes a random key for this call only, so any retry around it .* makes a second charge object`
	return err
}

func variable(customer string) error {
	p := &stripe.PaymentIntentParams{Customer: stripe.String(customer)}
	p.Amount = stripe.Int64(100)
	p.AddMetadata("customer", customer)
	_, err := paymentintent.New(p) // want `paymentintent.New sends a Stripe write without an idempotency key`
	return err
}

func confirm(id string) error {
	_, err := paymentintent.Confirm(id, &stripe.PaymentIntentConfirmParams{}) // want `paymentintent.Confirm sends a Stripe write without an idempotency key`
	return err
}

func capture(id string) error {
	_, err := charges.Capture(id, nil) // want `charges.Capture sends a Stripe write without an idempotency key`
	return err
}

func packageLevel(customer string) error {
	_, err := charge.New(&stripe.ChargeParams{Customer: stripe.String(customer)}) // want `charge.New sends a Stripe write`
	return err
}

// A use after the write cannot give that write a key.
func usedAfter(customer string, show func(any)) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	_, err := charge.New(p) // want `charge.New sends a Stripe write`
	show(p)
	q := p
	_ = q
	return err
}

// Params built without a key by another function.
func fromBuilder(customer string) error {
	_, err := charges.New(build(customer)) // want `charges.New sends a Stripe write`
	return err
}

func fromBuilderVar(customer string) error {
	p := build(customer)
	p.Description = stripe.String("monthly")
	_, err := charges.New(p) // want `charges.New sends a Stripe write`
	return err
}

func build(customer string) *stripe.ChargeParams {
	return &stripe.ChargeParams{Customer: stripe.String(customer)}
}

func buildChecked(customer string) (*stripe.ChargeParams, error) {
	if customer == "" {
		return nil, errEmpty
	}
	p := build(customer)
	p.Amount = stripe.Int64(100)
	return p, nil
}

var errEmpty error

func fromTwoLevels(customer string) error {
	p, err := buildChecked(customer)
	if err != nil {
		return err
	}
	_, err = charges.New(p) // want `charges.New sends a Stripe write`
	return err
}

// stripe-go before v74 names the subscription package sub.
func oldSubscription(customer string) error {
	_, err := sub.New(&stripe72.SubscriptionParams{Customer: stripe72.String(customer)}) // want `sub.New sends a Stripe write without an idempotency key: .* makes a second subscription object`
	return err
}

// ---- not reported ----

func builderThenKey(customer, period string) error {
	p := build(customer)
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	_, err := charges.New(p)
	return err
}

// One path of the builder sets a key.
func buildMaybeKeyed(customer, key string) *stripe.ChargeParams {
	if key != "" {
		return &stripe.ChargeParams{Params: stripe.Params{IdempotencyKey: stripe.String(key)}}
	}
	return build(customer)
}

func fromMaybeKeyed(customer, key string) error {
	_, err := charges.New(buildMaybeKeyed(customer, key))
	return err
}

// The builder hands out a value it keeps: someone else may have keyed it.
var cached = map[string]*stripe.ChargeParams{}

func buildCached(customer string) *stripe.ChargeParams {
	p := cached[customer]
	return p
}

func fromCache(customer string) error {
	_, err := charges.New(buildCached(customer))
	return err
}

func withKey(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.IdempotencyKey = stripe.String("charge:" + customer + ":" + period)
	_, err := charges.New(p)
	return err
}

func withSetter(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.SetIdempotencyKey("charge:" + customer + ":" + period)
	_, err := charges.New(p)
	return err
}

func withEmbedded(customer, period string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	p.Params.IdempotencyKey = stripe.String("charge:" + customer + ":" + period)
	_, err := charges.New(p)
	return err
}

func inLiteral(customer, period string) error {
	_, err := charges.New(&stripe.ChargeParams{
		Params:   stripe.Params{IdempotencyKey: stripe.String("charge:" + customer + ":" + period)},
		Customer: stripe.String(customer),
	})
	return err
}

// The params come from the caller, or go through code that may set a key.
func fromCaller(p *stripe.ChargeParams) error {
	_, err := charges.New(p)
	return err
}

func setKey(p *stripe.ChargeParams) {}

func handedOver(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	setKey(p)
	_, err := charges.New(p)
	return err
}

// In a loop, code after the write runs before the next one.
func handedOverInLoop(customers []string) error {
	p := &stripe.ChargeParams{}
	for _, c := range customers {
		p.Customer = stripe.String(c)
		if _, err := charges.New(p); err != nil {
			return err
		}
		setKey(p)
	}
	return nil
}

// A jump back may run code after the write before it.
func handedOverByGoto(customer string) error {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	n := 0
again:
	_, err := charges.New(p)
	if err != nil && n == 0 {
		setKey(p)
		n++
		goto again
	}
	return err
}

// Reads and updates: a repeated read changes nothing and a repeated update
// sets the same values again.
func reads(id string) {
	charges.Get(id, nil)
	paymentintent.Get(id, nil)
	charges.Update(id, &stripe.ChargeParams{})
}

// Resources whose duplicate bills nothing: reported only with -allwrites.
func noMoney(email string) {
	customer.New(&customer.CustomerParams{Email: stripe.String(email)})
	testclock.New(&testclock.TestClockParams{})
}
