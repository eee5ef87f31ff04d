package riverbilling_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// moneyOutWorker returns a money-out worker on b whose retries come back
// at once.
func (e *env) moneyOutWorker(b *billing.Biller) *riverbilling.MoneyOutWorker {
	e.tb.Helper()
	w, err := riverbilling.NewMoneyOutWorker(b, riverbilling.WorkerConfig{RetryInterval: 10 * time.Millisecond, MaxRetryInterval: 50 * time.Millisecond})
	if err != nil {
		e.tb.Fatal(err)
	}
	return w
}

// insertMoneyOut inserts a money-out job without working it.
func (e *env) insertMoneyOut(c *river.Client[pgx.Tx], a riverbilling.MoneyOutArgs) *rivertype.JobRow {
	e.tb.Helper()
	res, err := c.Insert(context.Background(), a, nil)
	if err != nil {
		e.tb.Fatal(err)
	}
	return res.Job
}

// posts counts the POST requests the fake saw on path, answered or not.
func (e *env) posts(path string) int {
	n := 0
	for _, r := range e.srv.Log() {
		if r.Method == http.MethodPost && r.Path == path {
			n++
		}
	}
	return n
}

// paid charges customer for the period and returns the payment's id.
func (e *env) paid(b *billing.Biller, customer string) string {
	e.tb.Helper()
	r, err := b.Charge(context.Background(), customer, period, nil)
	if err != nil || r.Outcome != billing.Created {
		e.tb.Fatalf("charging %s: %+v, %v", customer, r, err)
	}
	return r.StripeID
}

// moneyOutCase is one kind of money-out job, with the world it needs.
type moneyOutCase struct {
	name, object, path string
	args               func(e *env) riverbilling.MoneyOutArgs
}

var moneyOutCases = []moneyOutCase{
	{"refund", "refund", "/v1/refunds", func(e *env) riverbilling.MoneyOutArgs {
		e.paid(e.biller(), "cus_1")
		return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_1", Refund: "rma-1", Amount: 700}
	}},
	{"transfer", "transfer", "/v1/transfers", func(e *env) riverbilling.MoneyOutArgs {
		acct := e.srv.CreateAccount()
		e.srv.SetBalance("", "usd", 100_000)
		return riverbilling.MoneyOutArgs{Period: period, Transfer: true, Account: acct, Amount: 5000, Currency: "usd"}
	}},
	{"payout of a connected account", "payout", "/v1/payouts", func(e *env) riverbilling.MoneyOutArgs {
		acct := e.srv.CreateAccount()
		e.srv.SetBalance(acct, "usd", 100_000)
		return riverbilling.MoneyOutArgs{Period: period, Payout: true, Account: acct, Amount: 5000, Currency: "usd"}
	}},
}

// wantOneMovement wants the fake to hold exactly one movement of c's
// object, of a's amount, on the account a payout is made on.
func (e *env) wantOneMovement(c moneyOutCase, a riverbilling.MoneyOutArgs) {
	e.tb.Helper()
	got := e.srv.Movements(c.object)
	if len(got) != 1 || got[0].Amount != a.Amount {
		e.tb.Fatalf("Stripe holds %ss %+v, want one of %d", c.object, got, a.Amount)
	}
	m := got[0]
	switch {
	case a.Payout && m.Account != a.Account:
		e.tb.Errorf("the payout is on account %q, want %s", m.Account, a.Account)
	case a.Transfer && (m.Destination != a.Account || m.Account != ""):
		e.tb.Errorf("the transfer is on %q to %q, want the platform's to %s", m.Account, m.Destination, a.Account)
	case a.Refund != "" && (m.Customer != a.Customer || m.Metadata["billonce_refund"] != a.Refund):
		e.tb.Errorf("the refund is of %s under id %q, want %s's under %s", m.Customer, m.Metadata["billonce_refund"], a.Customer, a.Refund)
	}
	if a.Payout {
		for _, r := range e.srv.Log() {
			if r.Path == c.path && r.Account != a.Account {
				e.tb.Errorf("a %s %s request went to account %q, want %s", r.Method, r.Path, r.Account, a.Account)
			}
		}
	}
}

