package billingtest_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/billing/billingtest"
)

func payoutParams(acct string, amount int64, key string) *stripe.PayoutParams {
	p := &stripe.PayoutParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd")}
	p.AddMetadata("billonce_period", "2026-09")
	if acct != "" {
		p.SetStripeAccount(acct)
	}
	p.SetIdempotencyKey(key)
	return p
}

// A connected account's payout takes its balance and goes pending, in
// transit and paid on the server's clock; a bank may turn it failed days
// after it was paid, and its amount is back in the balance. Each step is
// an event naming the account.
func TestPayoutsMoveOnAndMayFailAfterPaid(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	acct := srv.CreateAccount()
	srv.SetBalance(acct, "usd", 3000)
	start := srv.Now().Unix()
	po, err := api.Payouts.New(payoutParams(acct, 2000, "p1"))
	if err != nil || po.Status != stripe.PayoutStatusPending || po.Amount != 2000 {
		t.Fatalf("payout = %+v, %v; want pending", po, err)
	}
	_, err = api.Payouts.New(payoutParams(acct, 1001, "p2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Code != stripe.ErrorCodeBalanceInsufficient {
		t.Fatalf("payout over the balance: %+v; want 400 balance_insufficient", se)
	}
	if _, err := api.Payouts.New(payoutParams("", 1, "p3")); err == nil {
		t.Fatal("the platform, with no balance, paid out")
	}
	status := func() stripe.PayoutStatus {
		t.Helper()
		get := &stripe.PayoutParams{}
		get.SetStripeAccount(acct)
		got, err := api.Payouts.Get(po.ID, get)
		if err != nil {
			t.Fatal(err)
		}
		return got.Status
	}
	srv.Advance(time.Hour)
	if st := status(); st != stripe.PayoutStatusInTransit {
		t.Fatalf("after an hour: %s; want in_transit", st)
	}
	srv.Advance(47 * time.Hour)
	if st := status(); st != stripe.PayoutStatusPaid || srv.Balance(acct, "usd") != 1000 {
		t.Fatalf("after two days: %s, balance %d; want paid and 1000", st, srv.Balance(acct, "usd"))
	}
	srv.Advance(72 * time.Hour)
	if err := srv.Settle(po.ID, "failed", "account_closed"); err != nil {
		t.Fatal(err)
	}
	get := &stripe.PayoutParams{}
	get.SetStripeAccount(acct)
	failed, err := api.Payouts.Get(po.ID, get)
	if err != nil || failed.Status != stripe.PayoutStatusFailed || failed.FailureCode != "account_closed" || srv.Balance(acct, "usd") != 3000 {
		t.Fatalf("failed payout = %+v, %v, balance %d; want failed with account_closed and 3000 back", failed, err, srv.Balance(acct, "usd"))
	}
	if err := srv.Settle(po.ID, "paid", ""); err == nil {
		t.Fatal("a failed payout was paid")
	}
	var types []string
	for _, e := range srv.Events() {
		if e.ObjectID == po.ID {
			types = append(types, e.Type)
			if e.Account != acct {
				t.Errorf("%s on %q; want %s", e.Type, e.Account, acct)
			}
		}
	}
	if got := stringsOf(types); got != "[payout.created payout.updated payout.paid payout.failed]" {
		t.Fatalf("events = %s", got)
	}

	// A pending payout can be canceled; a paid one cannot.
	po2, err := api.Payouts.New(payoutParams(acct, 500, "p4"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(po2.ID, "canceled", ""); err != nil || srv.Balance(acct, "usd") != 3000 {
		t.Fatalf("cancel: %v, balance %d; want 3000", err, srv.Balance(acct, "usd"))
	}
	po3, err := api.Payouts.New(payoutParams(acct, 500, "p5"))
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(po3.ID, "paid", ""); err != nil {
		t.Fatal(err)
	}
	if err := srv.Settle(po3.ID, "canceled", ""); err == nil {
		t.Fatal("a paid payout was canceled")
	}

	list := api.Payouts.List(&stripe.PayoutListParams{ListParams: stripe.ListParams{StripeAccount: stripe.String(acct)},
		CreatedRange: &stripe.RangeQueryParams{GreaterThanOrEqual: start}})
	var ids []string
	for list.Next() {
		ids = append(ids, list.Payout().ID)
	}
	if list.Err() != nil || len(ids) != 3 || ids[2] != po.ID {
		t.Fatalf("payouts since the start = %v, %v; want 3, newest first", ids, list.Err())
	}
	resp, body := doAs(t, srv, acct, http.MethodGet, "/v1/payouts", "", url.Values{"created[gt]": {fmt.Sprint(srv.Now().Unix())}})
	if resp.StatusCode != 200 || len(listIDs(t, body)) != 0 {
		t.Fatalf("payouts created after now: %d %s; want none", resp.StatusCode, body)
	}
	if resp, body := do(t, srv, http.MethodGet, "/v1/payouts", "", nil); resp.StatusCode != 200 || len(listIDs(t, body)) != 0 {
		t.Fatalf("the platform's payouts: %s; want none", body)
	}
	if resp, body := do(t, srv, http.MethodGet, "/v1/payouts", "", url.Values{"destination": {"ba_1"}}); resp.StatusCode != 400 {
		t.Fatalf("a list filter the fake does not know: %d %s; want 400", resp.StatusCode, body)
	}
	ms := srv.Movements("payout")
	if len(ms) != 3 || ms[0].Status != "failed" || ms[0].FailureCode != "account_closed" || ms[1].Status != "canceled" || ms[0].Account != acct {
		t.Fatalf("ledger payouts = %+v", ms)
	}
}

// An instant payout is submitted at once and paid within half an hour.
func TestInstantPayoutArrivesWithinHalfAnHour(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	srv.SetBalance("", "usd", 100)
	p := payoutParams("", 100, "p1")
	p.Method = stripe.String("instant")
	po, err := api.Payouts.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := api.Payouts.Get(po.ID, nil); got.Status != stripe.PayoutStatusInTransit || got.Method != "instant" {
		t.Fatalf("instant payout = %s %s; want in_transit", got.Status, got.Method)
	}
	if next, ok := srv.NextSettlement(); !ok || next.Sub(srv.Now()) > 30*time.Minute {
		t.Fatalf("next settlement %v, %v; want within half an hour", next, ok)
	}
	srv.Advance(30 * time.Minute)
	if got, _ := api.Payouts.Get(po.ID, nil); got.Status != stripe.PayoutStatusPaid {
		t.Fatalf("after half an hour: %s; want paid", got.Status)
	}
}

func listIDs(t *testing.T, body []byte) []string {
	t.Helper()
	var l struct{ Data []struct{ ID string } }
	if err := json.Unmarshal(body, &l); err != nil {
		t.Fatalf("list %s: %v", body, err)
	}
	var ids []string
	for _, d := range l.Data {
		ids = append(ids, d.ID)
	}
	return ids
}
