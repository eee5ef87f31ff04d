package billingtest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing/billingtest"
)

// Objects made with a Stripe-Account header live on that account: the
// platform and other accounts neither see them nor may name them, and
// the ledger says where each payment was made.
func TestConnectedAccountObjectsLiveApart(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	acct, other := srv.CreateAccount(), srv.CreateAccount()

	p := chargeParams("cus_a", "2026-09", "k1")
	p.SetStripeAccount(acct)
	ch, err := api.Charges.New(p)
	if err != nil {
		t.Fatal(err)
	}
	get := &stripe.ChargeParams{}
	get.SetStripeAccount(acct)
	if got, err := api.Charges.Get(ch.ID, get); err != nil || got.ID != ch.ID {
		t.Fatalf("GET on its account = %v, %v", got, err)
	}
	for _, on := range []string{"", other} {
		resp, body := doAs(t, srv, on, http.MethodGet, "/v1/charges/"+ch.ID, "", nil)
		if e := errorOf(body); resp.StatusCode != 404 || e.Code != "resource_missing" {
			t.Errorf("GET on account %q: %d %s; want 404 resource_missing", on, resp.StatusCode, body)
		}
		// The customer lives on acct: anywhere else it is missing.
		resp, body = doAs(t, srv, on, http.MethodPost, "/v1/charges", "k2"+on,
			url.Values{"amount": {"100"}, "currency": {"usd"}, "customer": {"cus_a"}})
		if e := errorOf(body); resp.StatusCode != 404 || e.Code != "resource_missing" || e.Param != "customer" {
			t.Errorf("charge of cus_a on account %q: %d %s; want 404 resource_missing on customer", on, resp.StatusCode, body)
		}
		resp, body = doAs(t, srv, on, http.MethodGet, "/v1/charges", "", nil)
		var list struct{ Data []struct{ ID string } }
		json.Unmarshal(body, &list)
		if resp.StatusCode != 200 || len(list.Data) != 0 {
			t.Errorf("list on account %q: %d %s; want an empty list", on, resp.StatusCode, body)
		}
	}
	if n, pays := srv.Count("cus_a"), srv.Payments(); n != 1 || len(pays) != 1 || pays[0].Account != acct {
		t.Fatalf("ledger: %d payments of cus_a, %+v; want one, on %s", n, pays, acct)
	}

	// An invoice of acct is missing on the platform, and takes no item from
	// there.
	resp, body := doAs(t, srv, acct, http.MethodPost, "/v1/invoices", "inv", url.Values{"customer": {"cus_a"}})
	inv := idOf(body)
	if resp.StatusCode != 200 {
		t.Fatalf("invoice on %s: %d %s", acct, resp.StatusCode, body)
	}
	if resp, body := do(t, srv, http.MethodGet, "/v1/invoices/"+inv, "", nil); resp.StatusCode != 404 {
		t.Errorf("GET invoice on the platform: %d %s; want 404", resp.StatusCode, body)
	}
	resp, body = do(t, srv, http.MethodPost, "/v1/invoiceitems", "item", url.Values{"customer": {"cus_p"}, "invoice": {inv}, "amount": {"100"}, "currency": {"usd"}})
	if e := errorOf(body); resp.StatusCode != 400 || e.Code != "resource_missing" {
		t.Errorf("item on the platform for %s: %d %s; want 400 resource_missing", inv, resp.StatusCode, body)
	}
	if invs := srv.Invoices("cus_a"); len(invs) != 1 || invs[0].Account != acct || len(invs[0].Lines) != 0 {
		t.Fatalf("invoices of cus_a = %+v; want one on %s, with no line", invs, acct)
	}

	// An account that was never connected is refused.
	resp, body = doAs(t, srv, "acct_unknown", http.MethodGet, "/v1/charges", "", nil)
	if e := errorOf(body); resp.StatusCode != 403 || e.Code != "account_invalid" || strings.Contains(string(body), testKey) {
		t.Errorf("unknown account: %d %s; want 403 account_invalid without the key", resp.StatusCode, body)
	}

	// Events of a connected account name it; the platform's name none.
	var sawAccount bool
	for _, e := range srv.Events() {
		var ev struct{ Account *string }
		json.Unmarshal(e.Body, &ev)
		switch {
		case e.Account != acct:
			t.Errorf("event %s %s is on %q; want %s", e.Type, e.ObjectID, e.Account, acct)
		case ev.Account == nil || *ev.Account != acct:
			t.Errorf("event %s carries account %v; want %s", e.Type, ev.Account, acct)
		default:
			sawAccount = true
		}
	}
	if !sawAccount {
		t.Fatal("no event for the connected account's charge and invoice")
	}
}

