package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"iter"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// invoiceOf is the invoice of the bench's customer i: k lines.
func invoiceOf(i, k int) *billing.Invoice {
	inv := &billing.Invoice{Currency: "usd", Description: "September 2026"}
	for l := range k {
		inv.Lines = append(inv.Lines, billing.InvoiceLine{Description: fmt.Sprintf("line %d", l+1), Amount: 100 + int64((i+l)%9900)})
	}
	return inv
}

// invoiced streams n customers, each billed by an invoice of k lines.
func invoiced(n, k int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for i := range n {
			if !yield(billing.Item{Customer: customerID(i), Invoice: invoiceOf(i, k)}, nil) {
				return
			}
		}
	}
}

// invoiceResult is one timed invoice run: customers per second, and the
// requests the fake received per customer, writes (POST) and reads.
type invoiceResult struct {
	rate           float64
	writes, reads  float64
	selfCPU, pgCPU time.Duration // per customer
	pg             pgPer
}

// paidOnce checks at the fake that each of n customers has one paid
// invoice of k lines, finalized once and paid once.
func paidOnce(srv *billingtest.Server, n, k int) error {
	per := map[string]int{}
	for _, in := range srv.Invoices("") {
		per[in.Customer]++
		if in.Status != "paid" || len(in.Lines) != k || in.Finalizations != 1 || in.Payments != 1 {
			return fmt.Errorf("%s: invoice %s is %s with %d lines, finalized %d times, paid %d times; want paid, %d lines, once each",
				in.Customer, in.ID, in.Status, len(in.Lines), in.Finalizations, in.Payments, k)
		}
	}
	for i := range n {
		if per[customerID(i)] != 1 {
			return fmt.Errorf("%s: %d invoices, want 1", customerID(i), per[customerID(i)])
		}
	}
	if len(per) != n {
		return fmt.Errorf("%d customers invoiced, want %d", len(per), n)
	}
	return nil
}

// calls counts the fake's requests per customer, writes and reads.
func calls(srv *billingtest.Server, n int) (writes, reads float64) {
	for _, en := range srv.Log() {
		if en.Method == http.MethodPost {
			writes++
		} else {
			reads++
		}
	}
	return writes / float64(n), reads / float64(n)
}

// invoiceRun bills n customers by invoices of k lines with a Biller's Run
// against a fresh fake.
func invoiceRun(ctx context.Context, e *env, o options, n, k int) (invoiceResult, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	s, _, err := e.store(ctx, o.concurrency+2)
	if err != nil {
		return invoiceResult{}, err
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: -1})
	if err != nil {
		return invoiceResult{}, err
	}
	m0, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return invoiceResult{}, err
	}
	self0, pg0 := cpuTimes()
	sum, err := b.Run(ctx, period, invoiced(n, k), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch})
	if err != nil {
		return invoiceResult{}, err
	}
	self1, pg1 := cpuTimes()
	m1, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return invoiceResult{}, err
	}
	if sum.Created != n {
		return invoiceResult{}, fmt.Errorf("invoice Run billed %d of %d: %+v %v", sum.Created, n, sum.Progress, sum.Failures)
	}
	if err := paidOnce(srv, n, k); err != nil {
		return invoiceResult{}, fmt.Errorf("invoice Run: %w", err)
	}
	w, r := calls(srv, n)
	return invoiceResult{float64(n) / sum.Elapsed.Seconds(), w, r, (self1 - self0) / time.Duration(n), (pg1 - pg0) / time.Duration(n), m1.per(m0, n)}, nil
}

