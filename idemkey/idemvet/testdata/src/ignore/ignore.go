package ignore

import (
	"github.com/google/uuid"
	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

var charges charge.Client

func silenced(customer string) {
	//idemvet:ignore a test of how the fake treats keyless writes
	charges.New(&stripe.ChargeParams{Customer: stripe.String(customer)})

	charges.New(&stripe.ChargeParams{Customer: stripe.String(customer)}) //idemvet:ignore same, on the line itself
}

// The directive above a statement covers the statement's later lines.
func multiLine(customer string) {
	//idemvet:ignore a one-off charge in a test fixture
	charges.New(&stripe.ChargeParams{
		Customer: stripe.String(customer),
		Params:   stripe.Params{IdempotencyKey: stripe.String(uuid.NewString())},
	})
}

func noReason(customer string) {
	p := &stripe.ChargeParams{Customer: stripe.String(customer)}
	//idemvet:ignore
	p.IdempotencyKey = stripe.String(uuid.NewString()) // want `idempotency key made by uuid.NewString\(\) .* \(the //idemvet:ignore next to it is not honoured without a reason after it\)`
	charges.New(p)
}

func notAbove(customer string) {
	//idemvet:ignore a directive two lines up does not count

	charges.New(&stripe.ChargeParams{Customer: stripe.String(customer)}) // want `charges.New sends a Stripe write without an idempotency key`
}