// An idempotency key is scoped per account: the same key and parameters
// on two accounts make two payments, each replayed on its own account.
func TestIdempotencyKeysAreScopedPerAccount(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	acct := srv.CreateAccount()
	form := url.Values{"amount": {"700"}, "currency": {"usd"}, "source": {"tok_visa"}}
	ids := map[string]string{}
	for _, on := range []string{"", acct, "", acct} {
		resp, body := doAs(t, srv, on, http.MethodPost, "/v1/charges", "same-key", form)
		if resp.StatusCode != 200 {
			t.Fatalf("on %q: %d %s", on, resp.StatusCode, body)
		}
		id := idOf(body)
		replayed := resp.Header.Get("Idempotent-Replayed") == "true"
		if first, seen := ids[on]; seen {
			if !replayed || id != first {
				t.Fatalf("second request on %q: %s, replayed %v; want a replay of %s", on, id, replayed, first)
			}
			continue
		}
		if replayed {
			t.Fatalf("first request on %q was replayed (%s)", on, id)
		}
		ids[on] = id
	}
	pays := srv.Payments()
	if len(pays) != 2 || ids[""] == ids[acct] || pays[0].Account != "" || pays[1].Account != acct {
		t.Fatalf("payments = %+v; want one on the platform and one on %s", pays, acct)
	}
	var accounts []string
	for _, e := range srv.Log() {
		accounts = append(accounts, e.Account)
	}
	if got := strings.Join(accounts, ","); got != ","+acct+",,"+acct {
		t.Fatalf("log accounts = %q", got)
	}
}

