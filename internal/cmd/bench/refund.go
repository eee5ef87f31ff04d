package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/refund"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// refundsOnce checks, at the fake, that each of n customers' payments has
// exactly one refund, of half its price.
func refundsOnce(srv *billingtest.Server, n int) error {
	per := map[string]int{}
	for _, m := range srv.Movements("refund") {
		per[m.Customer]++
	}
	if len(per) != n {
		return fmt.Errorf("fake holds refunds of %d customers, want %d", len(per), n)
	}
	for c, k := range per {
		if k != 1 {
			return fmt.Errorf("%s: %d refunds at the fake, want 1", c, k)
		}
	}
	return nil
}

// refundRun charges n customers with a Run (not measured), then refunds
// half of each payment with Biller.Refund at o.concurrency, against a
// fresh fake.
func refundRun(ctx context.Context, e *env, o options, n int) (result, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	s, _, err := e.store(ctx, o.concurrency+2)
	if err != nil {
		return result{}, err
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: -1})
	if err != nil {
		return result{}, err
	}
	if sum, err := b.Run(ctx, period, customers(n), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch}); err != nil || sum.Created != n {
		return result{}, fmt.Errorf("charging before the refunds: %+v, %v", sum.Progress, err)
	}
	pool := e.lastPool()
	m0, err := e.mark(ctx, pool)
	if err != nil {
		return result{}, err
	}
	_, pg0 := cpuTimes()
	elapsed, self, err := concurrently(o.concurrency, n, func(i int) error {
		_, err := b.Refund(ctx, customerID(i), period, "rma-1", price(i).Amount/2)
		return err
	})
	_, pg1 := cpuTimes()
	if err != nil {
		return result{}, err
	}
	m1, err := e.mark(ctx, pool)
	if err != nil {
		return result{}, err
	}
	if err := refundsOnce(srv, n); err != nil {
		return result{}, fmt.Errorf("billonce: %w", err)
	}
	return result{float64(n) / elapsed.Seconds(), self, (pg1 - pg0) / time.Duration(n), m1.per(m0, n)}, nil
}

// naiveRefund charges n customers with stripe-go (not measured), then
// refunds half of each with refund.New and a random key, no database, at
// the same concurrency, against a fresh fake.
func naiveRefund(ctx context.Context, o options, n int) (result, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL), HTTPClient: &http.Client{Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	charges, refunds := charge.Client{B: backend, Key: "sk_test_bench"}, refund.Client{B: backend, Key: "sk_test_bench"}
	ids := make([]string, n)
	if _, _, err := concurrently(o.concurrency, n, func(i int) error {
		p := price(i)
		params := &stripe.ChargeParams{Amount: stripe.Int64(p.Amount), Currency: stripe.String(p.Currency), Customer: stripe.String(customerID(i))}
		params.Context, params.IdempotencyKey = ctx, stripe.String("charge-"+customerID(i))
		ch, err := charges.New(params)
		if err == nil {
			ids[i] = ch.ID
		}
		return err
	}); err != nil {
		return result{}, err
	}
	elapsed, self, err := concurrently(o.concurrency, n, func(i int) error {
		var k [16]byte
		rand.Read(k[:])
		params := &stripe.RefundParams{Charge: stripe.String(ids[i]), Amount: stripe.Int64(price(i).Amount / 2)}
		params.Context, params.IdempotencyKey = ctx, stripe.String(hex.EncodeToString(k[:]))
		_, err := refunds.New(params)
		return err
	})
	if err != nil {
		return result{}, err
	}
	if err := refundsOnce(srv, n); err != nil {
		return result{}, fmt.Errorf("naive refund loop: %w", err)
	}
	return result{rate: float64(n) / elapsed.Seconds(), selfCPU: self}, nil
}

func benchRefund(ctx context.Context, e *env, o options, t *table) error {
	n := o.refundN
	var safe, naive []result
	for range max(1, o.reps) { // interleaved, as in the run section
		s, err := refundRun(ctx, e, o, n)
		if err != nil {
			return err
		}
		nv, err := naiveRefund(ctx, o, n)
		if err != nil {
			return err
		}
		safe, naive = append(safe, s), append(naive, nv)
	}
	med := medianOf
	rate := func(r result) float64 { return r.rate }
	self := func(r result) float64 { return float64(r.selfCPU.Microseconds()) }
	pg := func(r result) float64 { return float64(r.pgCPU.Microseconds()) }
	ms, mn := med(safe, rate), med(naive, rate)
	t.add(fmt.Sprintf("Refund of %d payments, billonce", n), fmt.Sprintf("%.0f refunds/s", ms),
		fmt.Sprintf("one Refund call each, concurrency %d; claims in PostgreSQL; CPU/refund: %.0f µs here (fake included) + %.0f µs PostgreSQL; %s",
			o.concurrency, med(safe, self), med(safe, pg), pgNote("refund", pgsOf(safe))))
	t.add(fmt.Sprintf("%d refunds, naive loop", n), fmt.Sprintf("%.0f refunds/s", mn),
		fmt.Sprintf("stripe-go refund.New, random keys, no database, same concurrency; CPU/refund: %.0f µs here (fake included)", med(naive, self)))
	t.add("refunds: billonce / naive", fmt.Sprintf("%.2f", ms/mn), fmt.Sprintf("per rep: billonce %s, naive %s", rates(ratesOf(safe)), rates(ratesOf(naive))))
	return nil
}
