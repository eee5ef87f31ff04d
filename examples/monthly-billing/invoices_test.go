package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

// assertInvoicedOnce checks at the fake that each customer has exactly one
// invoice for period, paid or open, holding its demo price once as its
// only line, and that the fake holds no other invoice and no charge.
func assertInvoicedOnce(t *testing.T, srv *billingtest.Server, n int) {
	t.Helper()
	for i := 1; i <= n; i++ {
		c := demoID(i, n)
		invs := srv.Invoices(c)
		if len(invs) != 1 {
			t.Errorf("customer %s has %d invoices; want 1", c, len(invs))
			continue
		}
		in := invs[0]
		if (in.Status != "paid" && in.Status != "open") || in.Metadata[billing.MetaPeriod] != period || in.Finalizations != 1 {
			t.Errorf("customer %s: invoice %s is %s for %q, finalized %d times; want paid or open for %s, finalized once",
				c, in.ID, in.Status, in.Metadata[billing.MetaPeriod], in.Finalizations, period)
		}
		if len(in.Lines) != 1 || in.Lines[0].Amount != demoPrice(i, billing.Charges).Amount || in.Lines[0].Metadata["billonce_line"] != "0" {
			t.Errorf("customer %s: invoice %s lines %+v; want one line of %d", c, in.ID, in.Lines, demoPrice(i, billing.Charges).Amount)
		}
	}
	if all := srv.Invoices(""); len(all) != n {
		t.Errorf("the fake holds %d invoices; want %d", len(all), n)
	}
	if p := srv.Stats().Paid; p != 0 {
		t.Errorf("the fake holds %d charges; want none", p)
	}
}

func TestByInvoiceBillsOneInvoicePerCustomerAtTheFake(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{Declines: map[string]string{demoID(7, 40): "insufficient_funds"}})
	args := []string{"-database-url", pgtest.URL(t), "-stripe-url", srv.URL, "-stripe-key", "sk_test_x", "-customers", "40", "-rate", "-1", "-period", period, "-by", "invoice"}
	r := runMain(t, args...)
	if r.code != exitOK || !strings.Contains(r.stdout, "created            39") || !strings.Contains(r.stdout, "processing          1  (invoices left open by a declined payment") {
		t.Fatalf("first run: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	before := srv.Stats().Requests
	r = runMain(t, append(args, "-json")...)
	if rep := decodeReport(t, r); r.code != exitOK || rep.Run.Created != 0 || rep.Run.AlreadyBilled != 39 || rep.Run.Processing != 1 {
		t.Errorf("second run: exit %d, %+v; want created 0, already billed 39, processing 1", r.code, rep.Run)
	}
	if d := srv.Stats().Requests - before; d != 0 {
		t.Errorf("the second run sent %d requests to Stripe; want 0", d)
	}
	assertInvoicedOnce(t, srv, 40)
	if in := srv.Invoices(demoID(7, 40))[0]; in.Status != "open" || in.Payments != 0 {
		t.Errorf("the declined customer's invoice is %s with %d payments; want open, unpaid", in.Status, in.Payments)
	}
}

func TestDemoByInvoiceAndUsageShowsBothOnce(t *testing.T) {
	t.Parallel()
	r := runMain(t, "-database-url", pgtest.URL(t), "-customers", "60", "-rate", "-1", "-period", period, "-by", "invoice", "-usage", "-json")
	if r.code != exitOK {
		t.Fatalf("exit %d; want 0\nstderr:\n%s", r.code, r.stderr)
	}
	rep := decodeReport(t, r)
	if want := (ledger{Customers: 60, Once: 60, OK: true}); rep.Ledger == nil || *rep.Ledger != want {
		t.Errorf("ledger %+v; want %+v", rep.Ledger, want)
	}
	if rep.Usage == nil || rep.UsageAgain == nil || rep.Meter == nil || rep.UsageAgainRequests == nil {
		t.Fatalf("report %+v: want usage, usage again and the meter check", rep)
	}
	if rep.Usage.Created != 60 || rep.UsageAgain.Created != 0 || rep.UsageAgain.AlreadyBilled != 60 || *rep.UsageAgainRequests != 0 {
		t.Errorf("usage %+v, again %+v, %d requests; want 60 sent, then 60 already sent and no request", rep.Usage, rep.UsageAgain, *rep.UsageAgainRequests)
	}
	if want := (meterCheck{Customers: 60, Once: 60, OK: true}); *rep.Meter != want {
		t.Errorf("meter %+v; want %+v", *rep.Meter, want)
	}
	for _, want := range []string{"with one invoice, paid or open, each line once", "60 counted once, 0 more than once", "same usage again: sent 0, already sent 60"} {
		if !strings.Contains(r.stderr, want) {
			t.Errorf("the text (on stderr with -json) lacks %q:\n%s", want, r.stderr)
		}
	}
}

// The usage step against a fake the test owns, run twice as a crash and
// a rerun would: one meter event per customer and window, each of the
// customer's calls.
func TestUsageStepCountsEachWindowOnceAtTheFake(t *testing.T) {
	t.Parallel()
	srv := fakeStripe(t, billingtest.Config{})
	pool, err := pgxpool.New(context.Background(), pgtest.URL(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		t.Fatal(err)
	}
	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billonce"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_x", StripeURL: srv.URL, Claims: store, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	o := &options{customers: 25, concurrency: 4, useLock: true}
	st, err := reportUsage(context.Background(), o, b, srv, guard, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if st.first.Created != 25 || st.second.AlreadyBilled != 25 || st.secondRequests != 0 {
		t.Errorf("first %+v, second %+v, %d requests", st.first, st.second, st.secondRequests)
	}
	start, end := st.start, st.end
	if end.Sub(start) != time.Hour || !end.Equal(end.Truncate(time.Hour)) || end.After(time.Now()) {
		t.Errorf("window %s to %s; want the last whole hour", start, end)
	}
	for i := 1; i <= 25; i++ {
		c := demoID(i, 25)
		if n := srv.MeterEvents(demoMeter, c); n != 1 {
			t.Errorf("customer %s: %d meter events; want 1", c, n)
		}
		if got := srv.MeterTotal(demoMeter, c, start, end); got != float64(demoCalls(i)) {
			t.Errorf("customer %s: the meter counts %v; want %d", c, got, demoCalls(i))
		}
	}
}
