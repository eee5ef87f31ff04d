package billingtest_test

import (
	"fmt"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

// Every write of money going out (refunds, credit notes, transfers and
// their reversals, payouts, on the platform or a connected account) takes every fault the
// fake injects, under the same key rules as a charge: a fault before
// execution stores nothing and the retry makes the object; one after
// commit leaves one object that the retry replays (a stored 500 replays
// as that 500). Either way, a request and its retry under one key make
// exactly one.
func TestMoneyOutWritesTakeEveryFault(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	acct := srv.CreateAccount()
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "charge"))
	if err != nil {
		t.Fatal(err)
	}
	inv := finalized(t, api, "cus_2", true, 9000)
	srv.SetBalance("", "usd", 100_000)
	tr, err := api.Transfers.New(transferParams(acct, 10_000, "", "transfer"))
	if err != nil {
		t.Fatal(err)
	}
	srv.SetBalance(acct, "usd", 100_000)

	writes := []struct {
		object, on, path string
		form             url.Values
	}{
		{"refund", "", "/v1/refunds", url.Values{"charge": {ch.ID}, "amount": {"100"}}},
		{"credit_note", "", "/v1/credit_notes", url.Values{"invoice": {inv.ID}, "amount": {"100"}, "out_of_band_amount": {"100"}}},
		{"transfer", "", "/v1/transfers", url.Values{"amount": {"100"}, "currency": {"usd"}, "destination": {acct}}},
		{"transfer_reversal", "", "/v1/transfers/" + tr.ID + "/reversals", url.Values{"amount": {"1"}}},
		{"payout", acct, "/v1/payouts", url.Values{"amount": {"100"}, "currency": {"usd"}}},
		{"payout", "", "/v1/payouts", url.Values{"amount": {"100"}, "currency": {"usd"}}},
	}
	committed := map[billingtest.FaultKind]bool{billingtest.FaultErrorAfter: true, billingtest.FaultCut: true,
		billingtest.FaultDrop: true, billingtest.FaultSlow: true}
	kinds := []billingtest.FaultKind{billingtest.FaultErrorBefore, billingtest.FaultErrorAfter, billingtest.FaultCut,
		billingtest.FaultDrop, billingtest.FaultSlow, billingtest.FaultInFlight, billingtest.FaultLockTimeout,
		billingtest.FaultRateLimit, billingtest.FaultRefuse, billingtest.FaultDecline}
	for _, w := range writes {
		for _, kind := range kinds {
			name := fmt.Sprintf("%s on %q, %s", w.object, w.on, kind)
			key := "key " + name
			before := len(srv.Movements(w.object))
			f := billingtest.Fault{Kind: kind, Delay: time.Millisecond,
				Refusal: billingtest.Refusal{Code: "resource_missing", Param: "charge"}}
			// Matching by account picks the connected account's request.
			srv.FailNext(billingtest.Match{Path: w.path, IdempotencyKey: key, Account: w.on}, f)
			first, body := tryAs(t, srv, w.on, w.path, key, w.form)
			if after := len(srv.Movements(w.object)) - before; (committed[kind] || kind == billingtest.FaultDecline) != (after == 1) {
				t.Errorf("%s: %d made by the faulted request (answer %d %s)", name, after, first, body)
			}
			second, body := tryAs(t, srv, w.on, w.path, key, w.form)
			if n := len(srv.Movements(w.object)) - before; n != 1 {
				t.Errorf("%s: %d made by a request and its retry under one key; want 1", name, n)
			}
			want := 200
			if kind == billingtest.FaultErrorAfter {
				want = 500 // the stored answer
			}
			if second != want {
				t.Errorf("%s: the retry answered %d %s; want %d", name, second, body, want)
			}
		}
		// Other parameters under a used key are an idempotency error.
		key := "key " + w.object + " on " + w.on
		if st, body := tryAs(t, srv, w.on, w.path, key, w.form); st != 200 {
			t.Fatalf("%s: %d %s", key, st, body)
		}
		other := url.Values{"metadata[other]": {"1"}}
		for k, v := range w.form {
			other[k] = v
		}
		if st, body := tryAs(t, srv, w.on, w.path, key, other); st != 400 || errorOf(body).Type != "idempotency_error" {
			t.Errorf("%s with other parameters: %d %s; want 400 idempotency_error", key, st, body)
		}
	}

	// A request held in flight makes a second one with its key answer
	// 409, and the two make one refund.
	release := make(chan struct{})
	srv.FailNext(billingtest.Match{Path: "/v1/refunds", IdempotencyKey: "held"}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	before := len(srv.Movements("refund"))
	form := url.Values{"charge": {ch.ID}, "amount": {"100"}}
	done := make(chan int, 1)
	go func() {
		st, _ := tryAs(t, srv, "", "/v1/refunds", "held", form)
		done <- st
	}()
	for len(srv.Movements("refund")) == before { // the refund exists while its request is held
		time.Sleep(time.Millisecond)
	}
	if st, body := tryAs(t, srv, "", "/v1/refunds", "held", form); st != http.StatusConflict {
		t.Fatalf("while held: %d %s; want 409", st, body)
	}
	close(release)
	if st := <-done; st != 200 {
		t.Fatalf("held refund answered %d", st)
	}
	if n := len(srv.Movements("refund")) - before; n != 1 {
		t.Fatalf("%d refunds under the held key; want 1", n)
	}
}

// tryAs sends one POST on behalf of acct and returns its status, 0 when
// the connection was lost, and its body.
func tryAs(t *testing.T, srv *billingtest.Server, acct, path, key string, form url.Values) (int, []byte) {
	t.Helper()
	resp, body, err := send(srv, acct, http.MethodPost, path, key, form)
	if err != nil {
		return 0, nil
	}
	return resp.StatusCode, body
}
