package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// A void invoice that other code holding the key made for the customer,
// carrying the claim's billonce_key metadata, is no proof that the claim's
// own invoice was voided: the claim's draft was never made (the draft's
// request was refused before Stripe ran it). The resume bills the period
// with an invoice of its own, or leaves the claim for a person; it never
// fails the claim on another writer's void invoice, which skips the period.
func TestInvoiceResumeDoesNotFailOnAnotherWritersVoidInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	if n := len(e.srv.Invoices("cus_1")); n != 0 {
		t.Fatalf("%d invoices after the refused draft, want 0", n)
	}
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	items := &invoiceitem.Client{B: ic.B, Key: ic.Key}
	if _, err := items.New(&stripe.InvoiceItemParams{Customer: stripe.String("cus_1"), Invoice: stripe.String(other.ID), Amount: stripe.Int64(1290), Currency: stripe.String("usd"), Params: stripe.Params{IdempotencyKey: stripe.String("other-item-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.FinalizeInvoice(other.ID, &stripe.InvoiceFinalizeInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-finalize-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.VoidInvoice(other.ID, &stripe.InvoiceVoidInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-void-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	_, err = e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	c := e.invoiceClaim("cus_1")
	if c.State == claim.StateFailed {
		t.Fatalf("claim failed (%v) on invoice %s, which the claim never made; the period is skipped", err, c.StripeID)
	}
	var paid int
	for _, in := range e.srv.Invoices("cus_1") {
		paid += in.Payments
	}
	if err == nil && paid != 1 {
		t.Fatalf("success reported, %d payments at the fake", paid)
	}
}

// A customer with more invoices than one page of the list (other invoices
// made since billonce's, killed after its finalization) is listed to its
// end: the resume finds billonce's invoice and pays it, once.
func TestInvoiceKilledIsFoundPastTheFirstPageOfTheCustomersInvoices(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.killedAt("finalize", inv)
	ic := e.invoices()
	for i := 0; i < 130; i++ {
		p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd")}
		p.Metadata, p.IdempotencyKey = map[string]string{"n": fmt.Sprint(i)}, stripe.String(fmt.Sprintf("other-invoice-%d", i))
		if _, err := ic.New(p); err != nil {
			t.Fatal(err)
		}
	}
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if err != nil {
		t.Fatal(err)
	}
	var own int
	for _, in := range e.srv.Invoices("cus_1") {
		if in.Metadata[billing.MetaKey] != "" {
			own++
			if in.ID != r.StripeID || in.Payments != 1 || in.Finalizations != 1 {
				t.Fatalf("invoice %+v, receipt %+v", in, r)
			}
		}
	}
	if own != 1 {
		t.Fatalf("%d invoices carry the key, want 1", own)
	}
}

// A connected account's invoice killed at any step is found on that
// account a day later: one invoice there, paid once.
func TestInvoiceOnAConnectedAccountKilledPartWayIsFoundOnItsAccount(t *testing.T) {
	t.Parallel()
	for _, step := range invoiceSteps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			acct := e.srv.CreateAccount()
			inv := threeLines()
			inv.Account = acct
			e.killedAt(step, inv)
			e.advance(25 * time.Hour)
			r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			if err != nil {
				t.Fatal(err)
			}
			all := e.srv.Invoices("cus_1")
			if len(all) != 1 || all[0].Account != acct || all[0].Payments != 1 || all[0].Finalizations != 1 || len(all[0].Lines) != 3 || r.StripeID != all[0].ID {
				t.Fatalf("invoices %+v, receipt %+v; want one on %s, paid once", all, r, acct)
			}
		})
	}
}

// billonce's draft, deleted by a person while its runner was dead, is not
// made again: within the key's window, or a day later once Stripe has
// forgotten the draft's key, and whether or not the runner recorded the
// draft as it gave up. Stripe lists no deleted invoice, but keeps its
// invoice.deleted event for 30 days: the resume finds it there, and fails
// the claim, as an invoice voided by hand does (billonce invoices that
// period no more; Rebill bills it again). Counted at the fake: no invoice
// made after the deletion. A resume that trusts the empty list of the
// customer's invoices makes and pays a new invoice a day later.
func TestInvoiceDraftDeletedByHandIsNotMadeAgain(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{time.Minute, 25 * time.Hour} {
		for _, recorded := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/recorded=%v", after, recorded), func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, oneAttempt)
				inv := threeLines()
				if recorded {
					e.crashAt(e.b, "cus_1", "line 1", inv)
					e.wantHeldDraft("claim after the crash")
				} else {
					e.killedAt("line 1", inv)
				}
				all := e.srv.Invoices("cus_1")
				if len(all) != 1 || all[0].Status != "draft" {
					t.Fatalf("invoices %+v", all)
				}
				if _, err := e.invoices().Del(all[0].ID, nil); err != nil {
					t.Fatal(err)
				}
				e.advance(after)
				r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
				if now := e.srv.Invoices("cus_1"); len(now) != 0 {
					t.Fatalf("after the draft was deleted, the resume made %+v (receipt %+v, err %v)", now, r, err)
				}
				if !errors.Is(err, billing.ErrDeclined) || !strings.Contains(err.Error(), "deleted") {
					t.Fatalf("err = %v, want ErrDeclined saying the draft was deleted", err)
				}
				if c := e.invoiceClaim("cus_1"); c.State != claim.StateFailed || c.StripeID != all[0].ID {
					t.Fatalf("claim %s %s, want failed with the deleted draft %s", c.State, c.StripeID, all[0].ID)
				}
			})
		}
	}
}

