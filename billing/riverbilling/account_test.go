package riverbilling_test

import (
	"context"

	"testing"

	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// Jobs with an Account bill on that connected account, a job of one
// customer and a job of several alike, each customer once.
func TestJobsOnAConnectedAccountBillThere(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.srv.CreateAccount()
	b := e.biller()
	c := e.client(e.riverConfig(b, nil))
	e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period, Account: acct})
	e.insert(c, riverbilling.ChargeArgs{Customers: []string{"cus_2", "cus_3"}, Period: period, Account: acct})
	e.insert(c, riverbilling.ChargeArgs{Customer: "cus_4", Period: period, Account: acct, Invoice: true})
	e.start(c)
	st := e.waitFinished(3)
	for _, cus := range []string{"cus_1", "cus_2", "cus_3"} {
		var on int
		for _, p := range e.srv.Payments() {
			if p.Customer == cus && p.Account == acct && p.Paid {
				on++
			}
		}
		if on != 1 || e.count(cus) != 1 {
			t.Errorf("%s: %d payments on %s, %d in all; want 1", cus, on, acct, e.count(cus))
		}
	}
	if st.Jobs[rivertype.JobStateCancelled] != 1 || e.count("cus_4") != 0 {
		t.Errorf("state %v, cus_4 billed %d; want the invoice job on an account cancelled, nothing billed", st, e.count("cus_4"))
	}
}

// A fan-out of items on connected accounts makes jobs that bill each
// customer on its item's account, never on the platform's: a job of
// several customers holds one account's, and the same customer on two
// accounts is two customers. An invoice item on an account is refused,
// as an invoice job on one is.
func TestFanOutBillsEachItemOnItsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	a, b := e.srv.CreateAccount(), e.srv.CreateAccount()
	items := []billing.Item{
		{Customer: "cus_p1"}, {Customer: "cus_a1", Account: a}, {Customer: "cus_a2", Account: a},
		{Customer: "cus_b1", Account: b}, {Customer: "cus_p2"}, {Customer: "cus_a3", Account: a},
		{Customer: "cus_a1", Account: a}, // again: a duplicate
		{Customer: "cus_ai", Account: a, Invoice: &billing.Invoice{}},
	}
	c := e.client(e.riverConfig(e.biller(), nil))
	res, err := riverbilling.FanOut(context.Background(), c, e.pool, period, func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}, 2)
	if err != nil {
		t.Fatal(err)
	}
	if res.Inserted != 6 || res.Duplicates != 1 || res.Invalid != 1 {
		t.Fatalf("fan-out = %+v; want 6 inserted, 1 duplicate, the invoice on an account invalid", res)
	}
	e.start(c)
	e.waitSettled(6)
	want := map[string]string{"cus_p1": "", "cus_p2": "", "cus_a1": a, "cus_a2": a, "cus_a3": a, "cus_b1": b}
	for cus, acct := range want {
		var on, all int
		for _, p := range e.srv.Payments() {
			if p.Customer == cus && p.Paid {
				all++
				if p.Account == acct {
					on++
				}
			}
		}
		if on != 1 || all != 1 {
			t.Errorf("%s: %d payments on account %q, %d in all; want 1", cus, on, acct, all)
		}
	}
}
