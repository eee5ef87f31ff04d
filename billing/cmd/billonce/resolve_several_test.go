package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// postCharge makes a charge at the fake for customer carrying key in its
// metadata, as a resend of the key after its window would.
func (e *env) postCharge(customer, key, idem string) {
	e.t.Helper()
	form := url.Values{"amount": {"300"}, "currency": {"usd"}, "customer": {customer},
		"metadata[" + billing.MetaKey + "]": {key}, "metadata[" + billing.MetaCustomer + "]": {customer},
		"metadata[" + billing.MetaPeriod + "]": {period}}
	req, _ := http.NewRequest(http.MethodPost, e.fake.URL+"/v1/charges", strings.NewReader(form.Encode()))
	req.Header.Set("Authorization", "Bearer "+e.key)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", idem)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.t.Fatal(err)
	}
	resp.Body.Close()
}

// When several payments carry a claim's key (the case resolve exists
// for), resolving the claim with the declined one while another
// succeeded records a decline for a customer who paid: a re-bill then
// charges them again.
func TestResolveRefusesADeclineWhenAnotherPaymentOfTheKeySucceeded(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.pendingClaim("cus_p", 300, "cus_a")
	e.exec(`UPDATE billonce_claims SET first_sent_at = now() - interval '25 hours', created_at = now() - interval '25 hours',
		last_error = 'reconciliation: Stripe search found several payments' WHERE key = $1`, key)
	e.fake.Decline("cus_p", "insufficient_funds")
	e.postCharge("cus_p", key, "first-send")
	e.fake.Honor("cus_p")
	e.postCharge("cus_p", key, "resend-after-window")
	var declined string
	for _, p := range e.fake.Payments() {
		if p.Customer == "cus_p" && !p.Paid {
			declined = p.ID
		}
	}
	if declined == "" || e.fake.CountPeriod("cus_p", period) != 1 {
		t.Fatalf("setup: declined %q, paid %d", declined, e.fake.CountPeriod("cus_p", period))
	}

	r := e.billonce("", "resolve", "-key", key, "-payment", declined)
	if c := e.getClaim(key); c.State == claim.StateFailed {
		e.billonce("", "rebill", "-customer", "cus_p", "-period", period, "-attempt", "2", "-yes")
		t.Fatalf("resolve recorded %s as the claim's decline while another payment of the key succeeded (exit %d: %s); after a re-bill cus_p has paid %d times",
			declined, r.code, strings.TrimSpace(r.stdout+r.stderr), e.fake.CountPeriod("cus_p", period))
	}
}

// "none" reopens the key for a resend after its window, which Stripe
// takes as a new charge: it is refused while Stripe's search shows a
// payment carrying the key.
func TestResolveNoneRefusedWhileAPaymentCarriesTheKey(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.pendingClaim("cus_p", 300, "cus_a")
	e.exec(`UPDATE billonce_claims SET first_sent_at = now() - interval '25 hours', created_at = now() - interval '25 hours',
		last_error = 'reconciliation: Stripe search failed: boom' WHERE key = $1`, key)
	e.postCharge("cus_p", key, "first-send")

	r := e.billonce("", "resolve", "-key", key, "-payment", "none")
	e.billed("cus_a,100,usd\ncus_p,300,usd\n")
	if n := e.fake.CountPeriod("cus_p", period); n != 1 {
		t.Fatalf("cus_p paid %d times after resolve none (exit %d: %s) and a run", n, r.code, strings.TrimSpace(r.stdout+r.stderr))
	}
}
