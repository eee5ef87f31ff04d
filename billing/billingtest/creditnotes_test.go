package billingtest_test

import (
	"net/http"
	"net/url"
	"testing"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"

	"github.com/billonce/billonce/billing/billingtest"
)

// finalized returns an invoice of customer with lines of amounts,
// finalized, and paid when pay is true.
func finalized(t *testing.T, api *client.API, customer string, pay bool, amounts ...int64) *stripe.Invoice {
	t.Helper()
	inv := newDraft(t, api, customer, amounts...)
	inv, err := api.Invoices.FinalizeInvoice(inv.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin-"+inv.ID))
	if err != nil {
		t.Fatal(err)
	}
	if pay {
		if inv, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-"+inv.ID)); err != nil {
			t.Fatal(err)
		}
	}
	return inv
}

func creditNote(inv string, amount int64, key string) *stripe.CreditNoteParams {
	p := &stripe.CreditNoteParams{Invoice: stripe.String(inv)}
	if amount > 0 {
		p.Amount = stripe.Int64(amount)
	}
	p.AddMetadata("billonce_period", "2026-09")
	p.SetIdempotencyKey(key)
	return p
}

// A paid invoice's credit notes send their totals to a refund, the
// customer's balance or outside Stripe, which must add up to each total,
// and together never credit more than the invoice's total.
func TestCreditNotesOfAPaidInvoice(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	inv := finalized(t, api, "cus_1", true, 600, 400)

	p := creditNote(inv.ID, 300, "cn1")
	p.RefundAmount = stripe.Int64(300)
	p.Reason = stripe.String("order_change")
	cn1, err := api.CreditNotes.New(p)
	if err != nil || cn1.Type != stripe.CreditNoteTypePostPayment || cn1.Total != 300 || cn1.Refund == nil || cn1.Status != "issued" {
		t.Fatalf("credit note with a refund = %+v, %v", cn1, err)
	}
	if again, err := api.CreditNotes.New(p); err != nil || again.ID != cn1.ID {
		t.Fatalf("replay = %+v, %v; want %s", again, err, cn1.ID)
	}
	// The second line, whole, to the customer's balance.
	p = &stripe.CreditNoteParams{Invoice: stripe.String(inv.ID), CreditAmount: stripe.Int64(400),
		Lines: []*stripe.CreditNoteLineParams{{Type: stripe.String("invoice_line_item"), InvoiceLineItem: stripe.String(inv.Lines.Data[1].ID)}}}
	p.SetIdempotencyKey("cn2")
	cn2, err := api.CreditNotes.New(p)
	if err != nil || cn2.Total != 400 || cn2.Lines == nil || len(cn2.Lines.Data) != 1 || cn2.Lines.Data[0].InvoiceLineItem != inv.Lines.Data[1].ID {
		t.Fatalf("credit note of a line = %+v, %v", cn2, err)
	}
	for _, bad := range []struct {
		name   string
		amount int64
		split  [3]int64
		param  string
	}{
		{"more than is left", 400, [3]int64{0, 0, 400}, "amount"},
		{"a split that does not add up", 100, [3]int64{50, 0, 0}, "refund_amount"},
		{"no split", 100, [3]int64{}, "refund_amount"},
		{"a refund over the payment", 300, [3]int64{301, 0, 0}, "refund_amount"},
	} {
		p := creditNote(inv.ID, bad.amount, "bad "+bad.name)
		p.RefundAmount, p.CreditAmount, p.OutOfBandAmount = stripe.Int64(bad.split[0]), stripe.Int64(bad.split[1]), stripe.Int64(bad.split[2])
		_, err := api.CreditNotes.New(p)
		if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Param != bad.param {
			t.Errorf("%s: %+v; want 400 on %s", bad.name, se, bad.param)
		}
	}
	p = creditNote(inv.ID, 300, "cn3")
	p.OutOfBandAmount = stripe.Int64(300)
	if _, err := api.CreditNotes.New(p); err != nil {
		t.Fatalf("credit note of what is left: %v", err)
	}
	if _, err := api.CreditNotes.New(creditNote(inv.ID, 1, "cn4")); err == nil {
		t.Fatal("a credit note beyond the invoice's total was made")
	}

	list := api.CreditNotes.List(&stripe.CreditNoteListParams{Invoice: stripe.String(inv.ID)})
	var totals []int64
	for list.Next() {
		totals = append(totals, list.CreditNote().Total)
	}
	if list.Err() != nil || len(totals) != 3 || totals[0] != 300 || totals[1] != 400 {
		t.Fatalf("listed %v, %v; want 300, 400, 300, newest first", totals, list.Err())
	}
	got, err := api.Invoices.Get(inv.ID, nil)
	if err != nil || got.PostPaymentCreditNotesAmount != 1000 || got.Status != "paid" {
		t.Fatalf("invoice = %+v, %v; want 1000 credited after payment", got, err)
	}
	notes, refunds := srv.Movements("credit_note"), srv.Movements("refund")
	if len(notes) != 3 || len(refunds) != 1 || refunds[0].Of != inv.ID || refunds[0].Amount != 300 || notes[0].Refund != refunds[0].ID ||
		notes[0].RefundAmount != 300 || notes[1].CreditAmount != 400 || notes[2].OutOfBandAmount != 300 || notes[0].IdempotencyKey != "cn1" {
		t.Fatalf("ledger: credit notes %+v, refunds %+v", notes, refunds)
	}
}

