package riverbilling_test

import (
	"testing"

	"github.com/riverqueue/river/rivertype"

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
