package billing_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// refundsOf returns the refunds the fake holds of payment id, failed ones
// included.
func refundsOf(e *env, id string) []billingtest.Movement {
	var out []billingtest.Movement
	for _, m := range e.srv.Movements("refund") {
		if m.Of == id {
			out = append(out, m)
		}
	}
	return out
}

// refunded is what the fake holds as refunded of payment id: its refunds
// that did not fail or get canceled.
func refunded(e *env, id string) int64 {
	var sum int64
	for _, m := range refundsOf(e, id) {
		if m.Status != "failed" && m.Status != "canceled" {
			sum += m.Amount
		}
	}
	return sum
}

// paidFor charges customer for the period and returns the payment's id.
func paidFor(t *testing.T, e *env, customer string) string {
	t.Helper()
	r, err := e.b.Charge(context.Background(), customer, period, nil)
	wantHow(t, r, err, billing.Created)
	return r.StripeID
}

// refundPosts counts the refund requests the fake saw.
func refundPosts(e *env) int {
	n := 0
	for _, l := range e.srv.Log() {
		if l.Method == "POST" && l.Path == "/v1/refunds" {
			n++
		}
	}
	return n
}

func TestRefundIsMadeOncePerRefundID(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, func(c *billing.Config) { c.API = api })
			pay := paidFor(t, e, "cus_r")
			ctx := context.Background()
			r, err := e.b.Refund(ctx, "cus_r", period, "rma-1", 1000)
			wantHow(t, r, err, billing.Created)
			if !strings.HasPrefix(r.StripeID, "re_") || r.Amount != 1000 || r.Currency != "usd" || r.Period != period+" refund rma-1" {
				t.Fatalf("receipt %+v", r)
			}
			for range 3 {
				again, err := e.b.Refund(ctx, "cus_r", period, "rma-1", 1000)
				wantHow(t, again, err, billing.AlreadyBilled)
				if again.StripeID != r.StripeID {
					t.Fatalf("again: %+v, want refund %s", again, r.StripeID)
				}
			}
			// Another replica, the same refund id: the same refund.
			again, err := e.biller(func(c *billing.Config) { c.API = api }).Refund(ctx, "cus_r", period, "rma-1", 1000)
			wantHow(t, again, err, billing.AlreadyBilled)
			// Another id of the same amount is another refund.
			r2, err := e.b.Refund(ctx, "cus_r", period, "rma-2", 1000)
			wantHow(t, r2, err, billing.Created)
			if got := refundsOf(e, pay); len(got) != 2 || refunded(e, pay) != 2000 {
				t.Fatalf("Stripe holds refunds %+v of %s, want two of 1000", got, pay)
			}
			for _, m := range refundsOf(e, pay) {
				if m.Metadata[billing.MetaKey] == "" || m.IdempotencyKey != m.Metadata[billing.MetaKey] {
					t.Fatalf("refund %s carries key %q and metadata %v", m.ID, m.IdempotencyKey, m.Metadata)
				}
			}
			// The same id with another amount is refused, never refunded.
			_, err = e.b.Refund(ctx, "cus_r", period, "rma-1", 500)
			var m *claim.MismatchError
			if !errors.As(err, &m) || m.Field != "amount" {
				t.Fatalf("rma-1 for another amount: %v, want a mismatch on amount", err)
			}
			wantCount(t, e, "cus_r", 1)
			if got := len(refundsOf(e, pay)); got != 2 {
				t.Fatalf("Stripe holds %d refunds, want 2", got)
			}
		})
	}
}

func TestRefundOfMoreThanIsLeftIsInvalidBeforeAnythingIsSent(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_l")
	ctx := context.Background()
	r, err := e.b.Refund(ctx, "cus_l", period, "a", 2000)
	wantHow(t, r, err, billing.Created)
	posts := refundPosts(e)
	_, err = e.b.Refund(ctx, "cus_l", period, "b", 501)
	if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), "500 usd left") {
		t.Fatalf("refund past the payment: %v, want ErrInvalid saying 500 usd are left", err)
	}
	if refundPosts(e) != posts {
		t.Fatal("a refund of more than is left was sent")
	}
	r, err = e.b.Refund(ctx, "cus_l", period, "b", 500)
	wantHow(t, r, err, billing.Created)
	if refunded(e, pay) != amount {
		t.Fatalf("Stripe holds %d refunded, want %d", refunded(e, pay), amount)
	}
}

