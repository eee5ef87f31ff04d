package billing_test

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoice"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// threeLines is the invoice the tests bill: 1000 + 250 + 40 cents.
func threeLines() *billing.Invoice {
	return &billing.Invoice{Currency: "usd", Description: "September", Lines: []billing.InvoiceLine{
		{Description: "Plan", Amount: 1000}, {Description: "Seats", Amount: 250}, {Description: "Support", Amount: 40}}}
}

// invoiceKey is the claim key of customer's invoice for period.
func (e *env) invoiceClaim(customer string) claim.Claim {
	e.tb.Helper()
	var key string
	if err := e.pool.QueryRow(context.Background(), "SELECT key FROM billonce_claims WHERE customer = $1 AND period = $2", customer, period).Scan(&key); err != nil {
		e.tb.Fatalf("claim of %s: %v", customer, err)
	}
	c, err := e.store.Get(context.Background(), key)
	if err != nil {
		e.tb.Fatal(err)
	}
	return c
}

// wantOneInvoice fails unless customer has exactly one invoice at the fake,
// in status, with inv's lines each once (in order, with their index in
// the metadata), finalized once and paid payments times.
func (e *env) wantOneInvoice(customer string, inv *billing.Invoice, status string, payments int) billingtest.Invoice {
	e.tb.Helper()
	all := e.srv.Invoices(customer)
	if len(all) != 1 {
		e.tb.Fatalf("%d invoices for %s, want exactly 1: %+v", len(all), customer, all)
	}
	got := all[0]
	if got.Status != status || got.Finalizations != 1 || got.Payments != payments {
		e.tb.Fatalf("invoice %s: status %s, %d finalizations, %d payments; want %s, 1, %d", got.ID, got.Status, got.Finalizations, got.Payments, status, payments)
	}
	if len(got.Lines) != len(inv.Lines) {
		e.tb.Fatalf("invoice %s has %d lines, want %d: %+v", got.ID, len(got.Lines), len(inv.Lines), got.Lines)
	}
	for i, l := range got.Lines {
		if l.Amount != inv.Lines[i].Amount || l.Metadata["billonce_line"] != strconv.Itoa(i) || l.Metadata[billing.MetaKey] != got.Metadata[billing.MetaKey] {
			e.tb.Fatalf("invoice %s line %d = %+v, want amount %d, billonce_line %d", got.ID, i, l, inv.Lines[i].Amount, i)
		}
	}
	return got
}

// invoicePosts counts the fake's logged POSTs by kind: "draft", "line",
// "finalize", "pay", "send".
func invoicePosts(log []billingtest.Entry) map[string]int {
	n := map[string]int{}
	for _, e := range log {
		switch {
		case e.Method != http.MethodPost:
			n["get"]++
		case e.Path == "/v1/invoices":
			n["draft"]++
		case e.Path == "/v1/invoiceitems":
			n["line"]++
		default:
			n[e.Path[strings.LastIndexByte(e.Path, '/')+1:]]++
		}
	}
	return n
}

// One invoice with its lines, exactly once, however often and from however
// many replicas at once it is asked for. A naive flow without a claim (or
// with random keys) makes one invoice per concurrent call.
func TestInvoiceOnceAcrossCallsAndReplicas(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	inv := threeLines()
	r, err := e.b.Invoice(ctx, "cus_1", period, inv)
	if err != nil {
		t.Fatal(err)
	}
	if r.Amount != 1290 || r.Currency != "usd" || r.Outcome != billing.Created || r.Processing || !strings.HasPrefix(r.StripeID, "in_") {
		t.Fatalf("receipt = %+v", r)
	}
	got := e.wantOneInvoice("cus_1", inv, "paid", 1)
	if got.ID != r.StripeID {
		t.Fatalf("receipt names %s, the fake %s", r.StripeID, got.ID)
	}
	// n lines: a draft, n items, a finalization and a payment; one read,
	// of the draft's lines before it is finalized.
	if n := invoicePosts(e.srv.Log()); n["draft"] != 1 || n["line"] != 3 || n["finalize"] != 1 || n["pay"] != 1 || n["get"] != 1 {
		t.Fatalf("requests = %v, want 1 draft, 3 lines, 1 finalize, 1 pay, 1 read", n)
	}
	again, err := e.b.Invoice(ctx, "cus_1", period, inv)
	if err != nil || again.StripeID != r.StripeID || again.Outcome != billing.AlreadyBilled {
		t.Fatalf("second call = %+v, %v", again, err)
	}

	// Four replicas at once, for another customer.
	var wg sync.WaitGroup
	ids := make(chan string, 4)
	for range 4 {
		b := e.biller(func(c *billing.Config) { c.InProgressWait = 20 * time.Second })
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.Invoice(ctx, "cus_2", period, inv)
			if err != nil {
				t.Error(err)
				return
			}
			ids <- r.StripeID
		}()
	}
	wg.Wait()
	close(ids)
	e.wantOneInvoice("cus_2", inv, "paid", 1)
	for id := range ids {
		if id != e.srv.Invoices("cus_2")[0].ID {
			t.Fatalf("a replica reports invoice %s", id)
		}
	}
}

