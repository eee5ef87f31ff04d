// Package stripe is a stub of stripe-go v72's root package for the
// analyzer's tests: before v74 the subscription packages were named sub,
// subitem and subschedule.
package stripe

type Params struct {
	IdempotencyKey *string
}

type SubscriptionParams struct {
	Params   `form:"*"`
	Customer *string
}

type Subscription struct{ ID string }

func String(s string) *string { return &s }
