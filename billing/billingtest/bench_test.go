package billingtest_test

import (
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// BenchmarkChargeCreate measures creating a charge through stripe-go against
// a zero-latency fake: client encoding, loopback HTTP and the fake's work.
func BenchmarkChargeCreate(b *testing.B) {
	srv := newServer(b, billingtest.Config{})
	api := newAPI(b, srv, testKey, nil)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		i := n
		n++
		if _, err := api.Charges.New(chargeParams(fmt.Sprint("cus_", i), "2026-09", fmt.Sprint("k", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := len(srv.Payments()); got != n {
		b.Fatalf("%d payments for %d requests", got, n)
	}
}

// BenchmarkChargeCreateRawParallel measures the fake alone under concurrent
// clients, with raw form-encoded requests and no stripe-go on the client side.
func BenchmarkChargeCreateRawParallel(b *testing.B) {
	srv := newServer(b, billingtest.Config{})
	tr := &http.Transport{MaxIdleConnsPerHost: 64}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	var seq atomic.Int64
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := seq.Add(1)
			form := url.Values{"amount": {"4200"}, "currency": {"usd"}, "customer": {fmt.Sprint("cus_", i)}, "metadata[period]": {"2026-09"}}
			req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/charges", strings.NewReader(form.Encode()))
			req.Header.Set("Authorization", "Bearer "+testKey)
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			req.Header.Set("Idempotency-Key", fmt.Sprint("k", i))
			resp, err := hc.Do(req)
			if err != nil {
				b.Error(err)
				return
			}
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusOK {
				b.Errorf("status %d", resp.StatusCode)
				return
			}
		}
	})
}

// BenchmarkMeterEventCreate measures reporting one meter event through
// stripe-go, each with its own identifier, against a zero-latency fake.
func BenchmarkMeterEventCreate(b *testing.B) {
	srv := newServer(b, billingtest.Config{})
	api := newAPI(b, srv, testKey, nil)
	srv.CreateMeter("api_calls", "sum", "")
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		i := n
		n++
		if _, err := api.BillingMeterEvents.New(meterEvent("api_calls", fmt.Sprint("cus_", i%100), "1", fmt.Sprint("id", i), fmt.Sprint("k", i))); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	if got := srv.AggregateNow(); got != n {
		b.Fatalf("%d events processed for %d requests", got, n)
	}
}