// A refund, transfer or payout job whose first run lost Stripe's answer
// (and could not list what it made) fails and is retried; the retry finds
// the movement by listing, a run after completion finds it made, and the
// same job inserted again is a duplicate: one movement at Stripe, one
// create request.
func TestMoneyOutJobRetriedAndRunAgainMakesOne(t *testing.T) {
	t.Parallel()
	for _, tc := range moneyOutCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, billingtest.Config{})
			a := tc.args(e)
			c := e.client(e.riverConfig(e.biller(), nil))
			job := e.insertMoneyOut(c, a)
			// The listing before the send finds nothing; the answer is
			// lost after Stripe made it; the one listing after that fails.
			e.srv.FailNext(billingtest.Match{Method: http.MethodPost, Path: tc.path}, billingtest.Fault{Kind: billingtest.FaultCut})
			e.srv.FailNext(billingtest.Match{Method: http.MethodGet, Path: tc.path}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
			res := work(e, e.moneyOutWorker(e.biller(oneAttempt)), job)
			if res.EventKind != river.EventKindJobFailed {
				t.Fatalf("first run: %s, job %s; want failed, to be retried", res.EventKind, res.Job.State)
			}
			if n := len(e.srv.Movements(tc.object)); n != 1 {
				t.Fatalf("after the lost answer Stripe holds %d %ss, want 1", n, tc.object)
			}
			w := e.moneyOutWorker(e.biller())
			res = work(e, w, res.Job)
			if res.EventKind != river.EventKindJobCompleted {
				t.Fatalf("retry: %s %v; want completed", res.EventKind, res.Job.Errors)
			}
			again := &river.Job[riverbilling.MoneyOutArgs]{JobRow: &rivertype.JobRow{ID: job.ID, Attempt: 3, Queue: riverbilling.DefaultQueue}, Args: a}
			if err := w.Work(context.Background(), again); err != nil {
				t.Errorf("a run after the job completed = %v; want nil", err)
			}
			dup, err := c.Insert(context.Background(), a, nil)
			if err != nil || !dup.UniqueSkippedAsDuplicate {
				t.Errorf("insert again = %+v, %v; want skipped as a duplicate", dup, err)
			}
			e.wantOneMovement(tc, a)
			if n := e.posts(tc.path); n != 1 {
				t.Errorf("%d create requests, want 1: the retry and the run after it found the %s", n, tc.object)
			}
		})
	}
}