// stepMatcher picks the request of one step: "draft", "line i",
// "finalize", "pay".
func stepMatcher(step string) func(billingtest.Request) bool {
	var mu sync.Mutex
	lines := 0
	return func(r billingtest.Request) bool {
		if r.Method != http.MethodPost {
			return false
		}
		switch {
		case step == "draft":
			return r.Path == "/v1/invoices"
		case strings.HasPrefix(step, "line "):
			if r.Path != "/v1/invoiceitems" || r.Attempt != 1 {
				return false
			}
			mu.Lock()
			defer mu.Unlock()
			lines++
			return "line "+strconv.Itoa(lines-1) == step
		}
		return strings.HasSuffix(r.Path, "/"+step)
	}
}

// crashAt makes the first request of step execute at the fake and lose its
// answer (the connection cut after the commit), after which every read
// fails; with one attempt, the call ends with an unknown outcome and
// leaves the claim pending, as a runner that crashed once Stripe had done
// the step. It returns the step's key as sent.
func (e *env) crashAt(b *billing.Biller, customer, step string, inv *billing.Invoice) string {
	e.tb.Helper()
	match := stepMatcher(step)
	var key string
	var once sync.Once
	var cut atomic.Bool
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		hit := false
		if match(r) {
			once.Do(func() { key, hit = r.IdempotencyKey, true })
		}
		switch {
		case hit:
			cut.Store(true)
			return billingtest.Fault{Kind: billingtest.FaultCut}
		case r.Method == http.MethodGet && cut.Load():
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	defer e.srv.SetScript(nil)
	_, err := b.Invoice(context.Background(), customer, period, inv)
	if !errors.Is(err, billing.ErrOutcomeUnknown) {
		e.tb.Fatalf("invoice with a lost answer at %s = %v, want ErrOutcomeUnknown", step, err)
	}
	if key == "" {
		e.tb.Fatalf("no request of step %s", step)
	}
	return key
}

var invoiceSteps = []string{"draft", "line 0", "line 1", "line 2", "finalize", "pay"}

// A crash at any step resumes at the next one with the same keys: one
// invoice, each line once, finalized once, paid once. A flow with random
// keys (or one that starts again from the draft without keys) makes a
// second draft or duplicates a line; one that does not record the steps
// and re-derives nothing fails on the refused second finalize.
func TestInvoiceResumesAfterACrashAtEveryStep(t *testing.T) {
	t.Parallel()
	for _, step := range invoiceSteps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			key := e.crashAt(e.b, "cus_1", step, inv)
			if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending {
				t.Fatalf("claim after the crash: %s", c.State)
			}
			r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			if err != nil {
				t.Fatal(err)
			}
			got := e.wantOneInvoice("cus_1", inv, "paid", 1)
			if r.StripeID != got.ID {
				t.Fatalf("receipt %s, invoice %s", r.StripeID, got.ID)
			}
			sent := 0
			for _, l := range e.srv.Log() {
				if l.IdempotencyKey == key {
					sent++
				}
			}
			// The resume finds every step done where Stripe shows it: the
			// draft in the customer's invoices, a line among the draft's
			// lines, the finalization and the payment in the invoice's
			// status. No step's key is sent again.
			if sent != 1 {
				t.Fatalf("the key of step %s was sent %d times, want once (the crash; the resume finds the step done)", step, sent)
			}
			if c := e.invoiceClaim("cus_1"); c.State != claim.StateSucceeded || c.StripeID != got.ID {
				t.Fatalf("claim = %s %s", c.State, c.StripeID)
			}
		})
	}
}

