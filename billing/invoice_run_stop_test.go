package billing_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// onLine calls f once, the first time a log line contains s.
type onLine struct {
	s    string
	once sync.Once
	f    func()
}

func (w *onLine) Write(p []byte) (int, error) {
	if strings.Contains(string(p), w.s) {
		w.once.Do(w.f)
	}
	return len(p), nil
}

// A Run stopped by another customer's refused key while an invoice's
// finalization is on its way gets Stripe's answer to it and records it:
// the next run goes on from there, and each customer has one invoice,
// finalized once and paid once, counted at the fake.
func TestInvoiceStepInFlightWhenTheRunStopsIsRecorded(t *testing.T) {
	t.Parallel()
	held, release := make(chan struct{}), make(chan struct{})
	var heldOnce sync.Once
	stopped := &onLine{s: "stopping the run", f: func() { close(release) }}
	byInvoice := func(c *billing.Config) {
		c.Price = nil
		c.Invoice = func(context.Context, string, string) (billing.Invoice, error) { return *threeLines(), nil }
	}
	e := newEnv(t, byInvoice, func(c *billing.Config) { c.Logger = slog.New(slog.NewTextHandler(stopped, nil)) })
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		switch {
		case r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/finalize") && r.Attempt == 1:
			first := false
			heldOnce.Do(func() { first = true; close(held) })
			if first {
				return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
			}
		case r.Customer == "cus_2":
			<-held
			return billingtest.Fault{Kind: billingtest.FaultRefuse, Status: http.StatusUnauthorized,
				Refusal: billingtest.Refusal{Message: "Invalid API Key provided"}}
		}
		return billingtest.Fault{}
	})
	ids := []string{"cus_1", "cus_2"}
	_, err := e.b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{BatchSize: 2, Concurrency: 2})
	if !errors.Is(err, billing.ErrStripeAuth) {
		t.Fatalf("the run = %v, want ErrStripeAuth", err)
	}
	e.srv.SetScript(nil)
	sum, err := e.biller(byInvoice).Run(context.Background(), period, billing.Customers(ids...), nil)
	if err != nil || sum.Failures != nil {
		t.Fatalf("the next run: %+v, %v", sum, err)
	}
	for _, c := range ids {
		e.wantOneInvoice(c, threeLines(), "paid", 1)
	}
}
