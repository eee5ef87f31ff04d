package billingtest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

func draftParams(customer, period, key string) *stripe.InvoiceParams {
	p := &stripe.InvoiceParams{Customer: stripe.String(customer), AutoAdvance: stripe.Bool(false)}
	p.AddMetadata("billonce_period", period)
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func itemParams(customer, invoice string, amount int64, line, key string) *stripe.InvoiceItemParams {
	p := &stripe.InvoiceItemParams{Customer: stripe.String(customer), Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
	if invoice != "" {
		p.Invoice = stripe.String(invoice)
	}
	if line != "" {
		p.AddMetadata("billonce_line", line)
	}
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func withKey[P interface{ SetIdempotencyKey(string) }](p P, key string) P {
	p.SetIdempotencyKey(key)
	return p
}

// newDraft creates a draft for customer with lines of the given amounts.
func newDraft(t *testing.T, api *client.API, customer string, amounts ...int64) *stripe.Invoice {
	t.Helper()
	inv, err := api.Invoices.New(draftParams(customer, "2026-09", ""))
	if err != nil {
		t.Fatal(err)
	}
	for i, a := range amounts {
		if _, err := api.InvoiceItems.New(itemParams(customer, inv.ID, a, fmt.Sprint(i), "")); err != nil {
			t.Fatal(err)
		}
	}
	return inv
}

func eventTypes(srv *billingtest.Server, id string) []string {
	var out []string
	for _, e := range srv.Events() {
		if e.ObjectID == id {
			out = append(out, e.Type)
		}
	}
	return out
}

func TestInvoiceDraftLinesFinalizePay(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	pending := srv.AddPendingItem("cus_1", 999, "usd")

	inv, err := api.Invoices.New(draftParams("cus_1", "2026-09", "inv-k"))
	if err != nil {
		t.Fatal(err)
	}
	if inv.Status != "draft" || inv.AmountDue != 0 || inv.Number != "" || inv.Customer.ID != "cus_1" ||
		inv.CollectionMethod != "charge_automatically" || inv.Metadata["billonce_period"] != "2026-09" || len(inv.Lines.Data) != 0 {
		t.Fatalf("draft = %+v; want an empty draft without the pending item", inv)
	}
	var items []string
	for i, a := range []int64{1000, 250} {
		it, err := api.InvoiceItems.New(itemParams("cus_1", inv.ID, a, fmt.Sprint(i), fmt.Sprint("item-k", i)))
		if err != nil {
			t.Fatal(err)
		}
		if it.Invoice.ID != inv.ID || it.Amount != a || it.Metadata["billonce_line"] != fmt.Sprint(i) {
			t.Fatalf("item = %+v", it)
		}
		items = append(items, it.ID)
	}
	fin, err := api.Invoices.FinalizeInvoice(inv.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin-k"))
	if err != nil {
		t.Fatal(err)
	}
	if fin.Status != "open" || fin.AmountDue != 1250 || fin.Number == "" || len(fin.Lines.Data) != 2 ||
		fin.Lines.Data[0].InvoiceItem.ID != items[0] || fin.Lines.Data[0].Type != "invoiceitem" {
		t.Fatalf("finalized = %+v", fin)
	}
	_, err = api.Invoices.FinalizeInvoice(inv.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin-k2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeInvalidRequest {
		t.Fatalf("second finalize: %+v; want 400", se)
	}
	_, err = api.InvoiceItems.New(itemParams("cus_1", inv.ID, 5, "late", "item-late"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Code != stripe.ErrorCodeInvoiceNotEditable || se.Param != "invoice" {
		t.Fatalf("item on an open invoice: %+v; want 400 invoice_not_editable", se)
	}
	paid, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-k"))
	if err != nil || paid.Status != "paid" || paid.AmountPaid != 1250 || !paid.Paid {
		t.Fatalf("pay = %+v, %v", paid, err)
	}
	_, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-k2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Msg != "Invoice is already paid" {
		t.Fatalf("second pay: %+v; want 400 Invoice is already paid", se)
	}

	got := srv.Invoices("cus_1")
	if len(got) != 1 || got[0].Status != "paid" || got[0].Finalizations != 1 || got[0].Payments != 1 || len(got[0].Lines) != 2 ||
		got[0].Lines[1].Amount != 250 || got[0].Lines[1].Metadata["billonce_line"] != "1" || got[0].Lines[1].Item != items[1] {
		t.Fatalf("ledger = %+v", got)
	}
	if types := eventTypes(srv, inv.ID); !slices.Equal(types, []string{"invoice.created", "invoice.finalized", "invoice.paid"}) {
		t.Fatalf("events = %v", types)
	}
	var ev struct {
		Data struct {
			Object struct{ ID, Object, Status string }
		}
	}
	evs := srv.Events()
	if err := json.Unmarshal(evs[len(evs)-1].Body, &ev); err != nil || ev.Data.Object.ID != inv.ID || ev.Data.Object.Status != "paid" {
		t.Fatalf("invoice.paid carries %+v, %v; want the paid invoice", ev.Data.Object, err)
	}
	// The pending item stayed pending: a draft that includes pending items
	// takes it.
	//idemvet:ignore a state rule of the fake is tested, not a retry
	swept, err := api.Invoices.New(&stripe.InvoiceParams{Customer: stripe.String("cus_1"), PendingInvoiceItemsBehavior: stripe.String("include")})
	if err != nil || len(swept.Lines.Data) != 1 || swept.Lines.Data[0].InvoiceItem.ID != pending || swept.AmountDue != 999 {
		t.Fatalf("draft with include = %+v, %v; want the pending item %s", swept, err, pending)
	}
}

func TestInvoiceStateRules(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	draft := newDraft(t, api, "cus_1", 100)

	refused := func(what string, err error, status int) {
		t.Helper()
		if se := stripeErr(t, err); se.HTTPStatusCode != status {
			t.Fatalf("%s: %+v; want %d", what, se, status)
		}
	}
	_, err := api.InvoiceItems.New(itemParams("cus_2", draft.ID, 100, "", ""))
	refused("item for another customer's invoice", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.Pay(draft.ID, nil)
	refused("pay a draft", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.VoidInvoice(draft.ID, nil)
	refused("void a draft", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.SendInvoice(draft.ID, nil)
	refused("send a draft", err, 400)

	//idemvet:ignore a state rule of the fake is tested, not a retry
	if _, err := api.Invoices.FinalizeInvoice(draft.ID, &stripe.InvoiceFinalizeInvoiceParams{AutoAdvance: stripe.Bool(true)}); err != nil {
		t.Fatal(err)
	}
	_, err = api.Invoices.Del(draft.ID, nil)
	refused("delete an open invoice", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if u, err := api.Invoices.Update(draft.ID, &stripe.InvoiceParams{AutoAdvance: stripe.Bool(false)}); err != nil || u.AutoAdvance || u.Status != "open" {
		t.Fatalf("auto_advance off on an open invoice = %+v, %v", u, err)
	}
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.Update(draft.ID, &stripe.InvoiceParams{Description: stripe.String("other")})
	refused("update anything but auto_advance", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if v, err := api.Invoices.VoidInvoice(draft.ID, nil); err != nil || v.Status != "void" {
		t.Fatalf("void = %+v, %v", v, err)
	}
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.Pay(draft.ID, nil)
	refused("pay a void invoice", err, 400)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.Update(draft.ID, &stripe.InvoiceParams{AutoAdvance: stripe.Bool(true)})
	refused("auto_advance on a void invoice", err, 400)

	other := newDraft(t, api, "cus_1", 100)
	if d, err := api.Invoices.Del(other.ID, nil); err != nil || !d.Deleted {
		t.Fatalf("delete draft = %+v, %v", d, err)
	}
	_, err = api.Invoices.Get(other.ID, nil)
	refused("get a deleted draft", err, 404)

	send := &stripe.InvoiceParams{Customer: stripe.String("cus_3"), CollectionMethod: stripe.String("send_invoice")}
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = api.Invoices.New(send)
	refused("send_invoice without days_until_due", err, 400)
	send.DaysUntilDue = stripe.Int64(30)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	inv, err := api.Invoices.New(send)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.InvoiceItems.New(itemParams("cus_3", inv.ID, 700, "", "")); err != nil {
		t.Fatal(err)
	}
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if _, err := api.Invoices.FinalizeInvoice(inv.ID, nil); err != nil {
		t.Fatal(err)
	}
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if s, err := api.Invoices.SendInvoice(inv.ID, nil); err != nil || s.Status != "open" || s.DueDate == 0 {
		t.Fatalf("send = %+v, %v; want still open with a due date", s, err)
	}
	zero := newDraft(t, api, "cus_4")
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if z, err := api.Invoices.FinalizeInvoice(zero.ID, nil); err != nil || z.Status != "paid" {
		t.Fatalf("finalize with nothing due = %+v, %v; want paid", z, err)
	}

	byCust := map[string][]string{}
	for _, inv := range srv.Invoices("") {
		byCust[inv.Customer] = append(byCust[inv.Customer], fmt.Sprintf("%s/%v", inv.Status, inv.Sent))
	}
	if want := map[string][]string{"cus_1": {"void/false"}, "cus_3": {"open/true"}, "cus_4": {"paid/false"}}; fmt.Sprint(byCust) != fmt.Sprint(want) {
		t.Fatalf("ledger = %v; want %v (the deleted draft left out)", byCust, want)
	}
	if types := eventTypes(srv, zero.ID); !slices.Equal(types, []string{"invoice.created", "invoice.finalized", "invoice.paid"}) {
		t.Fatalf("events of the zero invoice = %v", types)
	}
	if types := eventTypes(srv, draft.ID); types[len(types)-1] != "invoice.voided" {
		t.Fatalf("events of the voided invoice = %v", types)
	}
}

func TestInvoicePayDeclineLeavesItOpen(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	api := newAPI(t, srv, testKey, nil)
	inv := newDraft(t, api, "cus_d", 500)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if _, err := api.Invoices.FinalizeInvoice(inv.ID, nil); err != nil {
		t.Fatal(err)
	}
	_, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-1"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 402 || se.Type != stripe.ErrorTypeCard || se.DeclineCode != "insufficient_funds" {
		t.Fatalf("pay: %+v; want 402 card_error insufficient_funds", se)
	}
	// The same key replays the decline even once the card works.
	srv.Honor("cus_d")
	_, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-1"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 402 {
		t.Fatalf("replayed pay: %+v; want the stored 402", se)
	}
	if got, _ := api.Invoices.Get(inv.ID, nil); got.Status != "open" || got.AttemptCount != 1 {
		t.Fatalf("after the decline: %+v; want open with one attempt", got)
	}
	srv.FailNext(billingtest.Match{Path: "/v1/invoices/" + inv.ID + "/pay", Customer: "cus_d"}, billingtest.Fault{Kind: billingtest.FaultDecline})
	_, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 402 || se.DeclineCode != "generic_decline" {
		t.Fatalf("FaultDecline: %+v; want 402 generic_decline", se)
	}
	if paid, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-3")); err != nil || paid.Status != "paid" {
		t.Fatalf("pay with a new key = %+v, %v", paid, err)
	}
	if got := srv.Invoices("cus_d"); got[0].Payments != 1 {
		t.Fatalf("Payments = %d; want 1", got[0].Payments)
	}
	want := []string{"invoice.created", "invoice.finalized", "invoice.payment_failed", "invoice.payment_failed", "invoice.paid"}
	if types := eventTypes(srv, inv.ID); !slices.Equal(types, want) {
		t.Fatalf("events = %v; want %v", types, want)
	}
}

func TestInvoiceWritesAreIdempotent(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	replayed := func(what string, lr *stripe.APIResponse) {
		t.Helper()
		if lr.Header.Get("Idempotent-Replayed") != "true" {
			t.Fatalf("%s: not replayed", what)
		}
	}
	mismatch := func(what string, err error) {
		t.Helper()
		if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Type != stripe.ErrorTypeIdempotency {
			t.Fatalf("%s: %+v; want idempotency_error", what, se)
		}
	}

	inv, err := api.Invoices.New(draftParams("cus_1", "2026-09", "inv"))
	if err != nil {
		t.Fatal(err)
	}
	again, err := api.Invoices.New(draftParams("cus_1", "2026-09", "inv"))
	if err != nil || again.ID != inv.ID {
		t.Fatalf("replayed create = %v, %v; want %s", again.ID, err, inv.ID)
	}
	replayed("create", again.LastResponse)
	_, err = api.Invoices.New(draftParams("cus_1", "2026-10", "inv"))
	mismatch("create with another period", err)

	it, err := api.InvoiceItems.New(itemParams("cus_1", inv.ID, 100, "0", "line-0"))
	if err != nil {
		t.Fatal(err)
	}
	it2, err := api.InvoiceItems.New(itemParams("cus_1", inv.ID, 100, "0", "line-0"))
	if err != nil || it2.ID != it.ID {
		t.Fatalf("replayed item = %v, %v", it2.ID, err)
	}
	replayed("item", it2.LastResponse)
	_, err = api.InvoiceItems.New(itemParams("cus_1", inv.ID, 101, "0", "line-0"))
	mismatch("item with another amount", err)

	// Finalize answers 500 after finalizing: the key replays the 500, and
	// the invoice is finalized once.
	srv.FailNext(billingtest.Match{IdempotencyKey: "fin"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	for range 2 {
		_, err = api.Invoices.FinalizeInvoice(inv.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin"))
		if se := stripeErr(t, err); se.HTTPStatusCode != 500 {
			t.Fatalf("finalize after FaultErrorAfter: %+v; want the stored 500", se)
		}
	}
	fp := withKey(&stripe.InvoiceFinalizeInvoiceParams{AutoAdvance: stripe.Bool(true)}, "fin")
	_, err = api.Invoices.FinalizeInvoice(inv.ID, fp)
	mismatch("finalize with other params", err)

	srv.FailNext(billingtest.Match{IdempotencyKey: "pay"}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay")); err == nil {
		t.Fatal("pay with FaultCut: no error")
	}
	p, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay"))
	if err != nil || p.Status != "paid" {
		t.Fatalf("pay retried with its key = %+v, %v", p, err)
	}
	replayed("pay", p.LastResponse)
	_, err = api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{PaidOutOfBand: stripe.Bool(true)}, "pay"))
	mismatch("pay with other params", err)
	_, err = api.Invoices.VoidInvoice(inv.ID, withKey(&stripe.InvoiceVoidInvoiceParams{}, "pay"))
	mismatch("the pay key on void", err)

	// FaultErrorBefore stores nothing: the same key then executes.
	srv.FailNext(billingtest.Match{IdempotencyKey: "inv2"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := api.Invoices.New(draftParams("cus_2", "2026-09", "inv2")); err == nil {
		t.Fatal("FaultErrorBefore: no error")
	}
	if n := len(srv.Invoices("cus_2")); n != 0 {
		t.Fatalf("%d invoices after FaultErrorBefore; want 0", n)
	}
	if _, err := api.Invoices.New(draftParams("cus_2", "2026-09", "inv2")); err != nil {
		t.Fatal(err)
	}

	got := srv.Invoices("")
	if len(got) != 2 || got[0].Finalizations != 1 || got[0].Payments != 1 || len(got[0].Lines) != 1 {
		t.Fatalf("ledger = %+v; want one invoice finalized and paid once with one line, and cus_2's draft", got)
	}
	var writes int
	for _, e := range srv.Log() {
		if e.Method == http.MethodPost && e.Customer == "cus_1" {
			writes++
		}
	}
	if writes != 13 {
		t.Fatalf("log: %d POSTs for cus_1; want 13, each logged with the invoice's customer", writes)
	}
}

func TestInvoiceSearchAfterTheDelay(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{SearchDelay: time.Minute})
	api := newAPI(t, srv, testKey, nil)
	inv := newDraft(t, api, "cus_1", 100)
	newDraft(t, api, "cus_2", 100)

	search := func() []string {
		t.Helper()
		var ids []string
		it := api.Invoices.Search(&stripe.InvoiceSearchParams{SearchParams: stripe.SearchParams{
			Query: "metadata['billonce_period']:'2026-09' AND customer:'cus_1'"}})
		for it.Next() {
			ids = append(ids, it.Invoice().ID)
		}
		if it.Err() != nil {
			t.Fatal(it.Err())
		}
		return ids
	}
	if ids := search(); len(ids) != 0 {
		t.Fatalf("search at once = %v; want nothing yet", ids)
	}
	srv.Advance(time.Minute)
	if ids := search(); !slices.Equal(ids, []string{inv.ID}) {
		t.Fatalf("search after the delay = %v; want [%s]", ids, inv.ID)
	}
	// Charges wait for the index too.
	if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "")); err != nil {
		t.Fatal(err)
	}
	it := api.Charges.Search(&stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: "customer:'cus_1'"}})
	if it.Next() {
		t.Fatal("a charge searchable before the delay")
	}
}

func TestInvoiceLinesPage(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	amounts := make([]int64, 25)
	for i := range amounts {
		amounts[i] = int64(i + 1)
	}
	inv := newDraft(t, api, "cus_1", amounts...)

	resp, body := do(t, srv, http.MethodGet, "/v1/invoices/"+inv.ID+"/lines", "", url.Values{"limit": {"10"}})
	var page struct {
		Object  string
		HasMore bool `json:"has_more"`
		Data    []struct{ ID string }
	}
	if err := json.Unmarshal(body, &page); err != nil || resp.StatusCode != 200 || page.Object != "list" || !page.HasMore || len(page.Data) != 10 {
		t.Fatalf("first page: %d %s", resp.StatusCode, body)
	}
	p := &stripe.InvoiceListLinesParams{Invoice: stripe.String(inv.ID)}
	p.Limit = stripe.Int64(10)
	var got []int64
	for it := api.Invoices.ListLines(p); it.Next(); {
		l := it.InvoiceLineItem()
		if l.Object != "line_item" || l.InvoiceItem == nil || l.Metadata["billonce_line"] != fmt.Sprint(len(got)) {
			t.Fatalf("line = %+v", l)
		}
		got = append(got, l.Amount)
	}
	if !slices.Equal(got, amounts) {
		t.Fatalf("lines = %v; want %v, in the order added", got, amounts)
	}
	full, err := api.Invoices.Get(inv.ID, nil)
	if err != nil || len(full.Lines.Data) != 10 || !full.Lines.HasMore {
		t.Fatalf("embedded lines: %d, has_more %v, %v; want the first 10 and more", len(full.Lines.Data), full.Lines.HasMore, err)
	}
}

// Every invoice write replays its stored answer under its key, and
// answers idempotency_error to the same key with other parameters.
func TestEveryInvoiceWriteReplaysUnderItsKey(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	var sendInv, voidInv string
	id := func(b []byte) string {
		var v struct{ ID string }
		json.Unmarshal(b, &v)
		return v.ID
	}
	for _, step := range []struct {
		name string
		path func() string
		form url.Values
		keep func([]byte)
	}{
		{"create", func() string { return "/v1/invoices" },
			url.Values{"customer": {"cus_1"}, "collection_method": {"send_invoice"}, "days_until_due": {"30"}},
			func(b []byte) { sendInv = id(b) }},
		{"item", func() string { return "/v1/invoiceitems" },
			url.Values{"customer": {"cus_1"}, "amount": {"100"}, "currency": {"usd"}}, nil},
		{"update", func() string { return "/v1/invoices/" + sendInv }, url.Values{"auto_advance": {"false"}}, nil},
		{"finalize", func() string { return "/v1/invoices/" + sendInv + "/finalize" }, url.Values{}, nil},
		{"send", func() string { return "/v1/invoices/" + sendInv + "/send" }, url.Values{}, nil},
		{"pay", func() string { return "/v1/invoices/" + sendInv + "/pay" }, url.Values{}, nil},
		{"create another", func() string { return "/v1/invoices" }, url.Values{"customer": {"cus_2"}},
			func(b []byte) { voidInv = id(b) }},
		{"item another", func() string { return "/v1/invoiceitems" },
			url.Values{"customer": {"cus_2"}, "amount": {"100"}, "currency": {"usd"}}, nil},
		{"finalize another", func() string { return "/v1/invoices/" + voidInv + "/finalize" }, url.Values{}, nil},
		{"void", func() string { return "/v1/invoices/" + voidInv + "/void" }, url.Values{}, nil},
	} {
		switch step.name {
		case "item":
			step.form.Set("invoice", sendInv)
		case "item another":
			step.form.Set("invoice", voidInv)
		}
		key := "key-" + step.name
		resp, first := do(t, srv, http.MethodPost, step.path(), key, step.form)
		if resp.StatusCode != 200 {
			t.Fatalf("%s: %d %s", step.name, resp.StatusCode, first)
		}
		if step.keep != nil {
			step.keep(first)
		}
		resp, again := do(t, srv, http.MethodPost, step.path(), key, step.form)
		if resp.StatusCode != 200 || resp.Header.Get("Idempotent-Replayed") != "true" || string(again) != string(first) {
			t.Fatalf("%s replayed: %d, Idempotent-Replayed %q, same body %v", step.name, resp.StatusCode,
				resp.Header.Get("Idempotent-Replayed"), string(again) == string(first))
		}
		other := url.Values{"expand[]": {"customer"}}
		for k, v := range step.form {
			other[k] = v
		}
		resp, body := do(t, srv, http.MethodPost, step.path(), key, other)
		var e struct{ Error struct{ Type string } }
		json.Unmarshal(body, &e)
		if resp.StatusCode != 400 || e.Error.Type != "idempotency_error" {
			t.Fatalf("%s with other params: %d %s; want 400 idempotency_error", step.name, resp.StatusCode, body)
		}
	}
	got := srv.Invoices("")
	if len(got) != 2 || got[0].Status != "paid" || !got[0].Sent || got[0].Finalizations != 1 || got[0].Payments != 1 ||
		len(got[0].Lines) != 1 || got[1].Status != "void" {
		t.Fatalf("ledger = %+v; want each write done once", got)
	}
}

// An invoice a person marks paid outside Stripe is paid once, whatever the
// customer's card, and says so.
func TestInvoicePaidOutOfBand(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	api := newAPI(t, srv, testKey, nil)
	inv := newDraft(t, api, "cus_d", 500)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	if _, err := api.Invoices.FinalizeInvoice(inv.ID, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{}, "pay-1")); stripeErr(t, err).HTTPStatusCode != 402 {
		t.Fatal("the declined card paid")
	}
	paid, err := api.Invoices.Pay(inv.ID, withKey(&stripe.InvoicePayParams{PaidOutOfBand: stripe.Bool(true)}, "pay-2"))
	if err != nil || paid.Status != "paid" {
		t.Fatalf("paid out of band = %+v, %v; want paid", paid, err)
	}
	if got := srv.Invoices("cus_d"); got[0].Payments != 1 || !got[0].PaidOutOfBand {
		t.Fatalf("ledger: %+v; want one payment, out of band", got[0])
	}
}

// GET /v1/invoices shows an invoice at once (no search delay), newest
// first, by customer, status and created, never a deleted draft, and
// refuses a filter it does not know; GET /v1/events keeps the deleted
// draft's invoice.deleted event, with its metadata, for 30 days.
func TestInvoiceListAndDeletedEvents(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{SearchDelay: time.Hour})
	api := newAPI(t, srv, testKey, nil)
	first := newDraft(t, api, "cus_1", 100)
	second := newDraft(t, api, "cus_1", 200)
	newDraft(t, api, "cus_2", 300)
	deleted := newDraft(t, api, "cus_1")
	if _, err := api.Invoices.Del(deleted.ID, nil); err != nil {
		t.Fatal(err)
	}
	list := func(p *stripe.InvoiceListParams) []string {
		t.Helper()
		var ids []string
		it := api.Invoices.List(p)
		for it.Next() {
			ids = append(ids, it.Invoice().ID)
		}
		if it.Err() != nil {
			t.Fatal(it.Err())
		}
		return ids
	}
	if got := list(&stripe.InvoiceListParams{Customer: stripe.String("cus_1")}); !slices.Equal(got, []string{second.ID, first.ID}) {
		t.Fatalf("cus_1's invoices at once = %v; want [%s %s], newest first, the deleted draft left out", got, second.ID, first.ID)
	}
	if _, err := api.Invoices.FinalizeInvoice(first.ID, withKey(&stripe.InvoiceFinalizeInvoiceParams{}, "fin")); err != nil {
		t.Fatal(err)
	}
	if got := list(&stripe.InvoiceListParams{Customer: stripe.String("cus_1"), Status: stripe.String("open")}); !slices.Equal(got, []string{first.ID}) {
		t.Fatalf("cus_1's open invoices = %v; want [%s]", got, first.ID)
	}
	future := srv.Now().Add(time.Hour).Unix()
	if got := list(&stripe.InvoiceListParams{CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: future}}); len(got) != 0 {
		t.Fatalf("invoices created from an hour from now = %v; want none", got)
	}
	if resp, body := do(t, srv, http.MethodGet, "/v1/invoices", "", url.Values{"metadata[billonce_key]": {"k"}}); resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("a list with an unknown filter: %d %s; want 400", resp.StatusCode, body)
	}

	events := func() []string {
		t.Helper()
		var ids []string
		it := api.Events.List(&stripe.EventListParams{Type: stripe.String("invoice.deleted")})
		for it.Next() {
			var in stripe.Invoice
			if err := json.Unmarshal(it.Event().Data.Raw, &in); err != nil {
				t.Fatal(err)
			}
			if in.Metadata["billonce_period"] != "2026-09" {
				t.Fatalf("the deleted draft's event shows metadata %v", in.Metadata)
			}
			ids = append(ids, in.ID)
		}
		if it.Err() != nil {
			t.Fatal(it.Err())
		}
		return ids
	}
	if got := events(); !slices.Equal(got, []string{deleted.ID}) {
		t.Fatalf("invoice.deleted events = %v; want [%s]", got, deleted.ID)
	}
	srv.Advance(31 * 24 * time.Hour)
	if got := events(); len(got) != 0 {
		t.Fatalf("invoice.deleted events after 31 days = %v; want none (Stripe keeps 30 days)", got)
	}
}