func TestRefundOfBadInputOrAPeriodNotPaidIsInvalidAndSendsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	paidFor(t, e, "cus_p")
	e.srv.Decline("cus_d", "card_declined")
	if _, err := e.b.Charge(context.Background(), "cus_d", period, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("declined charge: %v", err)
	}
	for _, c := range []struct {
		name, customer, period, id string
		amount                     int64
		want                       string
	}{
		{"empty refund id", "cus_p", period, "", 100, "refund ID is empty"},
		{"refund id with a space", "cus_p", period, "rma 1", 100, "white space"},
		{"refund id too long", "cus_p", period, strings.Repeat("r", 201), 100, "the limit is 200"},
		{"zero amount", "cus_p", period, "z", 0, "must be a positive number"},
		{"negative amount", "cus_p", period, "n", -5, "must be a positive number"},
		{"malformed period", "cus_p", "2026-9", "p", 100, "use a month like 2026-09"},
		{"empty customer", "", period, "c", 100, "customer ID is empty"},
		{"never billed", "cus_never", period, "x", 100, "has no payment to refund: no payment of it succeeded"},
		{"declined period", "cus_d", period, "x", 100, "has no payment to refund"},
		{"period not billed", "cus_p", "2026-10", "x", 100, "has no payment to refund"},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.b.Refund(context.Background(), c.customer, c.period, c.id, c.amount)
			var ce *billing.ChargeError
			if !errors.Is(err, billing.ErrInvalid) || !errors.As(err, &ce) || !strings.Contains(err.Error(), c.want) {
				t.Fatalf("Refund: %v, want ErrInvalid saying %q", err, c.want)
			}
		})
	}
	if n := refundPosts(e); n != 0 || len(e.srv.Movements("refund")) != 0 {
		t.Fatalf("%d refund requests sent for bad input", n)
	}
}

// An answer lost after Stripe refunded: the retry with the refund's key is
// Stripe's replay, and the refund exists once.
func TestRefundWhoseAnswerIsLostIsMadeOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_c")
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/refunds"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := e.b.Refund(context.Background(), "cus_c", period, "rma-9", 700)
	wantHow(t, r, err, billing.Replayed)
	if got := refundsOf(e, pay); len(got) != 1 || got[0].ID != r.StripeID || got[0].Amount != 700 {
		t.Fatalf("Stripe holds %+v, want the one refund %s", got, r.StripeID)
	}
}

// A refund left pending with an unknown outcome, found again past
// Stripe's key window: listing the payment's refunds finds it when it
// exists (it is not sent again), and when it does not the key is sent.
func TestRefundPastTheKeyWindowIsFoundByListingThePaymentsRefunds(t *testing.T) {
	t.Parallel()
	// unknown leaves a refund claim pending, its key never answered, and
	// returns its key.
	unknown := func(t *testing.T, e *env, kind billingtest.FaultKind) string {
		t.Helper()
		b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
		e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/refunds"}, billingtest.Fault{Kind: kind})
		// The listing before the first send finds nothing; the one lookup
		// after an unknown outcome fails.
		e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/refunds"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
		_, err := b.Refund(context.Background(), "cus_w", period, "late", 900)
		var ce *billing.ChargeError
		if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) {
			t.Fatalf("refund with its answer lost: %v, want ErrOutcomeUnknown", err)
		}
		e.ageClaim(ce.Key, 25*time.Hour)
		e.srv.Advance(25 * time.Hour)
		return ce.Key
	}
	t.Run("refunded: found, not sent again", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pay := paidFor(t, e, "cus_w")
		key := unknown(t, e, billingtest.FaultCut)
		posts := refundPosts(e)
		r, err := e.b.Refund(context.Background(), "cus_w", period, "late", 900)
		wantHow(t, r, err, billing.Reconciled)
		if got := refundsOf(e, pay); len(got) != 1 || got[0].ID != r.StripeID || r.Key.String() != key {
			t.Fatalf("Stripe holds %+v; receipt %+v", got, r)
		}
		if refundPosts(e) != posts {
			t.Fatal("the refund's key was sent again past the window although the refund exists")
		}
	})
	t.Run("not refunded: sent again with its key", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pay := paidFor(t, e, "cus_w")
		key := unknown(t, e, billingtest.FaultErrorBefore)
		r, err := e.b.Refund(context.Background(), "cus_w", period, "late", 900)
		wantHow(t, r, err, billing.Created)
		if got := refundsOf(e, pay); len(got) != 1 || got[0].IdempotencyKey != key {
			t.Fatalf("Stripe holds %+v, want one refund with key %s", got, key)
		}
	})
	t.Run("by Reconcile", func(t *testing.T) {
		t.Parallel()
		e := newEnv(t)
		pay := paidFor(t, e, "cus_w")
		unknown(t, e, billingtest.FaultCut)
		sum, err := e.b.Reconcile(context.Background(), nil)
		if err != nil || sum.AlreadyBilled != 1 {
			t.Fatalf("Reconcile = %+v, %v; want the refund reconciled", sum, err)
		}
		if got := refundsOf(e, pay); len(got) != 1 {
			t.Fatalf("Stripe holds %+v, want one refund", got)
		}
	})
}

