package main

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/lock"
)

const period = "2026-09"

// customersFile writes a customers file for the test and returns its path.
func customersFile(t *testing.T, rows string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "customers.csv")
	if err := os.WriteFile(p, []byte(rows), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestRunBillsEveryCustomerOnceAndAgainNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	file := customersFile(t, "customer,amount,currency\ncus_a,2500,usd\ncus_b,900,eur\ncus_c,4900,usd\n")
	r := e.billonce("", "run", "-period", period, "-customers", file).want(t, exitOK)
	if !strings.Contains(r.stdout, "created             3") || !strings.Contains(r.stderr, "100% 3/3") {
		t.Errorf("summary or progress missing:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	for _, c := range []string{"cus_a", "cus_b", "cus_c"} {
		billingtest.RequireChargedOnce(t, e.fake, c, period)
	}
	created := e.fake.Stats().Created
	r = e.billonce("", "run", "-period", period, "-customers", file, "-json").want(t, exitOK)
	s := decode[summaryJSON](t, r.stdout)
	if s.Status != "complete" || s.AlreadyBilled != 3 || s.Created != 0 {
		t.Errorf("second run: %+v, want complete with 3 already billed", s)
	}
	if got := e.fake.Stats().Created; got != created {
		t.Errorf("second run created %d objects at Stripe, want 0", got-created)
	}
}

func TestRunFlatPriceFromStandardInput(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	r := e.billonce("cus_x\ncus_y\n", "run", "-period", period, "-amount", "1200", "-currency", "usd", "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.Created != 2 {
		t.Errorf("summary %+v, want 2 created", s)
	}
	for _, c := range []string{"cus_x", "cus_y"} {
		billingtest.RequireChargedOnce(t, e.fake, c, period)
	}
	for _, p := range e.fake.Payments() {
		if p.Amount != 1200 || p.Currency != "usd" {
			t.Errorf("payment %s: %d %s, want 1200 usd", p.ID, p.Amount, p.Currency)
		}
	}
}

func TestRunWithDeclineExitsFourWithFailureObjects(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_b": "insufficient_funds"}})
	r := e.billonce("cus_a,100,usd\ncus_b,200,usd\n", "run", "-period", period, "-json").want(t, exitIncomplete)
	s := decode[summaryJSON](t, r.stdout)
	if s.Status != "incomplete" || s.ExitCode != exitIncomplete || s.Created != 1 || s.Declined != 1 || len(s.Failures) != 1 {
		t.Fatalf("summary %+v", s)
	}
	f := s.Failures[0]
	if f.Customer != "cus_b" || f.Period != period || f.Key == "" || f.Attempt != 1 || f.Kind != "declined" ||
		f.StripeCode != "card_declined" || f.DeclineCode != "insufficient_funds" {
		t.Errorf("failure %+v", f)
	}
	if !strings.HasPrefix(f.RequestID, "req_") {
		t.Errorf("failure %+v: want Stripe's request id of the decline", f)
	}
	billingtest.RequireChargedOnce(t, e.fake, "cus_a", period)
	billingtest.RequireNotCharged(t, e.fake, "cus_b", period)
}

func TestRunStoppedByRefusedKeyExitsOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{APIKeys: []string{"sk_test_the_right_one"}})
	r := e.billonce("cus_a,100,usd\ncus_b,200,usd\n", "run", "-period", period, "-json").want(t, exitStopped)
	s := decode[summaryJSON](t, r.stdout)
	if s.Status != "stopped" || s.Error == nil || s.Error.Kind != "stripe_auth" {
		t.Errorf("summary %+v, error %+v: want stopped by stripe_auth", s, s.Error)
	}
	if strings.Contains(r.stdout+r.stderr, testKey) {
		t.Errorf("the secret key was printed:\n%s\n%s", r.stdout, r.stderr)
	}
	if n := e.fake.Stats().Paid; n != 0 {
		t.Errorf("%d payments, want none", n)
	}
}

func TestRunLockHeldElsewhereExitsThree(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	guard, err := lock.NewAdvisory(e.pool, lock.AdvisoryConfig{Namespace: "billonce"})
	if err != nil {
		t.Fatal(err)
	}
	// The claim table must exist for the run to reach the lock.
	e.billonce("", "migrate").want(t, exitOK)
	l, err := guard.Lock(context.Background(), "billonce-run:billonce:"+period)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Unlock(context.Background())
	r := e.billonce("cus_a,100,usd\n", "run", "-period", period, "-json").want(t, exitLockHeld)
	if s := decode[summaryJSON](t, r.stdout); s.Status != "lock_held" {
		t.Errorf("summary %+v, want lock_held", s)
	}
	if n := e.fake.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
}

func TestRunBadInputChargesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	for _, c := range []struct{ in, want string }{
		{"cus_a,100,usd\ncus_b,12.50,usd\n", "standard input:2: customer cus_b: amount \"12.50\""},
		{"cus_a,100,usd\ncus_a,100,usd\n", "listed again"},
		{"cus_a\n", "1 columns; want customer ID, amount"},
	} {
		r := e.billonce(c.in, "run", "-period", period).want(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("input %q: stderr %q lacks %q", c.in, r.stderr, c.want)
		}
	}
	if n := e.fake.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
}

func TestRunInvoiceBillsOneInvoicePerCustomerOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	file := customersFile(t, "customer,amount,currency\ncus_a,2500,usd\ncus_b,900,eur\n")
	r := e.billonce("", "run", "-period", period, "-customers", file, "-invoice", "-description", "September", "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.Status != "complete" || s.Created != 2 {
		t.Errorf("summary %+v, want complete with 2 created", s)
	}
	want := map[string]int64{"cus_a": 2500, "cus_b": 900}
	for c, amount := range want {
		invs := e.fake.Invoices(c)
		if len(invs) != 1 {
			t.Fatalf("%s has %d invoices, want 1", c, len(invs))
		}
		in := invs[0]
		if in.Status != "paid" || in.Finalizations != 1 || in.Payments != 1 || len(in.Lines) != 1 ||
			in.Lines[0].Amount != amount || in.Lines[0].Description != "billing period "+period {
			t.Errorf("%s: invoice %+v, want one paid invoice with one line of %d", c, in, amount)
		}
		billingtest.RequireNotCharged(t, e.fake, c, period)
	}
	created := e.fake.Stats().Created
	r = e.billonce("", "run", "-period", period, "-customers", file, "-invoice", "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.AlreadyBilled != 2 || s.Created != 0 {
		t.Errorf("second run: %+v, want 2 already billed", s)
	}
	if got := e.fake.Stats().Created; got != created {
		t.Errorf("second run created %d objects at Stripe, want 0", got-created)
	}
	// A customer invoiced for the period cannot be charged for it too.
	r = e.billonce("", "run", "-period", period, "-customers", file, "-json").want(t, exitIncomplete)
	if s := decode[summaryJSON](t, r.stdout); s.Invalid != 2 || s.Created != 0 {
		t.Errorf("charge after invoice: %+v, want 2 invalid", s)
	}
	if n := len(e.fake.Payments()); n != 0 {
		t.Errorf("%d charges at the fake, want none", n)
	}
}

func TestRunInvoiceSentIsProcessingUntilPaid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	r := e.billonce("cus_a\n", "run", "-period", period, "-amount", "1200", "-currency", "usd", "-invoice", "-days-until-due", "30", "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.Status != "complete" || s.Processing != 1 {
		t.Errorf("summary %+v, want complete with 1 processing", s)
	}
	invs := e.fake.Invoices("cus_a")
	if len(invs) != 1 || invs[0].Status != "open" || !invs[0].Sent || invs[0].Payments != 0 || len(invs[0].Lines) != 1 {
		t.Errorf("invoices %+v, want one open invoice, sent, of one line", invs)
	}
	r = e.billonce("", "inspect", "-customer", "cus_a", "-period", period).want(t, exitOK)
	if !strings.Contains(r.stdout, "state processing, invoice of 1200 usd, Stripe "+invs[0].ID+"\n") {
		t.Errorf("inspect:\n%s", r.stdout)
	}
}

func TestRunInvoiceBadFlagsSendNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	for _, c := range []struct {
		in   string
		args []string
		want string
	}{
		{"cus_a,100,usd\n", []string{"-invoice", "-days-until-due", "400"}, "DaysUntilDue 400"},
		{"cus_a,100,usd\n", []string{"-days-until-due", "3"}, "-days-until-due goes with -invoice"},
		{"cus_a,100,usd\n", []string{"-invoice", "-api", "payment_intents"}, "drop -api"},
		{"cus_a,100,usd,pm_card_visa\n", []string{"-invoice"}, "standard input:1: customer cus_a: a payment method"},
		{"cus_a,100,usd\ncus_b,0,usd\n", []string{"-invoice"}, "standard input:2: customer cus_b"},
	} {
		r := e.billonce(c.in, append([]string{"run", "-period", period}, c.args...)...).want(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("%v: stderr %q lacks %q", c.args, r.stderr, c.want)
		}
	}
	if n := e.fake.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
}