// naiveInvoices makes each customer's invoice with stripe-go directly:
// the draft, its k items, finalize and pay, each with a random key, no
// database, at the same concurrency, against a fresh fake.
func naiveInvoices(ctx context.Context, o options, n, k int) (invoiceResult, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL), HTTPClient: &http.Client{Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	invoices := invoice.Client{B: backend, Key: "sk_test_bench"}
	items := invoiceitem.Client{B: backend, Key: "sk_test_bench"}
	randomKey := func(p *stripe.Params) {
		var b [16]byte
		rand.Read(b[:])
		p.Context, p.IdempotencyKey = ctx, stripe.String(hex.EncodeToString(b[:]))
	}
	bill := func(i int) error {
		inv := invoiceOf(i, k)
		dp := &stripe.InvoiceParams{Customer: stripe.String(customerID(i)), Currency: stripe.String(inv.Currency),
			AutoAdvance: stripe.Bool(false), PendingInvoiceItemsBehavior: stripe.String("exclude"),
			CollectionMethod: stripe.String("charge_automatically"), Description: stripe.String(inv.Description)}
		randomKey(&dp.Params)
		draft, err := invoices.New(dp)
		if err != nil {
			return err
		}
		for _, l := range inv.Lines {
			ip := &stripe.InvoiceItemParams{Customer: stripe.String(customerID(i)), Invoice: stripe.String(draft.ID),
				Amount: stripe.Int64(l.Amount), Currency: stripe.String(inv.Currency), Description: stripe.String(l.Description)}
			randomKey(&ip.Params)
			if _, err := items.New(ip); err != nil {
				return err
			}
		}
		fp := &stripe.InvoiceFinalizeInvoiceParams{AutoAdvance: stripe.Bool(false)}
		randomKey(&fp.Params)
		if _, err := invoices.FinalizeInvoice(draft.ID, fp); err != nil {
			return err
		}
		pp := &stripe.InvoicePayParams{}
		randomKey(&pp.Params)
		_, err = invoices.Pay(draft.ID, pp)
		return err
	}
	elapsed, self, err := concurrently(o.concurrency, n, bill)
	if err != nil {
		return invoiceResult{}, err
	}
	if err := paidOnce(srv, n, k); err != nil {
		return invoiceResult{}, fmt.Errorf("naive invoice loop: %w", err)
	}
	w, r := calls(srv, n)
	return invoiceResult{rate: float64(n) / elapsed.Seconds(), writes: w, reads: r, selfCPU: self}, nil
}

func benchInvoice(ctx context.Context, e *env, o options, t *table) error {
	n, k := o.invoiceN, o.invoiceLines
	var safe, naive []invoiceResult
	for range max(1, o.reps) {
		s, err := invoiceRun(ctx, e, o, n, k)
		if err != nil {
			return err
		}
		nv, err := naiveInvoices(ctx, o, n, k)
		if err != nil {
			return err
		}
		safe, naive = append(safe, s), append(naive, nv)
	}
	med := func(rs []invoiceResult, f func(invoiceResult) float64) float64 {
		var xs []float64
		for _, r := range rs {
			xs = append(xs, f(r))
		}
		return median(xs)
	}
	rate := func(r invoiceResult) float64 { return r.rate }
	writes := func(r invoiceResult) float64 { return r.writes }
	reads := func(r invoiceResult) float64 { return r.reads }
	self := func(r invoiceResult) float64 { return float64(r.selfCPU.Microseconds()) }
	pg := func(r invoiceResult) float64 { return float64(r.pgCPU.Microseconds()) }
	ms, mn := med(safe, rate), med(naive, rate)
	perCall := func(rate, calls float64) string {
		return fmt.Sprintf("%.2f ms/customer, %.2f ms/call", 1000/rate, 1000/rate/calls)
	}
	sw, sr, nw, nr := med(safe, writes), med(safe, reads), med(naive, writes), med(naive, reads)
	t.add(fmt.Sprintf("invoice Run of %d × %d lines, billonce", n, k), fmt.Sprintf("%.0f customers/s", ms),
		fmt.Sprintf("Stripe calls per customer at the fake: %.2f writes + %.2f reads; %s; claims in PostgreSQL, concurrency %d; CPU/customer: %.0f µs here (fake included) + %.0f µs PostgreSQL; %s",
			sw, sr, perCall(ms, sw+sr), o.concurrency, med(safe, self), med(safe, pg), pgNote("invoice", invoicePgs(safe))))
	t.add(fmt.Sprintf("%d invoices × %d lines, naive loop", n, k), fmt.Sprintf("%.0f customers/s", mn),
		fmt.Sprintf("stripe-go draft, %d items, finalize, pay, random keys, no database, same concurrency; %.2f writes + %.2f reads per customer; %s; CPU/customer: %.0f µs here (fake included)",
			k, nw, nr, perCall(mn, nw+nr), med(naive, self)))
	t.add("invoice: billonce / naive", fmt.Sprintf("%.2f", ms/mn),
		fmt.Sprintf("time per customer: billonce %.2f ms = %.2f naive calls' time; per rep: billonce %s, naive %s",
			1000/ms, (1000/ms)/(1000/mn/(nw+nr)), rates(invoiceRates(safe)), rates(invoiceRates(naive))))
	return nil
}

func invoicePgs(rs []invoiceResult) []pgPer {
	var ps []pgPer
	for _, r := range rs {
		ps = append(ps, r.pg)
	}
	return ps
}

func invoiceRates(rs []invoiceResult) []float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, r.rate)
	}
	return xs
}
