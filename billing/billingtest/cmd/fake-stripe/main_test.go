package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

func TestServesChargesAndSummarizesTheLedger(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan int, 1)
	var out, errb bytes.Buffer
	go func() {
		done <- run(ctx, []string{"-addr", "127.0.0.1:0", "-declines", "cus_d=insufficient_funds"}, &out, &errb, ready)
	}()
	base := <-ready
	charge := func(customer, key string) int {
		form := url.Values{"amount": {"100"}, "currency": {"usd"}, "customer": {customer}, "metadata[billonce_period]": {"2026-09"}}
		req, _ := http.NewRequest(http.MethodPost, base+"/v1/charges", strings.NewReader(form.Encode()))
		req.Header.Set("Authorization", "Bearer sk_test_x")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, c := range []struct {
		customer, key string
		status        int
	}{{"cus_a", "k1", 200}, {"cus_a", "k1", 200}, {"cus_b", "k2", 200}, {"cus_b", "k3", 200}, {"cus_d", "k4", 402}} {
		if got := charge(c.customer, c.key); got != c.status {
			t.Errorf("charge %s with key %s: status %d; want %d", c.customer, c.key, got, c.status)
		}
	}
	cancel()
	if code := <-done; code != 0 {
		t.Fatalf("exit %d\n%s", code, errb.String())
	}
	for _, want := range []string{"listening on " + base, "(1 declined), 1 replays", "period 2026-09: 1 customers charged once, 1 charged more than once", "cus_b×2"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{{"-cut", "2"}, {"-addr", "nowhere:-1"}, {"extra"}} {
		var out, errb bytes.Buffer
		if code := run(context.Background(), args, &out, &errb, nil); code != 2 || errb.Len() == 0 {
			t.Errorf("%q: exit %d, stderr %q; want 2 and a message", args, code, errb.String())
		}
	}
}

// The admin address serves the ledger and applies settings, all checked
// before any is changed; no API key reaches the state.
func TestAdminEndpoints(t *testing.T) {
	srv := billingtest.Start(t, billingtest.Config{})
	ts := httptest.NewServer(&admin{srv: srv})
	defer ts.Close()
	post := func(body string) int {
		resp, err := http.Post(ts.URL+"/control", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	charge := func(customer, key string) int {
		form := url.Values{"amount": {"100"}, "currency": {"usd"}, "customer": {customer}, "metadata[billonce_period]": {"2026-09"}}
		req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(form.Encode()))
		req.Header.Set("Authorization", "Bearer sk_test_secret_admin")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Idempotency-Key", key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(`{"rates":{"drop":2}}`); code != 400 {
		t.Fatalf("invalid rates: status %d; want 400", code)
	}
	if code := post(`{"declines":{"cus_x":"insufficient_funds"},"rates":{"error_before":1},"seed":3}`); code != 200 {
		t.Fatalf("control: status %d", code)
	}
	if code := charge("cus_1", "k"); code != 500 {
		t.Fatalf("with error_before at 1: status %d; want 500", code)
	}
	if code := post(`{"rates":{},"advance":"24h"}`); code != 200 {
		t.Fatalf("control: status %d", code)
	}
	if code := charge("cus_1", "k"); code != 200 {
		t.Fatalf("after clearing the rates: status %d", code)
	}
	if code := charge("cus_x", "kx"); code != 402 {
		t.Fatalf("decline set over HTTP: status %d; want 402", code)
	}
	form := func(kv ...string) url.Values {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v
	}
	write := func(path string, f url.Values) {
		req, _ := http.NewRequest(http.MethodPost, srv.URL+path, strings.NewReader(f.Encode()))
		req.Header.Set("Authorization", "Bearer sk_test_secret_admin")
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("POST %s: status %d", path, resp.StatusCode)
		}
	}
	write("/v1/invoices", form("customer", "cus_1"))
	for _, p := range srv.Payments() {
		if p.Paid {
			write("/v1/refunds", form("charge", p.ID, "amount", "1"))
		}
	}
	write("/v1/billing/meters", form("display_name", "calls", "event_name", "calls", "default_aggregation[formula]", "sum"))
	at := srv.Now().Add(-time.Minute)
	write("/v1/billing/meter_events", form("event_name", "calls", "payload[stripe_customer_id]", "cus_1", "payload[value]", "7",
		"timestamp", fmt.Sprint(at.Unix())))
	if code := post(`{"aggregate":true}`); code != 200 {
		t.Fatalf("control aggregate: status %d", code)
	}
	mt, err := http.Get(fmt.Sprintf("%s/meter_total?event_name=calls&customer=cus_1&start=%d&end=%d", ts.URL, at.Unix(), at.Unix()+60))
	if err != nil {
		t.Fatal(err)
	}
	var total meterTotal
	json.NewDecoder(mt.Body).Decode(&total)
	mt.Body.Close()
	if total != (meterTotal{Total: 7, Events: 1}) {
		t.Fatalf("meter_total = %+v; want 7 over 1 event", total)
	}

	resp, err := http.Get(ts.URL + "/state?log=1")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var st state
	if err := json.Unmarshal(body, &st); err != nil {
		t.Fatal(err)
	}
	if len(st.Invoices) != 1 || st.Invoices[0].Status != "draft" {
		t.Fatalf("state invoices = %+v; want one draft", st.Invoices)
	}
	if len(st.Movements) != 1 || st.Movements[0].Object != "refund" || st.Movements[0].Amount != 1 {
		t.Fatalf("state movements = %+v; want one refund", st.Movements)
	}
	if len(st.Payments) != 2 || st.Stats.Paid != 1 || st.Stats.Faults[billingtest.FaultErrorBefore] != 1 || time.Until(st.Now) < 23*time.Hour || len(st.Log) == 0 {
		t.Fatalf("state = %+v", st)
	}
	if strings.Contains(string(body), "sk_test_secret_admin") {
		t.Fatal("the API key is in the state")
	}
}
