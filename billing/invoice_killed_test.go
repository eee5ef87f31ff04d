package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// killedAt leaves cus_1's invoice claim as a runner killed at step leaves
// it: the step's request reached Stripe and was done there, and nothing
// of the invoice is on the claim, since a killed process records nothing
// (not even, as a call that gives up does, the invoice it holds). The
// claim's lease is over.
func (e *env) killedAt(step string, inv *billing.Invoice) {
	e.tb.Helper()
	e.crashAt(e.b, "cus_1", step, inv)
	e.exec("UPDATE billonce_claims SET stripe_id = '', lease_until = now()")
}

// A runner killed at any step of an invoice, resumed within the key's
// window or a day later, when Stripe has forgotten every key: billonce
// records nothing of an invoice before its outcome, and the resume finds
// what exists by listing the customer's invoices, which shows an invoice
// at once, in whatever status it has reached. One invoice, each line once,
// finalized once and paid once, counted at the fake. A flow that resumes
// by searching for drafts only makes a second invoice for one already
// finalized or paid, a day later; one that resends the steps with their
// keys a day later duplicates them. The same holds for an invoice on a
// connected account, found on that account.
func TestInvoiceKilledPartWayIsFoundWhereStripeShowsIt(t *testing.T) {
	t.Parallel()
	for _, after := range []time.Duration{time.Minute, 25 * time.Hour} {
		for _, step := range invoiceSteps {
			for _, connected := range []bool{false, true} {
				t.Run(fmt.Sprintf("%v/%s/connected=%v", after, step, connected), func(t *testing.T) {
					t.Parallel()
					e := newEnv(t, oneAttempt)
					inv := threeLines()
					if connected {
						inv.Account = e.srv.CreateAccount()
					}
					e.killedAt(step, inv)
					e.advance(after)
					r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
					if err != nil {
						t.Fatal(err)
					}
					got := e.wantOneInvoice("cus_1", inv, "paid", 1)
					if got.Finalizations != 1 || r.StripeID != got.ID || r.Amount != 1290 || got.Account != inv.Account {
						t.Fatalf("invoice %s on account %q finalized %d times; receipt %+v; want it on account %q", got.ID, got.Account, got.Finalizations, r, inv.Account)
					}
					if c := e.invoiceClaim("cus_1"); c.State != claim.StateSucceeded || c.StripeID != got.ID {
						t.Fatalf("claim %s %s, want succeeded with %s", c.State, c.StripeID, got.ID)
					}
				})
			}
		}
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

// A call that gives up part way records the invoice it holds as it
// releases its claim, so that the invoice's events are known to be about
// the claim's own send: the payment Stripe made for the lost answer
// settles the claim by its invoice.paid event, before any resume.
func TestInvoiceReleasedPartWayIsSettledByItsEvent(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	inv := threeLines()
	h.crashAt(h.biller(oneAttempt), "cus_1", "pay", inv)
	c := h.invoiceClaim("cus_1")
	all := h.srv.Invoices("cus_1")
	if c.State != claim.StatePending || len(all) != 1 || c.StripeID != all[0].ID || all[0].Status != "paid" {
		t.Fatalf("after the lost answer: claim %s holding %q, invoices %+v; want pending, holding the paid invoice", c.State, c.StripeID, all)
	}
	var paid bool
	for _, ev := range h.srv.Events() {
		if ev.Type == "invoice.paid" && ev.ObjectID == all[0].ID {
			h.deliver(ev)
			paid = true
		}
	}
	if !paid {
		t.Fatal("no invoice.paid event")
	}
	if c := h.invoiceClaim("cus_1"); c.State != claim.StateSucceeded || c.StripeID != all[0].ID {
		t.Fatalf("claim after invoice.paid: %s %s", c.State, c.StripeID)
	}
	if got := h.srv.Invoices("cus_1"); len(got) != 1 || got[0].Payments != 1 {
		t.Fatalf("invoices %+v, want the one, paid once", got)
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

// An invoice finalized under the old Stripe key, resumed with a rotated
// one within that key's window: a second finalization or payment cannot
// happen (Stripe refuses to finalize an open invoice, or pay a paid one),
// so the new key's call pays the invoice at once instead of waiting out
// the old key's window, even with the old key's payment still on its way.
// Counted at the fake: one invoice, finalized once, paid once.
func TestInvoiceFinalizedUnderARotatedKeyIsPaidWithoutWaiting(t *testing.T) {
	t.Parallel()
	for _, late := range []bool{false, true} {
		t.Run(map[bool]string{false: "payment never sent", true: "payment on its way"}[late], func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			landing := newLateLanding(func(r *http.Request) bool {
				return r.Method == http.MethodPost && strings.HasSuffix(r.URL.Path, "/pay")
			})
			if late {
				old := e.biller(oneAttempt, func(c *billing.Config) { c.HTTPClient = &http.Client{Transport: landing} })
				ctx, giveUp := context.WithCancel(context.Background())
				done := make(chan error, 1)
				go func() { _, err := old.Invoice(ctx, "cus_1", period, inv); done <- err }()
				<-landing.held
				giveUp()
				if err := <-done; !errors.Is(err, billing.ErrOutcomeUnknown) {
					t.Fatalf("the old key's call, given up while its payment was on its way = %v, want ErrOutcomeUnknown", err)
				}
			} else {
				e.stopBefore(e.b, "cus_1", "pay", inv)
			}
			e.exec("UPDATE billonce_claims SET stripe_id = '', lease_until = now()")
			r, err := e.biller(oneAttempt, rotated).Invoice(context.Background(), "cus_1", period, inv)
			if late {
				close(landing.release)
				<-landing.landed
			}
			if err != nil {
				t.Fatalf("the rotated key's call = %v, want the invoice paid", err)
			}
			got := e.wantOneInvoice("cus_1", inv, "paid", 1)
			if got.Finalizations != 1 || r.StripeID != got.ID {
				t.Fatalf("invoice %s finalized %d times; receipt %+v", got.ID, got.Finalizations, r)
			}
		})
	}
}

// A day after a runner was killed with the invoice paid, whatever answers
// at Config.StripeURL with something that is not a list (an empty object,
// a search result: a gateway or mock that answers 200 to everything) has
// not said that the customer has no invoice with the claim's key. Taking
// it for an empty list reopens the draft's key; nothing is reopened, and
// the call fails. Once the URL is fixed the paid invoice is found: one
// invoice, paid once, counted at the fake.
func TestInvoiceListAnswerThatIsNotAListNeverReopensTheDraft(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{}`, `{"object":"search_result","data":[],"has_more":false,"url":"/v1/invoices/search"}`} {
		t.Run(body, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.killedAt("pay", inv)
			e.advance(25 * time.Hour)
			web, _ := countingServer(t, 200, "application/json", body)
			bad := e.biller(oneAttempt, func(cfg *billing.Config) { cfg.StripeURL = web.URL })
			if _, err := bad.Invoice(context.Background(), "cus_1", period, inv); err == nil {
				t.Fatalf("Invoice at a URL that answers %s to everything succeeded", body)
			}
			if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending || !c.ReconciledAt.IsZero() {
				t.Fatalf("claim after the wrong URL's answer: %s, window reopened at %v; want pending, not reopened", c.State, c.ReconciledAt)
			}
			if _, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv); err != nil {
				t.Fatal(err)
			}
			e.wantOneInvoice("cus_1", inv, "paid", 1)
		})
	}
}