// A refund Stripe answers pending is processing until its event settles
// it; one that fails later is reported, and is refunded again only under
// a new id.
func TestPendingRefundSettlesByItsEventAndAFailureIsReported(t *testing.T) {
	t.Parallel()
	for _, fail := range []bool{false, true} {
		t.Run(fmt.Sprintf("fails=%v", fail), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.Charges, nil)
			pay := paidFor(t, h.env, "cus_a")
			code := ""
			if fail {
				code = "expired_or_canceled_card"
			}
			h.srv.SettleLater("cus_a", billingtest.Async{After: time.Hour, FailureCode: code})
			ctx := context.Background()
			r, err := h.b.Refund(ctx, "cus_a", period, "rma-p", 1200)
			wantHow(t, r, err, billing.Created)
			if !r.Processing {
				t.Fatalf("receipt %+v, want Processing", r)
			}
			again, err := h.b.Refund(ctx, "cus_a", period, "rma-p", 1200)
			wantHow(t, again, err, billing.AlreadyBilled)
			if !again.Processing {
				t.Fatalf("again: %+v, want Processing", again)
			}
			h.srv.Advance(2 * time.Hour)
			h.srv.SettleNow()
			h.deliverAll()
			c, err := h.store.Get(ctx, r.Key.String())
			if err != nil {
				t.Fatal(err)
			}
			if !fail {
				if c.State != claim.StateSucceeded {
					t.Fatalf("refund claim %+v, want succeeded", c)
				}
				done, err := h.b.Refund(ctx, "cus_a", period, "rma-p", 1200)
				wantHow(t, done, err, billing.AlreadyBilled)
				if done.Processing || refunded(h.env, pay) != 1200 {
					t.Fatalf("after settling: %+v, %d refunded", done, refunded(h.env, pay))
				}
				return
			}
			if c.State != claim.StateFailed || c.FailureCode != code {
				t.Fatalf("refund claim %+v, want failed with %s", c, code)
			}
			var reported bool
			for _, ev := range h.observed() {
				reported = reported || ev.Kind == billing.EventSettled && ev.Key == r.Key.String() && errors.Is(ev.Err, billing.ErrDeclined)
			}
			if !reported {
				t.Fatalf("the failed refund was not reported: %+v", h.observed())
			}
			_, err = h.b.Refund(ctx, "cus_a", period, "rma-p", 1200)
			if !errors.Is(err, billing.ErrDeclined) || !strings.Contains(err.Error(), "new refund ID") {
				t.Fatalf("refund again after it failed: %v, want ErrDeclined saying to use a new refund ID", err)
			}
			h.srv.Honor("cus_a")
			r2, err := h.b.Refund(ctx, "cus_a", period, "rma-p2", 2500)
			wantHow(t, r2, err, billing.Created)
			if refunded(h.env, pay) != 2500 || len(refundsOf(h.env, pay)) != 2 {
				t.Fatalf("Stripe holds %+v", refundsOf(h.env, pay))
			}
		})
	}
}

// Part of the payment refunded in the dashboard: Stripe refuses a refund
// of more than it holds as left, the refund's claim fails with what to
// do, and nothing more is refunded.
func TestRefundAfterADashboardRefundIsRefusedByStripeAndFailsItsClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_h")
	if err := e.srv.Refund(pay, 2000); err != nil {
		t.Fatal(err)
	}
	_, err := e.b.Refund(context.Background(), "cus_h", period, "rma-h", 1000)
	if !errors.Is(err, billing.ErrDeclined) || !strings.Contains(err.Error(), "refunded outside billonce") {
		t.Fatalf("refund past what Stripe holds: %v, want ErrDeclined saying the payment was refunded outside billonce", err)
	}
	if refunded(e, pay) != 2000 {
		t.Fatalf("Stripe holds %d refunded, want the dashboard's 2000", refunded(e, pay))
	}
	// Its amount is free again: what is left can be refunded.
	r, err := e.b.Refund(context.Background(), "cus_h", period, "rma-h2", 500)
	wantHow(t, r, err, billing.Created)
}

