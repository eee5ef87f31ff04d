package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// billonce's own invoice, killed before its payment and voided by a person
// (who decided the period is not billed this way), is found void on the
// resume, which fails the claim as the invoice.voided event would: the
// period is not invoiced again. A flow that counts only drafts and open
// invoices as the key's makes a new invoice and bills the period anyway.
func TestInvoiceVoidedByHandWhileNothingIsRecordedFailsTheClaim(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{time.Minute, 25 * time.Hour} {
		t.Run(after.String(), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.stopBefore(e.b, "cus_1", "pay", inv)
			all := e.srv.Invoices("cus_1")
			if len(all) != 1 || all[0].Status != "open" {
				t.Fatalf("after the stop the fake has %+v, want one open invoice", all)
			}
			vp := &stripe.InvoiceVoidInvoiceParams{}
			vp.IdempotencyKey = stripe.String("void-by-hand")
			if _, err := e.invoices().VoidInvoice(all[0].ID, vp); err != nil {
				t.Fatal(err)
			}
			e.exec("UPDATE billonce_claims SET stripe_id = '', lease_until = now()")
			e.advance(after)
			before := invoicePosts(e.srv.Log())
			_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			if !errors.Is(err, billing.ErrDeclined) {
				t.Fatalf("err = %v, want ErrDeclined (the invoice is void)", err)
			}
			if now := invoicePosts(e.srv.Log()); now["draft"] != before["draft"] || now["pay"] != before["pay"] {
				t.Fatalf("the resume sent %v, before it %v; want no draft and no payment", now, before)
			}
			if n := len(e.srv.Invoices("cus_1")); n != 1 {
				t.Fatalf("%d invoices, want 1", n)
			}
			if c := e.invoiceClaim("cus_1"); c.State != claim.StateFailed || c.StripeID != all[0].ID {
				t.Fatalf("claim %s %s, want failed with %s", c.State, c.StripeID, all[0].ID)
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
