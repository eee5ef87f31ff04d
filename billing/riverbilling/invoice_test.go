package riverbilling_test

import (
	"context"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
)

// threeLines is the invoice Config.Invoice makes: 1000 + 250 + 40 cents.
func threeLines(context.Context, string, string) (billing.Invoice, error) {
	return billing.Invoice{Currency: "usd", Description: "September", Lines: []billing.InvoiceLine{
		{Description: "Plan", Amount: 1000}, {Description: "Seats", Amount: 250}, {Description: "Support", Amount: 40}}}, nil
}

func invoiced(c *billing.Config) { c.Invoice = threeLines }

// wantOneInvoice fails unless customer has exactly one invoice at the
// fake, paid once, finalized once, with threeLines' lines each once.
func (e *env) wantOneInvoice(customer string) {
	e.tb.Helper()
	all := e.srv.Invoices(customer)
	if len(all) != 1 {
		e.tb.Errorf("%s: %d invoices, want 1", customer, len(all))
		return
	}
	want, _ := threeLines(context.Background(), customer, period)
	got := all[0]
	if got.Status != "paid" || got.Finalizations != 1 || got.Payments != 1 || len(got.Lines) != len(want.Lines) {
		e.tb.Errorf("%s: invoice %s %s, %d finalizations, %d payments, %d lines; want paid, 1, 1, %d",
			customer, got.ID, got.Status, got.Finalizations, got.Payments, len(got.Lines), len(want.Lines))
		return
	}
	for i, l := range got.Lines {
		if l.Amount != want.Lines[i].Amount || l.Metadata["billonce_line"] != strconv.Itoa(i) {
			e.tb.Errorf("%s: invoice %s line %d = %+v, want amount %d, billonce_line %d", customer, got.ID, i, l, want.Lines[i].Amount, i)
		}
	}
}

