package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// demoSettleAfter is how long the demo's bank debits take to settle, on
// the fake Stripe's clock.
const demoSettleAfter = 72 * time.Hour

// demoBankDebits returns how the demo's d bank-debit customers (the first
// d of n) settle: all succeed but the last, which fails.
func demoBankDebits(d, n int) map[string]billingtest.Async {
	out := map[string]billingtest.Async{}
	for i := 1; i <= d; i++ {
		a := billingtest.Async{After: demoSettleAfter}
		if i == d {
			a.FailureCode = "insufficient_funds"
		}
		out[demoID(i, n)] = a
	}
	return out
}

// hooks is the webhook endpoint the job serves while it runs.
type hooks struct {
	url    string
	secret string
	srv    *http.Server
}

// startWebhooks serves the Biller's webhook handler on -webhook-addr, or,
// in the demo with bank debits, on a loopback port with a secret of its
// own that the demo's sender uses. It returns a no-op hooks otherwise.
func startWebhooks(o *options, b *billing.Biller, fake *billingtest.Server, w io.Writer) (*hooks, error) {
	h := &hooks{secret: o.webhookSecret}
	addr := o.webhookAddr
	if addr == "" && fake != nil && o.demoBank > 0 {
		addr = "127.0.0.1:0"
	}
	if addr == "" {
		return h, nil
	}
	if h.secret == "" {
		var raw [24]byte
		rand.Read(raw[:])
		h.secret = "whsec_" + hex.EncodeToString(raw[:])
	}
	handler, err := b.Webhook(billing.WebhookConfig{Secret: h.secret})
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("-webhook-addr %q: %w", addr, err)
	}
	h.url = "http://" + ln.Addr().String()
	h.srv = &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	go h.srv.Serve(ln)
	fmt.Fprintf(w, "  webhooks: %s (signing secret ****)\n", h.url)
	return h, nil
}

func (h *hooks) stop() {
	if h.srv == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	h.srv.Shutdown(ctx)
}

// settlement is what the demo's bank debits did after the run.
type settlement struct {
	Days       int         `json:"days"`
	Events     int         `json:"events"`
	Deliveries int         `json:"deliveries"`
	Duplicates int         `json:"duplicates"`
	Statuses   map[int]int `json:"statuses"`
}

// settle lets the demo's bank debits settle: three days pass on the fake
// Stripe's clock, and its events reach the webhook as Stripe delivers
// them: signed, some twice, in no particular order.
func (h *hooks) settle(ctx context.Context, fake *billingtest.Server) *settlement {
	fake.Advance(demoSettleAfter)
	st := &settlement{Days: int(demoSettleAfter / (24 * time.Hour)), Statuses: map[int]int{}}
	if h.url == "" {
		return st
	}
	sender, err := billingtest.NewSender(billingtest.SenderConfig{URL: h.url, Secret: h.secret, Seed: 1, Duplicate: 0.3, Reorder: true})
	if err != nil {
		panic(errors.New("billingtest sender: " + err.Error()))
	}
	rep := sender.Send(ctx, fake.Events())
	st.Events, st.Deliveries, st.Duplicates = rep.Events, rep.Deliveries, rep.Duplicates
	for _, s := range rep.Statuses {
		st.Statuses[s]++
	}
	return st
}

func (s *settlement) print(w io.Writer) {
	fmt.Fprintf(w, "%d days later the bank debits settle: Stripe's %d events reach the webhook in %d deliveries (%d duplicates, out of order), answered %v\n",
		s.Days, s.Events, s.Deliveries, s.Duplicates, s.Statuses)
}
