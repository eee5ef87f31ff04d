package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A claim whose key's window has passed is settled by Stripe's search.
// Whatever answers at Config.StripeURL with something that is not a
// search result (an empty object, a plain list: a gateway or mock that
// answers 200 to everything) has not said that Stripe holds no payment for
// the key. Taking it for an empty result reopens the key's window, and
// once the URL is fixed the key goes to Stripe again after Stripe has
// forgotten it: a second charge.
func TestSearchAnswerThatIsNotASearchResultNeverReopensTheKey(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"object":"list","data":[],"has_more":false,"url":"/v1/charges"}`} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			ctx := context.Background()
			const c = "cus_paid"
			key := e.crashedClaim(c, amount)
			e.chargeDirect(c, key, amount) // Stripe charged; the runner died before recording it
			e.ageClaim(key, 25*time.Hour)
			e.srv.Advance(25 * time.Hour) // Stripe has forgotten the key

			web, _ := countingServer(t, 200, "application/json", body)
			bad := e.biller(func(cfg *billing.Config) { cfg.StripeURL = web.URL })
			sum, err := bad.Run(ctx, period, billing.Customers(c), nil)
			t.Logf("Run at the wrong URL: %+v, %v", sum.Progress, err)
			if err == nil {
				t.Errorf("Run at a URL that answers %s to everything succeeded", body)
			}

			sum, err = e.biller().Run(ctx, period, billing.Customers(c), nil)
			t.Logf("Run after the fix: %+v, %v", sum.Progress, err)
			if n := e.count(c); n != 1 {
				t.Fatalf("%s charged %d times at Stripe; want 1 (the payment made before the window closed)", c, n)
			}
			if got := e.claimOf(c); got.State != "succeeded" {
				t.Fatalf("claim %+v; want succeeded with the payment search finds", got)
			}
		})
	}
}

// A search hit without a status (here with an id, but no status) is not a
// payment, just as such an answer to a charge is not: it must never settle
// a claim as billed. Otherwise a customer Stripe never charged is reported
// billed, and no later run bills them.
func TestSearchHitWithoutStatusIsNotACharge(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	const c = "cus_unpaid"
	key := e.crashedClaim(c, amount) // claimed, never sent
	e.ageClaim(key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)

	web, _ := countingServer(t, 200, "application/json", `{"object":"search_result","data":[{"id":"pi_not_a_payment","payment_intent":"pi_not_a_payment"}],"has_more":false}`)
	bad := e.biller(func(cfg *billing.Config) { cfg.StripeURL = web.URL })
	sum, err := bad.Run(ctx, period, billing.Customers(c), nil)
	t.Logf("Run at the wrong URL: %+v, %v", sum.Progress, err)
	if err == nil {
		t.Errorf("Run at a URL that answers no payment status succeeded: %+v", sum.Progress)
	}
	if got := e.claimOf(c); got.State != "pending" {
		t.Errorf("claim %s as %q after a search hit without status; want pending", got.State, got.StripeID)
	}

	sum, err = e.biller().Run(ctx, period, billing.Customers(c), nil)
	t.Logf("Run after the fix: %+v, %v", sum.Progress, err)
	if n := e.count(c); n != 1 {
		t.Fatalf("%s charged %d times at Stripe; want 1 (claim now %+v)", c, n, e.claimOf(c))
	}
}
