package spendcap_test

import (
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
)

// Stripe keeps idempotency keys per account: the same key and parameters
// sent to two connected accounts are two payouts, and the proxy must count
// both against the cap.
func TestProxyCountsTheSameKeyOnTwoAccountsAsTwoWrites(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, spendcaptest.Config{})
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1000, Per: spendcap.PerRun})
	accts := []string{srv.CreateAccount(), srv.CreateAccount()}
	for _, a := range accts {
		srv.SetBalance(a, "usd", 10_000)
	}
	statuses := make([]int, len(accts))
	for i, a := range accts {
		form := url.Values{"amount": {"600"}, "currency": {"usd"}}
		req, err := http.NewRequest(http.MethodPost, px.URL+"/v1/payouts", strings.NewReader(form.Encode()))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Authorization", "Bearer "+vaultKey)
		req.Header.Set("Idempotency-Key", "payout-key-1")
		req.Header.Set("Stripe-Account", a)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		statuses[i] = resp.StatusCode
	}
	var total int64
	var made []string
	for _, m := range srv.Movements("payout") {
		total += m.Amount
		made = append(made, fmt.Sprintf("%s on %s", m.ID, m.Account))
	}
	if total > 1000 {
		t.Fatalf("paid out %d in %v through a cap of 1000 (answers %v): one key on two accounts was counted once", total, made, statuses)
	}
	if statuses[1] != http.StatusTooManyRequests {
		t.Fatalf("second account's payout answered %d, want 429", statuses[1])
	}
}
