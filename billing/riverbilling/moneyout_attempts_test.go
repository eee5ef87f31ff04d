package riverbilling_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/riverqueue/river"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// A payout job for attempt 2 run while attempt 1 is in transit does not
// stand for a payout it did not make: it waits for attempt 1's outcome.
// If the bank returns attempt 1, the waiting job pays the account out
// once; if attempt 1 is paid, it completes without paying again. (A job
// that completed at once would be held by River's uniqueness against
// attempt 2 queued again, and attempt 3 needs attempt 2 failed: the
// account could not be paid through River until the row was cleaned.)
func TestPayoutJobOfTheNextAttemptWaitsForTheAttemptInTransit(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		first     string // attempt 1's outcome at the bank
		wantPaid  int    // payouts not failed at the end
		wantTotal int
	}{
		{"returned by the bank", "failed", 1, 2},
		{"paid", "paid", 1, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, billingtest.Config{})
			acct := e.srv.CreateAccount()
			e.srv.SetBalance(acct, "usd", 100_000)
			c := e.client(e.riverConfig(e.biller(), nil))
			first := riverbilling.MoneyOutArgs{Period: period, Payout: true, Account: acct, Amount: 5000, Currency: "usd"}
			if res := work(e, e.moneyOutWorker(e.biller()), e.insertMoneyOut(c, first)); res.EventKind != river.EventKindJobCompleted {
				t.Fatalf("attempt 1: %s %v; want completed, in transit", res.EventKind, res.Job.Errors)
			}
			second := first
			second.Attempt = 2
			res := work(e, e.moneyOutWorker(e.biller()), e.insertMoneyOut(c, second))
			if res.EventKind != river.EventKindJobSnoozed {
				t.Fatalf("attempt 2 while attempt 1 is in transit: %s %v; want snoozed until it settles", res.EventKind, res.Job.Errors)
			}
			ms := e.srv.Movements("payout")
			if len(ms) != 1 {
				t.Fatalf("%d payouts while attempt 1 is in transit, want 1", len(ms))
			}
			code := ""
			if tc.first == "failed" {
				code = "account_closed"
			}
			if err := e.srv.Settle(ms[0].ID, tc.first, code); err != nil {
				t.Fatal(err)
			}
			e.advance(time.Hour)
			if _, err := e.biller().Reconcile(context.Background(), nil); err != nil && tc.first != "failed" {
				t.Fatal(err)
			}
			if res = work(e, e.moneyOutWorker(e.biller()), res.Job); res.EventKind != river.EventKindJobCompleted {
				t.Fatalf("attempt 2 after attempt 1 %s: %s %v; want completed", tc.first, res.EventKind, res.Job.Errors)
			}
			if dup, err := c.Insert(context.Background(), second, nil); err != nil || !dup.UniqueSkippedAsDuplicate {
				t.Errorf("attempt 2 inserted again = %+v, %v; want a duplicate", dup, err)
			}
			paid, all := 0, e.srv.Movements("payout")
			for _, m := range all {
				if m.Status != "failed" && m.Status != "canceled" {
					paid++
				}
			}
			if paid != tc.wantPaid || len(all) != tc.wantTotal {
				t.Errorf("Stripe holds %d payouts, %d not failed; want %d, %d not failed", len(all), paid, tc.wantTotal, tc.wantPaid)
			}
		})
	}
}

// A payout job for attempt 2 run while attempt 1 is pending with an
// unknown outcome waits for it, as a re-bill job does, instead of being
// cancelled (a cancelled job is held by River's uniqueness against the
// same job queued again): once attempt 1 is refused, the waiting job pays
// the account out once.
func TestPayoutJobOfTheNextAttemptWaitsWhileTheFirstIsPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.srv.CreateAccount()
	e.srv.SetBalance(acct, "usd", 100_000)
	c := e.client(e.riverConfig(e.biller(), nil))
	first := riverbilling.MoneyOutArgs{Period: period, Payout: true, Account: acct, Amount: 5000, Currency: "usd"}
	// Attempt 1's answer is a 500 before Stripe stored anything, and the
	// listing after it fails: its outcome is unknown, its job retried.
	e.srv.FailNext(billingtest.Match{Method: http.MethodPost, Path: "/v1/payouts"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	e.srv.FailNext(billingtest.Match{Method: http.MethodGet, Path: "/v1/payouts"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	res1 := work(e, e.moneyOutWorker(e.biller(oneAttempt)), e.insertMoneyOut(c, first))
	if res1.EventKind != river.EventKindJobFailed {
		t.Fatalf("attempt 1: %s %v; want failed, to be retried", res1.EventKind, res1.Job.Errors)
	}
	second := first
	second.Attempt = 2
	res2 := work(e, e.moneyOutWorker(e.biller()), e.insertMoneyOut(c, second))
	if res2.EventKind != river.EventKindJobSnoozed {
		t.Fatalf("attempt 2 while attempt 1 is pending: %s %s; want snoozed until it settles", res2.EventKind, lastErr(res2.Job))
	}
	// Attempt 1's retry meets a balance short of it: refused, failed.
	e.srv.SetBalance(acct, "usd", 100)
	if res1 = work(e, e.moneyOutWorker(e.biller()), res1.Job); res1.EventKind != river.EventKindJobCancelled {
		t.Fatalf("attempt 1 retried: %s %s; want cancelled, refused", res1.EventKind, lastErr(res1.Job))
	}
	e.srv.SetBalance(acct, "usd", 100_000)
	if res2 = work(e, e.moneyOutWorker(e.biller()), res2.Job); res2.EventKind != river.EventKindJobCompleted {
		t.Fatalf("attempt 2 after attempt 1 was refused: %s %s; want completed", res2.EventKind, lastErr(res2.Job))
	}
	paid := 0
	for _, m := range e.srv.Movements("payout") {
		if m.Status != "failed" && m.Status != "canceled" {
			paid++
			if m.Amount != first.Amount {
				t.Errorf("payout %s of %d, want %d", m.ID, m.Amount, first.Amount)
			}
		}
	}
	if paid != 1 {
		t.Errorf("%d payouts made, want 1: attempt 2's", paid)
	}
}