// Past a step's window Stripe has forgotten its key: the draft is found by
// search, the lines by listing the invoice's lines, the finalization and
// the payment by reading the invoice; nothing is written blind. A flow
// that resends with the same keys after 24 hours makes a second invoice
// or a second line at the fake, which has forgotten them.
func TestInvoicePastTheWindowFindsWhatExists(t *testing.T) {
	t.Parallel()
	for _, step := range invoiceSteps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			e.crashAt(e.b, "cus_1", step, inv)
			e.advance(25 * time.Hour)
			if _, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv); err != nil {
				t.Fatal(err)
			}
			e.wantOneInvoice("cus_1", inv, "paid", 1)
		})
	}
}

// A past-window draft that search does not find yet is not settled by a
// guess: with two invoices carrying the key, nothing is written and the
// claim waits for a person.
func TestInvoicePastTheWindowWithTwoDraftsNeedsReconciliation(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.crashAt(e.b, "cus_1", "line 0", inv)
	c := e.invoiceClaim("cus_1")
	// Someone made a second invoice with the same key in its metadata.
	p := &stripe.InvoiceParams{Customer: stripe.String("cus_1"), Metadata: map[string]string{billing.MetaKey: c.Key}}
	p.IdempotencyKey = stripe.String("someone-else")
	if _, err := e.invoices().New(p); err != nil {
		t.Fatal(err)
	}
	// Lose the draft's step: the claim knows no invoice.
	e.exec("UPDATE billonce_claims SET step = '', stripe_id = ''")
	e.advance(25 * time.Hour)
	before := len(e.srv.Log())
	_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Fatalf("err = %v, want ErrNeedsReconciliation", err)
	}
	if n := invoicePosts(e.srv.Log()[before:]); n["draft"]+n["line"]+n["finalize"]+n["pay"] != 0 {
		t.Fatalf("wrote %v with two drafts found", n)
	}
}

// wantHeldDraft checks that cus_1's invoice claim is pending, with no step
// recorded but the draft it holds: what a call that gave up part way
// leaves. It returns the claim.
func (e *env) wantHeldDraft(what string) claim.Claim {
	e.tb.Helper()
	c := e.invoiceClaim("cus_1")
	all := e.srv.Invoices("cus_1")
	if c.State != claim.StatePending || c.Step != "" || len(all) == 0 || c.StripeID != all[0].ID {
		e.tb.Fatalf("%s: %s at step %q holding %q; want pending, holding the draft %+v", what, c.State, c.Step, c.StripeID, all)
	}
	return c
}

func (e *env) invoices() *invoice.Client {
	return &invoice.Client{B: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(e.srv.URL),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}), Key: secretKey}
}

// The customer's pending invoice items stay pending: the draft excludes
// them. A draft made with Stripe's include (or an item added without
// invoice=) would bill them on this invoice.
func TestInvoiceLeavesPendingItemsAlone(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.AddPendingItem("cus_1", 999, "usd")
	inv := threeLines()
	if _, err := e.b.Invoice(context.Background(), "cus_1", period, inv); err != nil {
		t.Fatal(err)
	}
	e.wantOneInvoice("cus_1", inv, "paid", 1)
}

// A declined payment leaves the invoice open and the claim processing: it
// is reported, and another call makes no second invoice. A flow that
// fails the claim on the decline invoices the period again on the next
// call.
func TestInvoiceDeclinedStaysOpenAndProcessing(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var settled []billing.Event
	e := newEnv(t, func(c *billing.Config) {
		c.Observe = func(ev billing.Event) {
			if ev.Kind == billing.EventSettled {
				mu.Lock()
				settled = append(settled, ev)
				mu.Unlock()
			}
		}
	})
	e.srv.Decline("cus_1", "insufficient_funds")
	inv := threeLines()
	r, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
	if err != nil || !r.Processing {
		t.Fatalf("declined invoice = %+v, %v; want a processing receipt", r, err)
	}
	mu.Lock()
	if len(settled) != 1 || !errors.Is(settled[0].Err, billing.ErrDeclined) || settled[0].StripeID != r.StripeID {
		t.Fatalf("reported %+v, want one EventSettled with ErrDeclined", settled)
	}
	mu.Unlock()
	if c := e.invoiceClaim("cus_1"); c.State != claim.StateProcessing {
		t.Fatalf("claim %s, want processing", c.State)
	}
	again, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
	if err != nil || !again.Processing || again.StripeID != r.StripeID {
		t.Fatalf("second call = %+v, %v", again, err)
	}
	e.wantOneInvoice("cus_1", inv, "open", 0)
}

