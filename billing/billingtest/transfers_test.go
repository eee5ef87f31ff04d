package billingtest_test

import (
	"encoding/json"
	"net/http"
	"net/url"
	"testing"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing/billingtest"
)

func transferParams(dest string, amount int64, group, key string) *stripe.TransferParams {
	p := &stripe.TransferParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Destination: stripe.String(dest)}
	if group != "" {
		p.TransferGroup = stripe.String(group)
	}
	p.AddMetadata("billonce_period", "2026-09")
	p.SetIdempotencyKey(key)
	return p
}

// The platform's balance is what a test sets plus what its payments
// bring, less what refunds take; a transfer moves part of it to a
// connected account, and one larger than it is refused with
// balance_insufficient, storing nothing.
func TestTransfersMoveThePlatformsBalance(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	acct := srv.CreateAccount()
	srv.SetBalance("", "usd", 1000)
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge")) // 4200
	if err != nil {
		t.Fatal(err)
	}
	if _, err := api.Refunds.New(refundParams(ch.ID, 200, "refund")); err != nil {
		t.Fatal(err)
	}
	if got := srv.Balance("", "usd"); got != 5000 {
		t.Fatalf("platform balance = %d; want 1000 + 4200 - 200", got)
	}
	tr, err := api.Transfers.New(transferParams(acct, 3000, "g1", "t1"))
	if err != nil || tr.Destination == nil || tr.Destination.ID != acct || tr.TransferGroup != "g1" || tr.Amount != 3000 {
		t.Fatalf("transfer = %+v, %v", tr, err)
	}
	if again, err := api.Transfers.New(transferParams(acct, 3000, "g1", "t1")); err != nil || again.ID != tr.ID {
		t.Fatalf("replay = %+v, %v; want %s", again, err, tr.ID)
	}
	_, err = api.Transfers.New(transferParams(acct, 2001, "g2", "t2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Code != stripe.ErrorCodeBalanceInsufficient {
		t.Fatalf("transfer over the balance: %+v; want 400 balance_insufficient", se)
	}
	srv.SetBalance("", "usd", 2001)
	if _, err := api.Transfers.New(transferParams(acct, 2001, "g2", "t2")); err != nil {
		t.Fatalf("the refused key once the balance suffices: %v", err)
	}
	if p, a := srv.Balance("", "usd"), srv.Balance(acct, "usd"); p != 0 || a != 5001 {
		t.Fatalf("balances: platform %d, %s %d; want 0 and 5001", p, acct, a)
	}
	_, body := doAs(t, srv, acct, http.MethodGet, "/v1/balance", "", nil)
	var bal stripe.Balance
	if err := json.Unmarshal(body, &bal); err != nil || len(bal.Available) != 1 || bal.Available[0].Amount != 5001 {
		t.Fatalf("GET /v1/balance on %s = %s, %v", acct, body, err)
	}

	for _, bad := range []struct {
		on   string
		form url.Values
	}{
		{"", url.Values{"amount": {"1"}, "currency": {"usd"}, "destination": {"acct_unknown"}}},
		{"", url.Values{"amount": {"1"}, "currency": {"usd"}}},
		{"", url.Values{"amount": {"1"}, "destination": {acct}}},
		{"", url.Values{"currency": {"usd"}, "destination": {acct}}},
		{acct, url.Values{"amount": {"1"}, "currency": {"usd"}, "destination": {acct}}},
	} {
		resp, body := doAs(t, srv, bad.on, http.MethodPost, "/v1/transfers", "bad "+bad.form.Encode(), bad.form)
		if e := errorOf(body); resp.StatusCode != 400 || e.Type != "invalid_request_error" {
			t.Errorf("transfer %v on %q: %d %s; want 400", bad.form, bad.on, resp.StatusCode, body)
		}
	}

	list := api.Transfers.List(&stripe.TransferListParams{Destination: stripe.String(acct), TransferGroup: stripe.String("g1")})
	var ids []string
	for list.Next() {
		ids = append(ids, list.Transfer().ID)
	}
	if list.Err() != nil || len(ids) != 1 || ids[0] != tr.ID {
		t.Fatalf("transfers of g1 = %v, %v; want %s", ids, list.Err(), tr.ID)
	}
	if resp, _ := doAs(t, srv, acct, http.MethodGet, "/v1/transfers/"+tr.ID, "", nil); resp.StatusCode != 404 {
		t.Errorf("the platform's transfer on %s: %d; want 404", acct, resp.StatusCode)
	}
	ms := srv.Movements("transfer")
	if len(ms) != 2 || ms[0].Destination != acct || ms[0].TransferGroup != "g1" || ms[0].Account != "" || ms[0].IdempotencyKey != "t1" {
		t.Fatalf("ledger transfers = %+v", ms)
	}
	for _, e := range srv.Events() {
		if e.Type == "transfer.created" && e.Account != "" {
			t.Errorf("transfer.created on %q; want the platform's", e.Account)
		}
	}
}

// A transfer is reversed in parts up to its amount, from the
// destination's balance back to the platform's; a reversal the
// destination cannot cover is refused with balance_insufficient, and each
// reversal emits transfer.reversed with the transfer.
func TestTransferReversalsGiveTheFundsBack(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	acct := srv.CreateAccount()
	srv.SetBalance("", "usd", 3000)
	tr, err := api.Transfers.New(transferParams(acct, 3000, "g1", "t1"))
	if err != nil {
		t.Fatal(err)
	}
	reverse := func(amount int64, key string) (*stripe.TransferReversal, error) {
		p := &stripe.TransferReversalParams{ID: stripe.String(tr.ID)}
		if amount > 0 {
			p.Amount = stripe.Int64(amount)
		}
		p.SetIdempotencyKey(key)
		return api.TransferReversals.New(p)
	}
	r1, err := reverse(1000, "r1")
	if err != nil || r1.Amount != 1000 || r1.Transfer.ID != tr.ID {
		t.Fatalf("reversal = %+v, %v", r1, err)
	}
	if again, err := reverse(1000, "r1"); err != nil || again.ID != r1.ID {
		t.Fatalf("replay = %+v, %v; want %s", again, err, r1.ID)
	}
	if _, err := reverse(2001, "r2"); stripeErr(t, err).Code != stripe.ErrorCodeAmountTooLarge {
		t.Fatalf("reversal over what is left: %v; want amount_too_large", err)
	}
	srv.SetBalance(acct, "usd", 1999)
	if _, err := reverse(0, "r2"); stripeErr(t, err).Code != stripe.ErrorCodeBalanceInsufficient {
		t.Fatalf("reversal the destination cannot cover: %v; want balance_insufficient", err)
	}
	srv.SetBalance(acct, "usd", 2000)
	if r2, err := reverse(0, "r2"); err != nil || r2.Amount != 2000 {
		t.Fatalf("reversal of what is left = %+v, %v", r2, err)
	}
	if _, err := reverse(0, "r3"); err == nil {
		t.Fatal("a reversed transfer was reversed again")
	}
	got, err := api.Transfers.Get(tr.ID, nil)
	if err != nil || got.AmountReversed != 3000 || !got.Reversed || got.Reversals == nil || len(got.Reversals.Data) != 2 {
		t.Fatalf("transfer = %+v, %v; want reversed whole, with its two reversals", got, err)
	}
	if p, a := srv.Balance("", "usd"), srv.Balance(acct, "usd"); p != 3000 || a != 0 {
		t.Fatalf("balances: platform %d, %s %d; want 3000 and 0", p, acct, a)
	}
	list := api.TransferReversals.List(&stripe.TransferReversalListParams{ID: stripe.String(tr.ID)})
	n := 0
	for list.Next() {
		n++
	}
	if list.Err() != nil || n != 2 {
		t.Fatalf("listed %d reversals, %v; want 2", n, list.Err())
	}
	if ms := srv.Movements("transfer_reversal"); len(ms) != 2 || ms[0].Of != tr.ID || ms[0].Destination != acct || ms[0].IdempotencyKey != "r1" {
		t.Fatalf("ledger reversals = %+v", ms)
	}
	if got := eventTypes(srv, tr.ID); stringsOf(got) != "[transfer.created transfer.reversed transfer.reversed]" {
		t.Fatalf("transfer events = %v", got)
	}
}
