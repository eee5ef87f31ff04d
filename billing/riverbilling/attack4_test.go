package riverbilling_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

const (
	upstreamKey = "sk_test_51UpstreamHeldByProxyNeverLogMe00000wxyz"
	vaultKey    = "vault_key_river_attack4_secret_tail_0123456789"
)

// Charge jobs behind a spend-cap proxy with a daily cap of three charges,
// over two days. Day 1: the first charge's answer is lost (its job is
// retried the next day, past the key's window, with Stripe's search up),
// two more are charged, the fourth meets the cap and is cancelled. Day 2:
// the retried job finds its charge instead of sending again, and the
// cancelled customers are billed under the new day's cap. Every customer
// is charged once, no day's spend passes the cap, and neither the vault
// key nor the Stripe key shows up in the jobs' errors or the logs.
func TestAttack4SpendCapAcrossDays(t *testing.T) {
	e := newEnv(t, billingtest.Config{APIKeys: []string{upstreamKey}})
	px := spendcaptest.NewProxy(spendcaptest.Config{Upstream: e.srv.URL, StripeKey: upstreamKey, Clock: e.srv})
	t.Cleanup(px.Close)
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 3 * amount, Per: spendcap.PerDay})
	var logs bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&logs, nil))
	behind := func(opts ...func(*billing.Config)) *billing.Biller {
		hc, err := spendcap.Client(px.URL, vaultKey, &http.Client{})
		if err != nil {
			t.Fatal(err)
		}
		return e.biller(append([]func(*billing.Config){func(c *billing.Config) {
			c.SecretKey, c.HTTPClient, c.Credential, c.Logger = vaultKey, hc, "acct_test/billing-key-1", logger
		}}, opts...)...)
	}
	worker := func(b *billing.Biller) *riverbilling.Worker {
		w, err := riverbilling.NewWorker(b, riverbilling.WorkerConfig{Logger: logger})
		if err != nil {
			t.Fatal(err)
		}
		return w
	}
	c := e.client(e.riverConfig(e.biller(), nil))
	ids := customers(6)

	// Day 1.
	var lost atomic.Bool
	px.LoseAnswers(func(r *http.Request) bool { return r.Method == http.MethodPost && lost.CompareAndSwap(false, true) })
	e.searchDown()
	first := e.workJob(worker(behind(oneAttempt)), e.insert(c, riverbilling.ChargeArgs{Customer: ids[0], Period: period}))
	px.LoseAnswers(nil)
	e.srv.SetScript(nil)
	if first.EventKind != river.EventKindJobFailed {
		t.Fatalf("lost answer: %s, want failed, to be retried", first.EventKind)
	}
	w := worker(behind())
	for _, id := range ids[1:4] {
		res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: id, Period: period}))
		t.Logf("day 1 %s: %s", id, res.EventKind)
	}
	if u := px.Usage(vaultKey); u.Spent+u.Reserved > 3*amount {
		t.Errorf("day 1 usage %+v passes the cap %d", u, 3*amount)
	}
	if n := len(e.srv.Payments()); n != 3 {
		t.Errorf("day 1: %d payments, want 3", n)
	}

	// Day 2.
	e.advance(25 * time.Hour)
	before := e.creates(ids[0])
	if res := e.workJob(w, first.Job); res.EventKind != river.EventKindJobCompleted {
		t.Errorf("retry of the lost answer a day later: %s %v", res.EventKind, res.Job.Errors)
	}
	if n := e.creates(ids[0]) - before; n != 0 {
		t.Errorf("%d create requests for %s a day later, want 0 (found by search)", n, ids[0])
	}
	for _, id := range ids[3:] {
		// Attempt 1 is the same charge as attempt 0, in a job River has
		// not seen (the cancelled one blocks its own arguments).
		res := e.workJob(w, e.insert(c, riverbilling.ChargeArgs{Customer: id, Period: period, Attempt: 1}))
		if res.EventKind != river.EventKindJobCompleted {
			t.Errorf("day 2 %s: %s %v", id, res.EventKind, res.Job.Errors)
		}
	}
	if u := px.Usage(vaultKey); u.Spent+u.Reserved > 3*amount {
		t.Errorf("day 2 usage %+v passes the cap %d", u, 3*amount)
	}
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}

	var errs string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(errors::text, ' '), '') FROM river_job`).Scan(&errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(errs, "cap") {
		t.Errorf("jobs' errors do not say the cap was reached: %.500s", errs)
	}
	for _, where := range []struct{ name, text string }{{"job errors", errs}, {"logs", logs.String()}} {
		for _, secret := range []string{vaultKey, vaultKey[10:], upstreamKey, upstreamKey[8:], secretKey, secretKey[8:]} {
			if strings.Contains(where.text, secret) {
				t.Errorf("%s hold a secret (%.12s…)", where.name, secret)
			}
		}
	}
}

// A job's first run loses Stripe's answer; before its retry the workers
// are redeployed with another configuration: the other API, a rotated
// secret key, another scope. No retry sends the key blind: the job waits
// (snoozed until the key's window has passed) or is cancelled with the
// reason, and a run a day later settles it by search. One charge.
func TestAttack4WorkerConfigChangedBetweenAttempts(t *testing.T) {
	changes := map[string]func(*billing.Config){
		"api":   func(c *billing.Config) { c.API = billing.PaymentIntents; c.Price = pmPrice },
		"key":   func(c *billing.Config) { c.Credential = "sk_test_rotated_key_2" },
		"scope": func(c *billing.Config) { c.Scope = "billonce-v2" },
	}
	for name, change := range changes {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t, billingtest.Config{})
			c := e.client(e.riverConfig(e.biller(), nil))
			e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
			e.searchDown()
			first := e.workJob(e.worker(e.biller(oneAttempt)), e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period}))
			if first.EventKind != river.EventKindJobFailed {
				t.Fatalf("first run: %s", first.EventKind)
			}
			// The retry, with search still down: nothing can settle it.
			w := e.worker(e.biller(change))
			res := e.workJob(w, first.Job)
			e.srv.SetScript(nil)
			t.Logf("retry after the change: %s %v", res.EventKind, lastErr(res.Job))
			if n := e.count("cus_1"); n != 1 {
				t.Fatalf("%d charges after the retry", n)
			}
			e.advance(25 * time.Hour)
			if res.Job.State != rivertype.JobStateCancelled && res.Job.State != rivertype.JobStateCompleted {
				res = e.workJob(w, res.Job)
				t.Logf("a day later: %s %v", res.EventKind, lastErr(res.Job))
			}
			// Whatever the job did, a Run of the first configuration
			// settles the period.
			sum, err := e.biller().Run(context.Background(), period, billing.Customers("cus_1"), nil)
			t.Logf("run of the first configuration: %+v %v", sum.Progress, err)
			billingtest.RequireChargedOnce(t, e.srv, "cus_1", period)
		})
	}
}

func pmPrice(context.Context, string, string) (billing.Price, error) {
	return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
}

func lastErr(j *rivertype.JobRow) string {
	if len(j.Errors) == 0 {
		return ""
	}
	return j.Errors[len(j.Errors)-1].Error
}