// Money-out jobs on River's own workers, each inserted twice (the second
// a duplicate), complete with one movement each.
func TestMoneyOutJobsOnRiverMakeOneEach(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	var args []riverbilling.MoneyOutArgs
	for _, tc := range moneyOutCases {
		args = append(args, tc.args(e))
	}
	c := e.client(e.riverConfig(e.biller(), nil))
	for range 2 {
		for _, a := range args {
			e.insertMoneyOut(c, a)
		}
	}
	e.start(c)
	for {
		var open int
		if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'billonce_money_out' AND state NOT IN ('completed', 'cancelled', 'discarded')`).Scan(&open); err != nil {
			t.Fatal(err)
		}
		if open == 0 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	var completed int
	if err := e.pool.QueryRow(context.Background(), `SELECT count(*) FROM river_job WHERE kind = 'billonce_money_out' AND state = 'completed'`).Scan(&completed); err != nil {
		t.Fatal(err)
	}
	if completed != len(args) {
		t.Errorf("%d money-out jobs completed, want %d", completed, len(args))
	}
	for i, tc := range moneyOutCases {
		e.wantOneMovement(tc, args[i])
	}
}

// A refusal of the movement itself cancels its job at once, with the
// reason, and nothing is moved: a balance short of a transfer or payout,
// a refund of more than is left of the payment, of a disputed payment, of
// a period never paid, and arguments that name no movement.
func TestMoneyOutJobRefusedIsCancelledWithTheReason(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, object, want string
		args               func(e *env) riverbilling.MoneyOutArgs
	}{
		{"transfer past the platform's balance", "transfer", "balance_insufficient", func(e *env) riverbilling.MoneyOutArgs {
			e.srv.SetBalance("", "usd", 100)
			return riverbilling.MoneyOutArgs{Period: period, Transfer: true, Account: e.srv.CreateAccount(), Amount: 5000, Currency: "usd"}
		}},
		{"payout past the account's balance", "payout", "balance_insufficient", func(e *env) riverbilling.MoneyOutArgs {
			return riverbilling.MoneyOutArgs{Period: period, Payout: true, Account: e.srv.CreateAccount(), Amount: 5000, Currency: "usd"}
		}},
		{"refund past the payment", "refund", "usd left", func(e *env) riverbilling.MoneyOutArgs {
			e.paid(e.biller(), "cus_1")
			return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_1", Refund: "too-much", Amount: amount + 1}
		}},
		{"refund of a disputed payment", "refund", "charge_disputed", func(e *env) riverbilling.MoneyOutArgs {
			if _, err := e.srv.Dispute(e.paid(e.biller(), "cus_1"), "fraudulent"); err != nil {
				e.tb.Fatal(err)
			}
			return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_1", Refund: "rma-d", Amount: 700}
		}},
		{"refund of a period never paid", "refund", "no payment to refund", func(e *env) riverbilling.MoneyOutArgs {
			return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_never", Refund: "rma-n", Amount: 700}
		}},
		{"refund and transfer at once", "transfer", "set exactly one", func(e *env) riverbilling.MoneyOutArgs {
			e.paid(e.biller(), "cus_1")
			return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_1", Refund: "rma-1", Transfer: true, Amount: 700}
		}},
		{"refund naming an account", "refund", "takes no Account", func(e *env) riverbilling.MoneyOutArgs {
			e.paid(e.biller(), "cus_1")
			return riverbilling.MoneyOutArgs{Period: period, Customer: "cus_1", Refund: "rma-1", Account: e.srv.CreateAccount(), Amount: 700}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, billingtest.Config{})
			a := tc.args(e)
			c := e.client(e.riverConfig(e.biller(), nil))
			res := work(e, e.moneyOutWorker(e.biller()), e.insertMoneyOut(c, a))
			if res.EventKind != river.EventKindJobCancelled || res.Job.Attempt != 1 {
				t.Fatalf("%s: %s after %d attempts; want cancelled after 1", tc.name, res.EventKind, res.Job.Attempt)
			}
			if !strings.Contains(lastErr(res.Job), tc.want) {
				t.Errorf("job error %q, want the reason %q", lastErr(res.Job), tc.want)
			}
			for _, m := range e.srv.Movements(tc.object) {
				if m.Status != "failed" && m.Status != "canceled" {
					t.Errorf("Stripe holds %s %+v, want nothing moved", tc.object, m)
				}
			}
		})
	}
}

// The same money-out job run twice at once, by two workers on two
// Billers (River's rescuer re-running a job that was only slow): one
// movement, one create request; the second run is snoozed while the first
// holds the claim, then completes without sending.
func TestMoneyOutJobTwiceAtOnceMakesOne(t *testing.T) {
	t.Parallel()
	for _, tc := range moneyOutCases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, billingtest.Config{})
			a := tc.args(e)
			release := make(chan struct{})
			e.srv.FailNext(billingtest.Match{Method: http.MethodPost, Path: tc.path}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
			job := &river.Job[riverbilling.MoneyOutArgs]{JobRow: &rivertype.JobRow{ID: 1, Attempt: 1, Queue: riverbilling.DefaultQueue}, Args: a}
			workers := []*riverbilling.MoneyOutWorker{e.moneyOutWorker(e.biller()), e.moneyOutWorker(e.biller())}
			var (
				wg   sync.WaitGroup
				errs [2]error
			)
			before := e.claims()
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[0] = workers[0].Work(context.Background(), job)
			}()
			// The second run starts once the first one holds the claim,
			// and the first is answered once the second is done.
			for e.claims() == before {
				time.Sleep(5 * time.Millisecond)
			}
			errs[1] = workers[1].Work(context.Background(), job)
			close(release)
			wg.Wait()
			var snoozed *river.JobSnoozeError
			if errs[0] != nil || !errors.As(errs[1], &snoozed) {
				t.Fatalf("runs at once = %v, %v; want nil and a snooze", errs[0], errs[1])
			}
			if err := workers[1].Work(context.Background(), job); err != nil {
				t.Errorf("the snoozed run, again = %v; want nil", err)
			}
			e.wantOneMovement(tc, a)
			if n := e.posts(tc.path); n != 1 {
				t.Errorf("%d create requests, want 1", n)
			}
		})
	}
}