// Refunds of one payment from many replicas at once, each a Biller of its
// own: Stripe never holds more refunded than the payment.
func TestConcurrentRefundsFromReplicasNeverAddUpToMoreThanThePayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	pay := paidFor(t, e, "cus_x")
	const n = 12
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created, invalid int
	start := make(chan struct{})
	for i := range n {
		b := e.biller()
		wg.Go(func() {
			<-start
			_, err := b.Refund(context.Background(), "cus_x", period, fmt.Sprintf("r%d", i), 1000)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil:
				created++
			case errors.Is(err, billing.ErrInvalid):
				invalid++
			default:
				t.Errorf("refund %d: %v", i, err)
			}
		})
	}
	close(start)
	wg.Wait()
	if created != 2 || invalid != n-2 || refunded(e, pay) != 2000 {
		t.Fatalf("%d refunded, %d refused, Stripe holds %d refunded; want 2, %d and 2000", created, invalid, refunded(e, pay), n-2)
	}
}

// creditNotesOf returns the credit notes the fake holds of invoice id.
func creditNotesOf(e *env, id string) []billingtest.Movement {
	var out []billingtest.Movement
	for _, m := range e.srv.Movements("credit_note") {
		if m.Of == id {
			out = append(out, m)
		}
	}
	return out
}

// A period billed by invoice is refunded by a credit note of the invoice,
// once per refund id, by the same rules.
func TestRefundOfAnInvoiceIsACreditNoteMadeOncePerRefundID(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inv, err := e.b.Invoice(ctx, "cus_i", period, &billing.Invoice{Currency: "usd",
		Lines: []billing.InvoiceLine{{Description: "Team plan", Amount: 4000}, {Description: "Seats", Amount: 1000}}})
	wantHow(t, inv, err, billing.Created)
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/credit_notes"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := e.b.Refund(ctx, "cus_i", period, "cn-1", 1500)
	wantHow(t, r, err, billing.Replayed)
	if !strings.HasPrefix(r.StripeID, "cn_") {
		t.Fatalf("receipt %+v, want a credit note", r)
	}
	again, err := e.b.Refund(ctx, "cus_i", period, "cn-1", 1500)
	wantHow(t, again, err, billing.AlreadyBilled)
	r2, err := e.b.Refund(ctx, "cus_i", period, "cn-2", 1500)
	wantHow(t, r2, err, billing.Created)
	_, err = e.b.Refund(ctx, "cus_i", period, "cn-3", 2001)
	if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), "2000 usd left") {
		t.Fatalf("credit past the invoice: %v, want ErrInvalid saying 2000 usd are left", err)
	}
	notes := creditNotesOf(e, inv.StripeID)
	if len(notes) != 2 || notes[0].RefundAmount != 1500 || notes[1].RefundAmount != 1500 {
		t.Fatalf("Stripe holds credit notes %+v of %s, want two refunding 1500 each", notes, inv.StripeID)
	}
	if got := refundsOf(e, inv.StripeID); len(got) != 2 {
		t.Fatalf("Stripe holds refunds %+v of the invoice's payment, want two", got)
	}
}

// A credit note whose answer was lost and whose key Stripe forgot is found
// by listing the invoice's credit notes, not made again.
func TestCreditNotePastTheKeyWindowIsFoundByListingTheInvoicesCreditNotes(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inv, err := e.b.Invoice(ctx, "cus_j", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Description: "Plan", Amount: 3000}}})
	wantHow(t, inv, err, billing.Created)
	b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/credit_notes"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/credit_notes"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore}) // the listing before the send passes, the one after the lost answer fails
	_, err = b.Refund(ctx, "cus_j", period, "late", 1000)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) {
		t.Fatalf("credit note with its answer lost: %v, want ErrOutcomeUnknown", err)
	}
	e.ageClaim(ce.Key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	r, err := e.b.Refund(ctx, "cus_j", period, "late", 1000)
	wantHow(t, r, err, billing.Reconciled)
	if notes := creditNotesOf(e, inv.StripeID); len(notes) != 1 || notes[0].ID != r.StripeID {
		t.Fatalf("Stripe holds %+v, want the one credit note %s", notes, r.StripeID)
	}
}
