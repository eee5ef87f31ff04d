package main

import (
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// resolve is for payments: a pending refund's, transfer's or payout's
// claim is refused before anything is read from Stripe, with what to do
// (reconcile finds it by listing), and nothing is recorded or moved.
func TestResolveRefusesARefundTransferOrPayoutClaimBeforeReadingStripe(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	e.fake.SetBalance(acct, "usd", 100_000)
	e.fake.SetBalance("", "usd", 100_000)
	e.billonce("cus_a,1000,usd\n", "run", "-period", period).want(t, exitOK)
	ch := e.getClaim(e.keyOf("cus_a", period, 1)).StripeID
	e.billonce("", "refund", "-customer", "cus_a", "-period", period, "-id", "rma-1", "-amount", "300", "-yes").want(t, exitOK)
	for _, what := range []string{"transfer", "payout"} {
		e.billonce("", what, "-account", acct, "-period", period, "-amount", "500", "-currency", "usd", "-yes").want(t, exitOK)
	}
	// Their answers were lost and Stripe's search failed, a day ago.
	e.exec(`UPDATE billonce_claims SET state = 'pending', stripe_id = '', lease_until = now(), first_sent_at = now() - interval '30 hours',
		last_error = 'reconciliation: Stripe search failed: boom' WHERE period <> $1`, period)
	e.fake.Advance(30 * 3600e9)
	rows, err := e.pool.Query(t.Context(), `SELECT key, endpoint FROM billonce_claims WHERE period <> $1`, period)
	if err != nil {
		t.Fatal(err)
	}
	claims := map[string]string{}
	for rows.Next() {
		var k, ep string
		if err := rows.Scan(&k, &ep); err != nil {
			t.Fatal(err)
		}
		claims[k] = ep
	}
	rows.Close()
	if len(claims) != 3 {
		t.Fatalf("%d money-out claims, want a refund's, a transfer's and a payout's", len(claims))
	}
	for key, endpoint := range claims {
		for _, p := range []string{"none", ch} {
			before := len(e.fake.Log())
			r := e.billonce("", "resolve", "-key", key, "-payment", p).want(t, exitUsage)
			if !strings.Contains(r.stderr, "billonce reconcile") {
				t.Errorf("resolve of the %s claim with %s: %q; want it to say to run billonce reconcile", endpoint, p, r.stderr)
			}
			if n := len(e.fake.Log()) - before; n != 0 {
				t.Errorf("resolve of the %s claim with %s sent %d requests to Stripe; want none", endpoint, p, n)
			}
			if c := e.getClaim(key); c.State != "pending" {
				t.Errorf("the %s claim is %s after resolve; want it pending, untouched", endpoint, c.State)
			}
		}
	}
	for what, want := range map[string]int{"refund": 1, "transfer": 1, "payout": 1} {
		if n := len(e.fake.Movements(what)); n != want {
			t.Errorf("%d %ss at Stripe, want %d", n, what, want)
		}
	}
}