// Bad input is refused before anything is claimed or sent. A flow that
// validates after claiming (or lets Stripe refuse) leaves claims or
// requests behind.
func TestInvoiceBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	many := make([]billing.InvoiceLine, 251)
	for i := range many {
		many[i] = billing.InvoiceLine{Amount: 1}
	}
	line := []billing.InvoiceLine{{Amount: 100}}
	for name, tc := range map[string]struct {
		customer, period string
		inv              *billing.Invoice
		want             string
	}{
		"no invoice":       {"cus_1", period, nil, "Config.Invoice"},
		"customer":         {"cus 1", period, &billing.Invoice{Currency: "usd", Lines: line}, "white space"},
		"period":           {"cus_1", "2026-13", &billing.Invoice{Currency: "usd", Lines: line}, "period"},
		"currency":         {"cus_1", period, &billing.Invoice{Currency: "zzz", Lines: line}, "currency"},
		"no lines":         {"cus_1", period, &billing.Invoice{Currency: "usd"}, "no lines"},
		"too many lines":   {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: many}, "251 lines"},
		"zero amount":      {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Amount: 0}}}, "positive"},
		"credit line":      {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Amount: 500}, {Amount: -100}}}, "credit"},
		"total":            {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Amount: 99_999_999}, {Amount: 1}}}, "total"},
		"days until due":   {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: line, DaysUntilDue: 366}, "DaysUntilDue"},
		"negative due":     {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: line, DaysUntilDue: -1}, "DaysUntilDue"},
		"description":      {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: line, Description: strings.Repeat("x", 501)}, "Description"},
		"line description": {"cus_1", period, &billing.Invoice{Currency: "usd", Lines: []billing.InvoiceLine{{Amount: 1, Description: "\xff"}}}, "UTF-8"},
	} {
		_, err := e.b.Invoice(context.Background(), tc.customer, tc.period, tc.inv)
		if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v, want ErrInvalid saying %q", name, err, tc.want)
		}
	}
	if n := len(e.srv.Log()); n != 0 {
		t.Fatalf("%d requests reached the fake", n)
	}
	if n := e.claimRows(); n != 0 {
		t.Fatalf("%d claims written", n)
	}
}

// A customer charged for a period cannot be invoiced for it: one claim
// table holds both.
func TestInvoiceAfterAChargeIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	if _, err := e.b.Charge(context.Background(), "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	_, err := e.b.Invoice(context.Background(), "cus_1", period, threeLines())
	var m *claim.MismatchError
	if !errors.As(err, &m) {
		t.Fatalf("err = %v, want a *claim.MismatchError", err)
	}
	if n := len(e.srv.Invoices("")); n != 0 {
		t.Fatalf("%d invoices", n)
	}
}

// Run bills items by invoice with the same guarantee; a second Run of the
// period makes nothing more.
func TestRunBillsByInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, func(c *billing.Config) {
		c.Price = nil
		c.Invoice = func(context.Context, string, string) (billing.Invoice, error) { return *threeLines(), nil }
	})
	ids := customers(12)
	for round, want := range []int{12, 0} {
		sum, err := e.b.Run(context.Background(), period, billing.Customers(ids...), &billing.RunOptions{BatchSize: 5, Concurrency: 4})
		if err != nil {
			t.Fatal(err)
		}
		if sum.Created != want || sum.Created+sum.AlreadyBilled != 12 {
			t.Fatalf("run %d: %+v", round, sum.Progress)
		}
	}
	for _, c := range ids {
		e.wantOneInvoice(c, threeLines(), "paid", 1)
	}
}

// Reconcile resumes an invoice a runner left part way, with Config.Invoice
// for its lines; without it, the claim is reported and left as it is.
func TestReconcileResumesAnInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.crashAt(e.b, "cus_1", "line 1", inv)

	sum, err := e.biller(oneAttempt).Reconcile(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Pending != 1 || len(sum.Failures) != 1 || !strings.Contains(sum.Failures[0].Error(), "Config.Invoice") {
		t.Fatalf("reconcile without Config.Invoice: %+v %v", sum.Progress, sum.Failures)
	}
	e.wantHeldDraft("claim")
	b := e.biller(oneAttempt, func(c *billing.Config) {
		c.Invoice = func(context.Context, string, string) (billing.Invoice, error) { return *inv, nil }
	})
	if sum, err = b.Reconcile(context.Background(), nil); err != nil || sum.Created+sum.AlreadyBilled != 1 {
		t.Fatalf("reconcile = %+v, %v %v", sum.Progress, err, sum.Failures)
	}
	e.wantOneInvoice("cus_1", inv, "paid", 1)
}

