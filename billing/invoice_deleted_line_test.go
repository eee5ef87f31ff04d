package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A draft whose lines were all added, then one of them deleted from it
// (a person on Stripe's dashboard), and resumed from the draft: no line
// is on the invoice twice, counted at the fake, and an invoice is
// finalized only with each of its lines once. Within the key's window
// every line is sent again with its key and Stripe replays it; a day
// later the keys are forgotten, so a line the listing shows is taken, not
// sent again. A flow that reopens the window at the missing line and then
// sends the lines after it blind adds each of them a second time.
func TestInvoiceDraftWithALineDeletedByHandAddsNoLineTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name    string
		deleted int
		after   time.Duration
	}{
		{name: "first line, within the window", deleted: 0, after: time.Hour},
		{name: "first line, a day later", deleted: 0, after: 25 * time.Hour},
		{name: "middle line, a day later", deleted: 1, after: 25 * time.Hour},
		{name: "last line, a day later", deleted: 2, after: 25 * time.Hour},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.stopBefore(e.b, "cus_1", "finalize", inv)
			drafts := e.srv.Invoices("cus_1")
			if len(drafts) != 1 || len(drafts[0].Lines) != 3 {
				t.Fatalf("before the finalization the fake has %+v, want one draft with 3 lines", drafts)
			}
			if err := e.srv.DeleteInvoiceItem(drafts[0].Lines[tc.deleted].Item); err != nil {
				t.Fatal(err)
			}
			e.advance(tc.after)
			b := e.biller(oneAttempt)
			for range 2 { // a second call goes on from what the first recorded
				_, err := b.Invoice(context.Background(), "cus_1", period, inv)
				t.Logf("resumed call: %v", err)
			}
			all := e.srv.Invoices("cus_1")
			if len(all) != 1 {
				t.Fatalf("%d invoices at the fake, want 1: %+v", len(all), all)
			}
			got := all[0]
			seen := map[string]int{}
			for _, l := range got.Lines {
				seen[l.Metadata["billonce_line"]]++
			}
			for line, n := range seen {
				if n > 1 {
					t.Errorf("invoice %s (%s) has line %s %d times: %+v", got.ID, got.Status, line, n, got.Lines)
				}
			}
			if got.Status != "draft" && (len(got.Lines) != len(inv.Lines) || len(seen) != len(inv.Lines)) {
				t.Errorf("invoice %s was finalized (%s, %d payments) with lines %+v, want each of the 3 once", got.ID, got.Status, got.Payments, got.Lines)
			}
			if got.Status == "paid" {
				e.wantOneInvoice("cus_1", inv, "paid", 1)
			}
			_ = billing.ErrNeedsReconciliation
		})
	}
}

// A claim whose step is set back to the draft (a row restored by hand)
// after a resume a day later found the first lines by listing, reopened
// the window and added the rest: the next resume, inside the new window,
// adds no line twice, counted at the fake. The first lines' keys were
// sent before the window reopened, and Stripe has forgotten them.
func TestInvoiceClaimSetBackToTheDraftAfterAReopenedWindowAddsNoLineTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "line 2", inv)
	e.advance(25 * time.Hour)
	b := e.biller(oneAttempt)
	e.stopBefore(b, "cus_1", "finalize", inv)
	if c := e.invoiceClaim("cus_1"); c.Step != "line 1" {
		t.Fatalf("claim after the reopened window: at %q, want line 1", c.Step)
	}
	e.exec("UPDATE billonce_claims SET step = 'draft'")
	e.advance(time.Hour)
	_, err := b.Invoice(context.Background(), "cus_1", period, inv)
	t.Logf("resumed call: %v", err)
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices at the fake, want 1: %+v", len(all), all)
	}
	seen := map[string]int{}
	for _, l := range all[0].Lines {
		if seen[l.Metadata["billonce_line"]]++; seen[l.Metadata["billonce_line"]] > 1 {
			t.Errorf("invoice %s (%s) has line %s twice: %+v", all[0].ID, all[0].Status, l.Metadata["billonce_line"], all[0].Lines)
		}
	}
	if err == nil {
		e.wantOneInvoice("cus_1", inv, "paid", 1)
	}
}

// A claim restored to before its draft (a row from an older backup), a
// day after the draft and all its lines were made: the resume finds the
// draft by search and adds no line twice, counted at the fake. The lines'
// keys are a day old, and Stripe has forgotten them.
func TestInvoiceClaimRestoredToBeforeItsDraftAddsNoLineTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "finalize", inv)
	e.exec("UPDATE billonce_claims SET step = '', stripe_id = ''")
	e.advance(25 * time.Hour)
	_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	t.Logf("resumed call: %v", err)
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices at the fake, want 1: %+v", len(all), all)
	}
	seen := map[string]int{}
	for _, l := range all[0].Lines {
		if seen[l.Metadata["billonce_line"]]++; seen[l.Metadata["billonce_line"]] > 1 {
			t.Errorf("invoice %s (%s) has line %s twice: %+v", all[0].ID, all[0].Status, l.Metadata["billonce_line"], all[0].Lines)
		}
	}
	if err == nil {
		e.wantOneInvoice("cus_1", inv, "paid", 1)
	}
}