// An open invoice's credit note reduces what is due, never below nothing,
// and sends no money anywhere; once nothing is due the invoice is paid,
// with no payment.
func TestCreditNoteOfAnOpenInvoiceReducesWhatIsDue(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	inv := finalized(t, api, "cus_1", false, 1000)
	cn, err := api.CreditNotes.New(creditNote(inv.ID, 400, "cn1"))
	if err != nil || cn.Type != stripe.CreditNoteTypePrePayment {
		t.Fatalf("credit note = %+v, %v", cn, err)
	}
	if got, _ := api.Invoices.Get(inv.ID, nil); got.AmountDue != 600 || got.PrePaymentCreditNotesAmount != 400 || got.Status != "open" {
		t.Fatalf("invoice = due %d, credited %d, %s; want 600, 400, open", got.AmountDue, got.PrePaymentCreditNotesAmount, got.Status)
	}
	p := creditNote(inv.ID, 100, "cn2")
	p.RefundAmount = stripe.Int64(100)
	if _, err := api.CreditNotes.New(p); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("a refund from an open invoice's credit note was made")
	}
	if _, err := api.CreditNotes.New(creditNote(inv.ID, 601, "cn3")); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("a credit note beyond what is due was made")
	}
	if _, err := api.CreditNotes.New(creditNote(inv.ID, 600, "cn4")); err != nil {
		t.Fatal(err)
	}
	invs := srv.Invoices("cus_1")
	if len(invs) != 1 || invs[0].Status != "paid" || invs[0].Payments != 0 {
		t.Fatalf("invoice = %+v; want paid with no payment", invs)
	}
	if n := len(srv.Movements("refund")); n != 0 {
		t.Fatalf("%d refunds; want none", n)
	}
	if got := eventTypes(srv, inv.ID); got[len(got)-1] != "invoice.paid" {
		t.Fatalf("invoice events = %v; want invoice.paid last", got)
	}
}

// A draft or void invoice takes no credit note, and the refusal stores
// nothing under its key; neither does an invoice of another account.
func TestCreditNoteRefusedOnDraftAndVoidInvoices(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	draft := newDraft(t, api, "cus_1", 500)
	if _, err := api.CreditNotes.New(creditNote(draft.ID, 100, "cn1")); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("a draft took a credit note")
	}
	void := finalized(t, api, "cus_2", false, 500)
	if _, err := api.Invoices.VoidInvoice(void.ID, withKey(&stripe.InvoiceVoidInvoiceParams{}, "void")); err != nil {
		t.Fatal(err)
	}
	if _, err := api.CreditNotes.New(creditNote(void.ID, 100, "cn2")); stripeErr(t, err).HTTPStatusCode != 400 {
		t.Fatal("a void invoice took a credit note")
	}
	if _, err := api.Invoices.FinalizeInvoice(draft.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin")); err != nil {
		t.Fatal(err)
	}
	if cn, err := api.CreditNotes.New(creditNote(draft.ID, 100, "cn1")); err != nil || cn.Total != 100 {
		t.Fatalf("the first key once the invoice is open = %+v, %v; want a credit note", cn, err)
	}
	acct := srv.CreateAccount()
	resp, body := doAs(t, srv, acct, http.MethodPost, "/v1/credit_notes", "cn3", url.Values{"invoice": {draft.ID}, "amount": {"100"}})
	if e := errorOf(body); resp.StatusCode != 404 || e.Code != "resource_missing" {
		t.Fatalf("credit note on another account: %d %s; want 404", resp.StatusCode, body)
	}
	for _, bad := range []url.Values{
		{"amount": {"100"}},
		{"invoice": {draft.ID}},
		{"invoice": {draft.ID}, "amount": {"100"}, "lines[0][type]": {"custom_line_item"}, "lines[0][unit_amount]": {"100"}},
		{"invoice": {draft.ID}, "lines[0][type]": {"invoice_line_item"}},
		{"invoice": {draft.ID}, "lines[0][type]": {"custom_line_item"}, "lines[0][unit_amount]": {"100"}, "lines[0][tax_rates]": {"txr_1"}},
		{"invoice": {draft.ID}, "amount": {"100"}, "reason": {"because"}},
	} {
		resp, body := do(t, srv, http.MethodPost, "/v1/credit_notes", "bad "+bad.Encode(), bad)
		if e := errorOf(body); resp.StatusCode != 400 || e.Param == "" {
			t.Errorf("credit note %v: %d %s; want 400 naming the parameter", bad, resp.StatusCode, body)
		}
	}
	if n := len(srv.Movements("credit_note")); n != 1 {
		t.Fatalf("%d credit notes; want 1", n)
	}
}
