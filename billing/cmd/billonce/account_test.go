package main

import (
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

// paidOn counts the payments at the fake that moved money for customer
// on account ("" the platform's own).
func (e *env) paidOn(account, customer string) int {
	n := 0
	for _, p := range e.fake.Payments() {
		if p.Account == account && p.Customer == customer && p.Paid {
			n++
		}
	}
	return n
}

// run -account bills every customer of the run on that connected
// account, once: the payments are made there, none on the platform, and
// the same run again makes none.
func TestRunWithAccountBillsEveryCustomerOnThatAccountOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	file := customersFile(t, "cus_a,2500,usd\ncus_b,900,eur\n")
	for range 2 {
		r := e.billonce("", "run", "-period", period, "-customers", file, "-account", acct).want(t, exitOK)
		if !strings.Contains(r.stderr, "for 2026-09 on account "+acct) {
			t.Errorf("progress does not name the account:\n%s", r.stderr)
		}
	}
	for _, c := range []string{"cus_a", "cus_b"} {
		if n := e.paidOn(acct, c); n != 1 {
			t.Errorf("%s paid %d times on %s; want once", c, n, acct)
		}
		if n := e.paidOn("", c); n != 0 {
			t.Errorf("%s paid %d times on the platform; want never", c, n)
		}
		billingtest.RequireChargedOnce(t, e.fake, c, period)
		if got := e.getClaim(e.keyOf(c, period, 1)).Account; got != acct {
			t.Errorf("%s's claim is on account %q; want %s", c, got, acct)
		}
	}
	// The same customers on the platform's own account are refused, not
	// billed again.
	r := e.billonce("", "run", "-period", period, "-customers", file, "-json").want(t, exitIncomplete)
	if s := decode[summaryJSON](t, r.stdout); s.Invalid != 2 || s.Created != 0 {
		t.Errorf("run on the platform after the account's: %+v; want both customers invalid", s)
	}
	if n := e.paidOn("", "cus_a"); n != 0 {
		t.Errorf("cus_a paid %d times on the platform after a run without -account; want never", n)
	}
}

// rebill bills on the account of the customer's latest claim for the
// period, unless -account names another.
func TestRebillBillsOnTheAccountOfTheLatestClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	acct := e.fake.CreateAccount()
	e.billonce("cus_d,700,usd\n", "run", "-period", period, "-account", acct).want(t, exitIncomplete)
	e.fake.Honor("cus_d")
	r := e.billonce("", "rebill", "-customer", "cus_d", "-period", period, "-attempt", "2").want(t, exitUsage)
	if !strings.Contains(r.stdout, "attempt 1: failed, 700 usd on account "+acct) ||
		!strings.Contains(r.stdout, "will charge customer cus_d 700 usd for 2026-09 on account "+acct+" as attempt 2") {
		t.Errorf("rebill plan:\n%s", r.stdout)
	}
	for range 2 {
		e.billonce("", "rebill", "-customer", "cus_d", "-period", period, "-attempt", "2", "-yes").want(t, exitOK)
	}
	if n, m := e.paidOn(acct, "cus_d"), e.paidOn("", "cus_d"); n != 1 || m != 0 {
		t.Errorf("cus_d paid %d times on %s and %d on the platform; want once on the account", n, acct, m)
	}
}

// usage -account reports every row to the meter of that connected
// account: the account's meter counts it once, and no meter event goes
// to the platform, whose meter has the same name.
func TestUsageWithAccountReportsToTheAccountsMeterOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	e.fake.CreateMeter("api_calls", "sum", "")
	// The account's meter, made on the account as Stripe makes it.
	form := url.Values{"display_name": {"api_calls"}, "event_name": {"api_calls"}, "default_aggregation[formula]": {"sum"}}
	req, err := http.NewRequest("POST", e.fake.URL+"/v1/billing/meters", strings.NewReader(form.Encode()))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Stripe-Account", acct)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("creating the account's meter: %s", resp.Status)
	}
	start, end := lastHour()
	file := customersFile(t, usageRow("cus_a", "api_calls", "increments", start, end, 42))
	for range 2 {
		e.billonce("", "usage", "-file", file, "-account", acct).want(t, exitOK)
	}
	// cus_a lives on the account (the fake binds a customer to the
	// account that first names it): its events are counted there.
	if n, got := e.fake.MeterEvents("api_calls", "cus_a"), e.fake.MeterTotal("api_calls", "cus_a", start, end); n != 1 || got != 42 {
		t.Errorf("the account's meter has %d events of cus_a, counting %v; want one of 42", n, got)
	}
	c := e.getClaim(e.keyOf("cus_a", "usage api_calls "+start.Format(time.RFC3339)+" increment", 1))
	if c.Account != acct {
		t.Errorf("the report's claim is on account %q; want %s", c.Account, acct)
	}
	sent := 0
	for _, ev := range e.fake.Log() {
		if strings.Contains(ev.Path, "meter_event") {
			sent++
			if ev.Account != acct {
				t.Errorf("a meter event request went to account %q: %+v", ev.Account, ev)
			}
		}
	}
	if sent != 1 {
		t.Errorf("%d meter event requests; want one, the second run sending nothing", sent)
	}
}

// resolve reads the payment on the claim's account: a charge made on a
// connected account exists only there.
func TestResolveReadsThePaymentOnTheClaimsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	e.billonce("cus_a,100,usd\n", "run", "-period", period, "-account", acct).want(t, exitOK)
	key := e.keyOf("cus_a", period, 1)
	ch := e.getClaim(key).StripeID
	// cus_a was charged but its claim does not know it, and search failed.
	e.exec(`UPDATE billonce_claims SET state = 'pending', stripe_id = '', lease_until = now(),
		last_error = 'reconciliation: Stripe search failed: boom' WHERE key = $1`, key)
	e.billonce("", "resolve", "-key", key, "-payment", ch).want(t, exitOK)
	if c := e.getClaim(key); c.State != "succeeded" || c.StripeID != ch {
		t.Errorf("claim %s %s; want succeeded with %s", c.State, c.StripeID, ch)
	}
	for _, ev := range e.fake.Log() {
		if ev.Method == "GET" && ev.Account != acct {
			t.Errorf("resolve read %s on account %q; want %s", ev.Path, ev.Account, acct)
		}
	}
	if n := e.paidOn(acct, "cus_a"); n != 1 {
		t.Errorf("cus_a paid %d times on %s; want once", n, acct)
	}
}