// Webhooks move an invoice's claim: invoice.payment_failed is reported and
// leaves it processing (the invoice stays open), invoice.voided fails it,
// invoice.paid settles it; a redelivery is a duplicate.
func TestInvoiceWebhooks(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	h.srv.Decline("cus_1", "insufficient_funds")
	r, err := h.b.Invoice(ctx, "cus_1", period, threeLines())
	if err != nil || !r.Processing {
		t.Fatalf("declined invoice: %+v %v", r, err)
	}
	find := func(typ, id string) billingtest.Event {
		t.Helper()
		for _, ev := range h.srv.Events() {
			if ev.Type == typ && ev.ObjectID == id {
				return ev
			}
		}
		t.Fatalf("no %s event for %s", typ, id)
		return billingtest.Event{}
	}
	h.mu.Lock()
	h.events = nil
	h.mu.Unlock()
	failed := find("invoice.payment_failed", r.StripeID)
	h.deliver(failed)
	h.deliver(failed)
	if c := h.invoiceClaim("cus_1"); c.State != claim.StateProcessing {
		t.Fatalf("claim after invoice.payment_failed: %s", c.State)
	}
	h.mu.Lock()
	if len(h.events) != 1 || !errors.Is(h.events[0].Err, billing.ErrDeclined) {
		t.Fatalf("events after payment_failed twice: %+v", h.events)
	}
	var ce *billing.ChargeError
	if !errors.As(h.events[0].Err, &ce) || !ce.AfterProcessing {
		t.Fatalf("reported %v, want a *ChargeError with AfterProcessing", h.events[0].Err)
	}
	h.mu.Unlock()
	h.deliver(find("invoice.finalized", r.StripeID))

	vp := &stripe.InvoiceVoidInvoiceParams{}
	vp.IdempotencyKey = stripe.String("void-" + r.StripeID)
	if _, err := h.invoices().VoidInvoice(r.StripeID, vp); err != nil {
		t.Fatal(err)
	}
	voided := find("invoice.voided", r.StripeID)
	h.deliver(voided)
	h.deliver(voided)
	if c := h.invoiceClaim("cus_1"); c.State != claim.StateFailed {
		t.Fatalf("claim after invoice.voided: %s", c.State)
	}

	// An invoice sent to the customer is processing until it is paid.
	sent := threeLines()
	sent.DaysUntilDue = 30
	r2, err := h.b.Invoice(ctx, "cus_2", period, sent)
	if err != nil || !r2.Processing {
		t.Fatalf("sent invoice: %+v %v", r2, err)
	}
	pp := &stripe.InvoicePayParams{}
	pp.IdempotencyKey = stripe.String("pay-" + r2.StripeID)
	if _, err := h.invoices().Pay(r2.StripeID, pp); err != nil {
		t.Fatal(err)
	}
	paid := find("invoice.paid", r2.StripeID)
	h.deliver(paid)
	h.deliver(paid)
	if c := h.invoiceClaim("cus_2"); c.State != claim.StateSucceeded {
		t.Fatalf("claim after invoice.paid: %s", c.State)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	n := len(h.results)
	if n < 2 || h.results[n-1] != "duplicate" || h.results[n-2] != "applied" {
		t.Fatalf("webhook results %v, want applied then duplicate", h.results)
	}
}

// A step whose answer Stripe stored as a 500 (every replay of its key
// repeats it) is found by looking, not resent under a new key nor retried
// forever: one invoice, each line once. A flow that retries the stored
// 500 stalls; one that makes a new key for the retry duplicates the step.
func TestInvoiceStepWithAStored500IsFound(t *testing.T) {
	t.Parallel()
	for _, step := range invoiceSteps {
		t.Run(step, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			inv := threeLines()
			match := stepMatcher(step)
			var once sync.Once
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				hit := false
				if match(r) {
					once.Do(func() { hit = true })
				}
				if hit {
					return billingtest.Fault{Kind: billingtest.FaultErrorAfter}
				}
				return billingtest.Fault{}
			})
			if _, err := e.b.Invoice(context.Background(), "cus_1", period, inv); err != nil {
				t.Fatal(err)
			}
			e.wantOneInvoice("cus_1", inv, "paid", 1)
		})
	}
}