// A fan-out of items marked for invoices inserts invoice jobs, once; the
// workers bill each customer by one invoice with each line once, through
// lost answers and a 500, one of which only a retry by River can settle.
// An item with lines of its own is refused, and a job that runs again
// after completing sends nothing.
func TestInvoiceJobsBillOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	b := e.biller(invoiced, oneAttempt)
	c := e.client(e.riverConfig(b, nil))
	ids := customers(6)
	items := func(yield func(billing.Item, error) bool) {
		for _, id := range ids {
			if !yield(billing.Item{Customer: id, Invoice: &billing.Invoice{}}, nil) {
				return
			}
		}
		own, _ := threeLines(context.Background(), "cus_own", period)
		yield(billing.Item{Customer: "cus_own", Invoice: &own}, nil)
	}
	ctx := context.Background()
	res, err := riverbilling.FanOut(ctx, c, e.pool, period, items, 0)
	if err != nil || res.Inserted != len(ids) || res.Invalid != 1 || !strings.Contains(res.Errors[0], "Config.Invoice") {
		t.Fatalf("fan-out = %+v, %v; want %d inserted, the item with its own lines refused", res, err, len(ids))
	}
	if res, err := riverbilling.FanOut(ctx, c, e.pool, period, items, 0); err != nil || res.Inserted != 0 || res.Duplicates != len(ids) {
		t.Fatalf("fan-out again = %+v, %v; want every job a duplicate", res, err)
	}

	// ids[1]'s first run: the draft's answer is lost and Stripe's search
	// is down, so nothing can tell whether it exists: the job fails, to
	// be retried by River with the same keys.
	var first int64
	if err := e.pool.QueryRow(ctx, `SELECT id FROM river_job WHERE args->>'customer' = $1`, ids[1]).Scan(&first); err != nil {
		t.Fatal(err)
	}
	row, err := c.JobGet(ctx, first)
	if err != nil {
		t.Fatal(err)
	}
	e.srv.FailNext(billingtest.Match{Path: "/v1/invoices", Customer: ids[1]}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.searchDown()
	if r := work(e, e.worker(b), row); r.EventKind != river.EventKindJobFailed {
		t.Fatalf("run with the draft's answer lost: %s %v, want failed, to be retried", r.EventKind, r.Job.Errors)
	}
	e.srv.SetScript(nil)
	e.srv.FailNext(billingtest.Match{Path: "/v1/invoiceitems", Customer: ids[2]}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Method: http.MethodPost, Customer: ids[3]}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	e.start(c)
	st := e.waitFinished(len(ids))
	if st.Jobs[rivertype.JobStateCompleted] != len(ids) {
		t.Errorf("state = %v, want every job completed", st)
	}
	for _, id := range ids {
		e.wantOneInvoice(id)
		billingtest.RequireNotCharged(t, e.srv, id, period)
	}
	// Both faults were met: the lost line was found, not added twice.
	met := 0
	for _, r := range e.srv.Log() {
		if r.Fault != "" && r.Method == http.MethodPost {
			met++
			t.Logf("fault %s at %s %s for %s", r.Fault, r.Method, r.Path, r.Customer)
		}
	}
	if met != 3 {
		t.Errorf("%d faults met, want 3", met)
	}
	var attempts int
	if err := e.pool.QueryRow(ctx, `SELECT attempt FROM river_job WHERE args->>'customer' = $1`, ids[1]).Scan(&attempts); err != nil || attempts < 2 {
		t.Errorf("%s's job ran %d times (%v), want at least 2: its lost answer is retried by River", ids[1], attempts, err)
	}
	// The first customer's job, run again after it completed.
	var id int64
	if err := e.pool.QueryRow(ctx, `SELECT id FROM river_job WHERE args->>'customer' = $1`, ids[0]).Scan(&id); err != nil {
		t.Fatal(err)
	}
	row, err = c.JobGet(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	job := &river.Job[riverbilling.ChargeArgs]{JobRow: row, Args: riverbilling.ChargeArgs{Customer: ids[0], Period: period, Invoice: true}}
	before := len(e.srv.Log())
	if err := e.worker(b).Work(ctx, job); err != nil {
		t.Errorf("run again: %v, want nil", err)
	}
	if n := len(e.srv.Log()) - before; n != 0 {
		t.Errorf("the run again made %d requests, want 0", n)
	}
	e.wantOneInvoice(ids[0])
}

// A charge job for a period a customer was invoiced for is cancelled as a
// mismatch, and an invoice job for a re-bill attempt is cancelled as
// invalid before anything is sent.
func TestInvoiceJobsRefuseWhatCannotBe(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	b := e.biller(invoiced)
	w := e.worker(b)
	c := e.client(e.riverConfig(b, nil))
	if r := work(e, w, e.insert(c, riverbilling.ChargeArgs{Customer: "cus_1", Period: period, Invoice: true})); r.EventKind != river.EventKindJobCompleted {
		t.Fatalf("invoice job: %s %v", r.EventKind, r.Job.Errors)
	}
	before := len(e.srv.Log())
	for _, args := range []riverbilling.ChargeArgs{
		{Customer: "cus_1", Period: period},
		{Customer: "cus_2", Period: period, Invoice: true, Attempt: 2},
	} {
		r := work(e, w, e.insert(c, args))
		if r.EventKind != river.EventKindJobCancelled || r.Job.Attempt != 1 {
			t.Errorf("%+v: %s after %d attempts (%s), want cancelled after 1", args, r.EventKind, r.Job.Attempt, lastErr(r.Job))
		}
	}
	if n := len(e.srv.Log()) - before; n != 0 {
		t.Errorf("%d requests for the refused jobs, want 0", n)
	}
	e.wantOneInvoice("cus_1")
	billingtest.RequireNotCharged(t, e.srv, "cus_1", period)
	if n := len(e.srv.Invoices("cus_2")); n != 0 {
		t.Errorf("cus_2: %d invoices, want 0", n)
	}
}