// Meters and meter events are per account: an event is counted by its
// account's meter, an event naming a customer of another account is
// rejected at processing as Stripe rejects a customer it does not find,
// and a connected account's error report names it in its context and is
// served to that account only.
func TestMetersArePerAccount(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	acct := srv.CreateAccount()
	resp, body := doAs(t, srv, acct, http.MethodPost, "/v1/billing/meters", "m1", url.Values{"display_name": {"calls"},
		"event_name": {"calls"}, "default_aggregation[formula]": {"sum"}})
	if resp.StatusCode != 200 {
		t.Fatalf("meter on %s: %d %s", acct, resp.StatusCode, body)
	}
	meter := idOf(body)
	// The platform has no meter named calls: it may create its own.
	platformMeter := srv.CreateMeter("calls", "sum", "")
	if resp, _ := do(t, srv, http.MethodGet, "/v1/billing/meters/"+meter, "", nil); resp.StatusCode != 404 {
		t.Errorf("the account's meter on the platform: %d; want 404", resp.StatusCode)
	}
	send := func(on, customer, ident string) {
		t.Helper()
		resp, body := doAs(t, srv, on, http.MethodPost, "/v1/billing/meter_events", ident, url.Values{"event_name": {"calls"},
			"payload[stripe_customer_id]": {customer}, "payload[value]": {"5"}, "identifier": {ident}})
		if resp.StatusCode != 200 {
			t.Fatalf("event %s on %q: %d %s", ident, on, resp.StatusCode, body)
		}
	}
	send(acct, "cus_a", "e1")
	send("", "cus_p", "e1") // the same identifier on another account is another event
	send("", "cus_a", "e2") // cus_a lives on acct
	srv.AggregateNow()
	start, end := srv.Now().Add(-time.Hour), srv.Now().Add(time.Hour)
	if a, p := srv.MeterTotal("calls", "cus_a", start, end), srv.MeterTotal("calls", "cus_p", start, end); a != 5 || p != 5 {
		t.Fatalf("totals: cus_a %v, cus_p %v; want 5 each", a, p)
	}
	minute := srv.Now().Truncate(time.Minute)
	sum := url.Values{"customer": {"cus_a"}, "start_time": {fmt.Sprint(minute.Add(-time.Hour).Unix())}, "end_time": {fmt.Sprint(minute.Add(time.Hour).Unix())}}
	if resp, body := do(t, srv, http.MethodGet, "/v1/billing/meters/"+platformMeter+"/event_summaries", "", sum); resp.StatusCode != 404 {
		t.Errorf("platform summaries of cus_a: %d %s; want 404 (no such customer)", resp.StatusCode, body)
	}

	// A connected account's event with no meter is reported to it.
	resp, body = doAs(t, srv, acct, http.MethodPost, "/v1/billing/meter_events", "e3", url.Values{"event_name": {"nothing"},
		"payload[stripe_customer_id]": {"cus_a"}, "identifier": {"e3"}})
	if resp.StatusCode != 200 {
		t.Fatalf("event without a meter: %d %s", resp.StatusCode, body)
	}
	srv.AggregateNow()
	var reports []billingtest.Event
	for _, e := range srv.Events() {
		if e.Type == "v1.billing.meter.error_report_triggered" {
			reports = append(reports, e)
		}
	}
	if len(reports) != 2 || reports[0].Account != "" || reports[1].Account != acct {
		t.Fatalf("reports = %+v; want the platform's (cus_a not found) then %s's (no meter)", reports, acct)
	}
	for i, want := range []string{"", acct} {
		var thin struct{ Context *string }
		json.Unmarshal(reports[i].Body, &thin)
		if (want == "") != (thin.Context == nil) || (thin.Context != nil && *thin.Context != want) {
			t.Errorf("report %d context = %v; want %q", i, thin.Context, want)
		}
		other := acct
		if want != "" {
			other = ""
		}
		if resp, _ := doAs(t, srv, want, http.MethodGet, "/v2/core/events/"+reports[i].ID, "", nil); resp.StatusCode != 200 {
			t.Errorf("report %d on its account: %d", i, resp.StatusCode)
		}
		if resp, _ := doAs(t, srv, other, http.MethodGet, "/v2/core/events/"+reports[i].ID, "", nil); resp.StatusCode != 404 {
			t.Errorf("report %d on another account: %d; want 404", i, resp.StatusCode)
		}
	}
	if !strings.Contains(string(mustGet(t, srv, "", reports[0].ID)), "meter_event_customer_not_found") {
		t.Errorf("the platform's report does not say cus_a was not found")
	}
}

func mustGet(t *testing.T, srv *billingtest.Server, acct, eventID string) []byte {
	t.Helper()
	resp, body := doAs(t, srv, acct, http.MethodGet, "/v2/core/events/"+eventID, "", nil)
	if resp.StatusCode != 200 {
		t.Fatalf("GET event %s: %d %s", eventID, resp.StatusCode, body)
	}
	return body
}

// POST /v1/accounts connects an account, as CreateAccount does, once per
// key; only the platform connects accounts.
func TestCreateAccountThroughTheAPI(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	p := &stripe.AccountParams{Type: stripe.String("express"), Country: stripe.String("FR")}
	p.SetIdempotencyKey("acct-1")
	a, err := api.Accounts.New(p)
	if err != nil || a.Type != "express" || !a.PayoutsEnabled {
		t.Fatalf("account = %+v, %v", a, err)
	}
	if again, err := api.Accounts.New(p); err != nil || again.ID != a.ID {
		t.Fatalf("replay = %+v, %v; want %s", again, err, a.ID)
	}
	srv.SetBalance(a.ID, "eur", 10) // panics for an account that is not connected
	resp, body := doAs(t, srv, a.ID, http.MethodPost, "/v1/accounts", "acct-2", url.Values{})
	if resp.StatusCode != 400 {
		t.Fatalf("an account made by a connected account: %d %s; want 400", resp.StatusCode, body)
	}
}