// Reconcile reads an invoice that has been processing (a declined payment,
// then paid) as an invoice, not as a charge, and settles its claim.
func TestReconcileReadsAProcessingInvoice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.Decline("cus_1", "insufficient_funds")
	r, err := e.b.Invoice(context.Background(), "cus_1", period, threeLines())
	if err != nil || !r.Processing {
		t.Fatalf("declined invoice: %+v %v", r, err)
	}
	e.srv.Honor("cus_1")
	pp := &stripe.InvoicePayParams{}
	pp.IdempotencyKey = stripe.String("dunning-" + r.StripeID)
	if _, err := e.invoices().Pay(r.StripeID, pp); err != nil {
		t.Fatal(err)
	}
	e.advance(2 * time.Hour)
	sum, err := e.b.Reconcile(context.Background(), nil)
	if err != nil || sum.AlreadyBilled != 1 {
		t.Fatalf("reconcile = %+v, %v %v", sum.Progress, err, sum.Failures)
	}
	if c := e.invoiceClaim("cus_1"); c.State != claim.StateSucceeded || c.StripeID != r.StripeID {
		t.Fatalf("claim %s %s, want succeeded", c.State, c.StripeID)
	}
}

// A claim resumed with another credential (a rotated key, whose requests
// Stripe's replays do not meet) looks for the step it may have done before
// writing: the draft made under the old key is found, not made again. A
// line the old key's runner may still have on its way is not sent under
// the new key within that key's window, as for a charge: the call writes
// nothing and says until when. Past the window the lines are added once.
// A flow that takes the draft found as proof that the old key sent
// nothing after it adds a line twice when one lands late.
func TestInvoiceResumedWithAnotherCredentialLooksFirst(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.crashAt(e.b, "cus_1", "draft", inv)
	other := e.biller(oneAttempt, rotated)
	before := invoicePosts(e.srv.Log())
	_, err := other.Invoice(context.Background(), "cus_1", period, inv)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrSentElsewhere) || !errors.As(err, &ce) || ce.Until.IsZero() {
		t.Fatalf("the rotated key's call within the old key's window = %v, want ErrSentElsewhere with Until", err)
	}
	if now := invoicePosts(e.srv.Log()); now["draft"] != before["draft"] || now["line"] != before["line"] {
		t.Fatalf("the rotated key's call sent %v, before it %v; want nothing sent", now, before)
	}
	e.advance(25 * time.Hour)
	if _, err := other.Invoice(context.Background(), "cus_1", period, inv); err != nil {
		t.Fatal(err)
	}
	e.wantOneInvoice("cus_1", inv, "paid", 1)
}

// Stripe refusing a step once the draft exists (here a person finalized
// the invoice by hand mid-way) leaves the claim pending for a person,
// never failed nor abandoned, and makes no second invoice. A flow that
// fails the claim, or starts over, invoices the period twice.
func TestInvoiceStepRefusedLeavesTheClaimPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.crashAt(e.b, "cus_1", "line 1", inv)
	c := e.invoiceClaim("cus_1")
	fp := &stripe.InvoiceFinalizeInvoiceParams{}
	fp.IdempotencyKey = stripe.String("by-hand")
	if _, err := e.invoices().FinalizeInvoice(c.StripeID, fp); err != nil {
		t.Fatal(err)
	}
	_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrNeedsReconciliation) || !errors.As(err, &ce) || ce.StripeID != c.StripeID || billing.StopsRun(err) {
		t.Fatalf("err = %v, want ErrNeedsReconciliation naming %s, not stopping a run", err, c.StripeID)
	}
	// Lines 0 and 1 are found on the draft; line 2 is refused.
	e.wantHeldDraft("claim")
	if n := len(e.srv.Invoices("cus_1")); n != 1 {
		t.Fatalf("%d invoices", n)
	}
}

// A declined invoice is left open for Stripe to collect, as Invoice's
// documentation says, only if the invoice has automatic collection: Stripe
// retries nothing on an invoice whose auto_advance is false ("you're
// responsible for transitioning the invoice between states"). billonce
// finalizes with auto_advance false and never pays the open invoice again,
// and its claim (processing) keeps the period from being billed any other
// way: nothing ever collects it.
func TestInvoiceDeclinedIsLeftForStripeToCollect(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.Decline("cus_1", "insufficient_funds")
	r, err := e.b.Invoice(context.Background(), "cus_1", period, threeLines())
	if err != nil || !r.Processing {
		t.Fatalf("declined invoice = %+v, %v; want a processing receipt", r, err)
	}
	in, err := e.invoices().Get(r.StripeID, nil)
	if err != nil {
		t.Fatal(err)
	}
	if in.Status != "open" || !in.AutoAdvance {
		t.Fatalf("invoice %s is %s with auto_advance %v: nothing will collect it", in.ID, in.Status, in.AutoAdvance)
	}
}