// A runner killed at any step, resumed by a Biller on a rotated key: within
// the old key's window it sends no draft or line that may already be at
// Stripe (ErrSentElsewhere), and once every line is found it finalizes
// and pays (a second finalization or payment is refused); a day later it
// finishes the invoice. Either way one invoice, each line once, paid at
// most once, counted at the fake.
func TestInvoiceKilledPartWayResumedOnARotatedKey(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{time.Minute, 25 * time.Hour} {
		for _, step := range invoiceSteps {
			t.Run(after.String()+"/"+step, func(t *testing.T) {
				t.Parallel()
				e := newEnv(t, oneAttempt)
				inv := threeLines()
				e.killedAt(step, inv)
				e.advance(after)
				_, err := e.biller(oneAttempt, rotated).Invoice(context.Background(), "cus_1", period, inv)
				all := e.srv.Invoices("cus_1")
				if len(all) > 1 {
					t.Fatalf("%d invoices: %+v", len(all), all)
				}
				for _, in := range all {
					if len(in.Lines) > 3 || in.Payments > 1 || in.Finalizations > 1 {
						t.Fatalf("invoice %+v", in)
					}
				}
				// Within the window, a step not found waits only for
				// the draft and the lines: once every line is found
				// (killed at the last line or later), the rest goes on.
				if after > 24*time.Hour || step == "pay" || step == "finalize" || step == "line 2" {
					if err != nil {
						t.Fatal(err)
					}
					e.wantOneInvoice("cus_1", inv, "paid", 1)
				} else if !errors.Is(err, billing.ErrSentElsewhere) {
					t.Fatalf("err = %v, want ErrSentElsewhere", err)
				}
			})
		}
	}
}

// An invoice other code holding the key made and had paid for the
// customer, carrying the claim's billonce_key metadata and even the
// claim's total, but none of its lines, is not the claim's: billonce's
// draft was never made (its request was refused before Stripe ran it).
// The resume does not report the period paid on it.
func TestInvoiceResumeDoesNotTakeAnotherWritersPaidInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	items := &invoiceitem.Client{B: ic.B, Key: ic.Key}
	if _, err := items.New(&stripe.InvoiceItemParams{Customer: stripe.String("cus_1"), Invoice: stripe.String(other.ID), Amount: stripe.Int64(1290), Currency: stripe.String("usd"), Description: stripe.String("Another product"), Params: stripe.Params{IdempotencyKey: stripe.String("other-item-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.FinalizeInvoice(other.ID, &stripe.InvoiceFinalizeInvoiceParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-finalize-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	if _, err := ic.Pay(other.ID, &stripe.InvoicePayParams{Params: stripe.Params{IdempotencyKey: stripe.String("other-pay-" + other.ID)}}); err != nil {
		t.Fatal(err)
	}
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if err == nil && r.StripeID == other.ID {
		t.Fatalf("receipt %+v: the period reported paid by invoice %s, which carries none of the claim's lines", r, other.ID)
	}
	var ownPaid int
	for _, in := range e.srv.Invoices("cus_1") {
		if in.ID != other.ID {
			ownPaid += in.Payments
		}
	}
	if err == nil && ownPaid != 1 {
		t.Fatalf("success reported with %d payments of the claim's own invoice", ownPaid)
	}
}

// Reconcile resumes an invoice claim a killed runner left with nothing
// recorded, at any step, a day later: it finds the invoice by listing and
// finishes it once.
func TestReconcileFinishesAnInvoiceKilledPartWay(t *testing.T) {
	t.Parallel()
	for _, step := range invoiceSteps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.killedAt(step, inv)
			e.advance(25 * time.Hour)
			b := e.biller(oneAttempt, func(c *billing.Config) {
				c.Invoice = func(context.Context, string, string) (billing.Invoice, error) { return *inv, nil }
			})
			sum, err := b.Reconcile(context.Background(), nil)
			if err != nil || sum.Created+sum.AlreadyBilled != 1 {
				t.Fatalf("reconcile = %+v, %v %v", sum.Progress, err, sum.Failures)
			}
			e.wantOneInvoice("cus_1", inv, "paid", 1)
			if c := e.invoiceClaim("cus_1"); c.State != claim.StateSucceeded {
				t.Fatalf("claim %s", c.State)
			}
		})
	}
}

// A draft that other code holding the key made for the customer in the
// invoice's currency, carrying the claim's billonce_key metadata but no
// line, and deleted, is no proof that the claim's own draft was deleted:
// billonce's draft was never made (its request was stopped before it was
// sent). The resume bills the period with an invoice of its own, or
// leaves the claim for a person; it does not fail the claim.
func TestInvoiceResumeDoesNotFailOnAnotherWritersDeletedDraft(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv)
	key := e.invoiceClaim("cus_1").Key
	ic := e.invoices()
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Currency: stripe.String("usd"), AutoAdvance: stripe.Bool(false)}
	p.Metadata, p.IdempotencyKey = map[string]string{billing.MetaKey: key}, stripe.String("other-writer-"+t.Name())
	other, err := ic.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ic.Del(other.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if c := e.invoiceClaim("cus_1"); c.State == claim.StateFailed {
		t.Fatalf("claim failed on another writer's deleted draft %s, though billonce made no invoice (%d at the fake): err %v", other.ID, len(e.srv.Invoices("cus_1")), err)
	}
}