// A file saved as "CSV UTF-8" starts with a byte-order mark. Its header is
// still a header, not a customer to bill, and its first customer is that
// customer, so that the same ID again is a duplicate; a usage file's
// header likewise.
func TestRunAndUsageReadAFileThatStartsWithAByteOrderMark(t *testing.T) {
	t.Parallel()
	const bom = "\ufeff"
	e := newEnv(t, billingtest.Config{})
	e.billonce(bom+"customer\ncus_a\ncus_b\n", "run", "-period", period, "-amount", "100", "-currency", "usd").want(t, exitOK)
	e.billonce("", "run", "-period", "2026-10", "-customers", customersFile(t, bom+"customer,amount,currency\ncus_c,100,usd\n")).want(t, exitOK)
	for _, c := range []struct{ customer, period string }{{"cus_a", period}, {"cus_b", period}, {"cus_c", "2026-10"}} {
		billingtest.RequireChargedOnce(t, e.fake, c.customer, c.period)
	}
	if n := len(e.fake.Payments()); n != 3 {
		t.Errorf("%d payments at the fake Stripe; want 3, and none for a header", n)
	}
	r := e.billonce(bom+"cus_d,100,usd\ncus_d,100,usd\n", "run", "-period", period).want(t, exitUsage)
	if !strings.Contains(r.stderr, "standard input:2: customer cus_d is listed again (first on line 1)") {
		t.Errorf("stderr %q; want the second cus_d refused as a duplicate of the first", r.stderr)
	}
	billingtest.RequireNotCharged(t, e.fake, "cus_d", period)

	e.fake.CreateMeter("api_calls", "sum", "")
	start, end := lastHour()
	e.billonce(bom+"customer,meter,kind,start,end,value\n"+usageRow("cus_a", "api_calls", "increments", start, end, 5), "usage").want(t, exitOK)
	if n := e.fake.MeterEvents("api_calls", "cus_a"); n != 1 {
		t.Errorf("%d meter events for cus_a; want 1", n)
	}
}

// With -json, run, usage and reconcile print one JSON object however they
// end, also when they stop before billing anyone: the file a cron job
// writes has the error, the exit status and what to do.
func TestJSONOutputEvenWhenStoppedBeforeBilling(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := ln.Addr().String()
	ln.Close() // nothing listens there now
	start, end := lastHour()
	usageRows := usageRow("cus_a", "api_calls", "increments", start, end, 1)

	e := newEnv(t, billingtest.Config{})
	unreachable := "postgres://billonce:pw@" + closed + "/billonce?sslmode=disable"
	for _, c := range []struct {
		db, stdin string
		args      []string
		code      int
		status    string
		message   string
	}{
		{unreachable, "cus_a\n", []string{"run", "-period", period, "-amount", "100", "-currency", "usd"}, exitStopped, "stopped", "cannot reach the database"},
		{unreachable, usageRows, []string{"usage"}, exitStopped, "stopped", "cannot reach the database"},
		{unreachable, "", []string{"reconcile"}, exitStopped, "stopped", "cannot reach the database"},
		{e.db, "cus_a\n", []string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-vault-proxy-url", "http://" + silent(t), "-credential", "acct_test/key", "-vault-timeout", "50ms"},
			exitStopped, "stopped", "no answer within 50ms (-vault-timeout)"},
		{e.db, "cus_a,12.50,usd\n", []string{"run", "-period", period}, exitUsage, "usage_error", "amount \"12.50\""},
		{e.db, "cus_a\n", []string{"run", "-period", period, "-amount", "100", "-currency", "usd", "-concurrency", "5000"}, exitUsage, "usage_error", "above the limit of 1000"},
	} {
		run := *e
		run.db, run.extra = c.db, []string{"SPENDCAP_ADMIN_TOKEN=admin_token_json"}
		r := run.billonce(c.stdin, append(c.args, "-json")...).want(t, c.code)
		s := decode[summaryJSON](t, r.stdout)
		if s.Status != c.status || s.ExitCode != c.code || s.Error == nil || !strings.Contains(s.Error.Message, c.message) || s.Next == "" || s.Failures == nil {
			t.Errorf("%v -json: %+v, error %+v; want status %s, exit code %d, the error %q and what to do", c.args, s, s.Error, c.status, c.code, c.message)
		}
		if !strings.Contains(r.stderr, c.message) {
			t.Errorf("%v -json: stderr %q; want the error there too", c.args, r.stderr)
		}
	}
	if n := e.fake.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe; want none", n)
	}
}
