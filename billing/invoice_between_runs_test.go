package billing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/invoiceitem"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// stopBefore makes the first request of step fail before Stripe executes
// it, after which every read fails: with one attempt the call ends with
// an unknown outcome and leaves the claim pending at the step before, as
// a runner that crashed between two steps.
func (e *env) stopBefore(b *billing.Biller, customer, step string, inv *billing.Invoice) {
	e.tb.Helper()
	match := stepMatcher(step)
	var once sync.Once
	var stopped atomic.Bool
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		hit := false
		if match(r) {
			once.Do(func() { hit = true })
		}
		if hit {
			stopped.Store(true)
		}
		if hit || r.Method == http.MethodGet && stopped.Load() {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	defer e.srv.SetScript(nil)
	if _, err := b.Invoice(context.Background(), customer, period, inv); !errors.Is(err, billing.ErrOutcomeUnknown) {
		e.tb.Fatalf("invoice stopped before %s = %v, want ErrOutcomeUnknown", step, err)
	}
}

// An invoice resumed with other lines of the same total (Config.Invoice
// changed between two runs) is not finished as a mix of both: the lines
// the first run added stay, so adding the new run's remaining lines bills
// an invoice that is neither, whose total is not the receipt's. Nothing is
// finalized or paid; the claim waits for a person. A flow that checks only
// the total before resuming finalizes and pays the mix.
func TestInvoiceResumedWithOtherLinesIsNotFinishedAsAMix(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	first := threeLines() // 1000 + 250 + 40
	e.stopBefore(e.b, "cus_1", "line 2", first)
	e.wantHeldDraft("claim")
	changed := threeLines()
	changed.Lines[1].Amount, changed.Lines[2].Amount = 200, 90 // 1000 + 200 + 90: the same total
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, changed)
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices", len(all))
	}
	got := all[0]
	var total int64
	for _, l := range got.Lines {
		total += l.Amount
	}
	if err == nil {
		t.Fatalf("receipt %+v for invoice %s %s with lines %+v (total %d): the invoice is neither the first run's nor the second's", r, got.ID, got.Status, got.Lines, total)
	}
	// Line 1, listed on the draft with another amount, is not this
	// call's: the draft waits for a person.
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Fatalf("err = %v, want ErrNeedsReconciliation", err)
	}
	if got.Status != "draft" || got.Finalizations != 0 || got.Payments != 0 {
		t.Fatalf("invoice %s is %s (%d finalizations, %d payments), want a draft left as it is", got.ID, got.Status, got.Finalizations, got.Payments)
	}
	if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending {
		t.Fatalf("claim %s, want pending", c.State)
	}
}

// A draft sent late in its claim's window (its first tries failed before
// Stripe executed anything), then resumed with a rotated key while
// Stripe's search lags by a quarter of an hour: a day has passed since the
// claim's window started, but the draft is only twelve minutes old, so the
// search's "nothing" proves nothing, and the new key's requests do not
// meet the old key's at Stripe. A flow that trusts the search once a day
// has passed since the window started makes a second invoice. (With the
// default WindowMargin the same happens when search lags by over an hour.)
func TestInvoiceRotatedKeyAfterALateDraftMakesNoSecondInvoice(t *testing.T) {
	t.Parallel()
	margin := func(c *billing.Config) { c.WindowMargin = 23*time.Hour + 54*time.Minute }
	e := newEnvWith(t, billingtest.Config{SearchDelay: 15 * time.Minute}, oneAttempt, margin)
	inv := threeLines()
	e.stopBefore(e.b, "cus_1", "draft", inv) // the claim's window starts; nothing at Stripe
	e.advance(23*time.Hour + 50*time.Minute)
	e.crashAt(e.b, "cus_1", "draft", inv) // the draft, late in the window, its answer lost
	e.advance(12 * time.Minute)
	rotated := e.biller(oneAttempt, margin, func(c *billing.Config) { c.SecretKey = "sk_test_51BillonceRotatedKey000000000000000000wxyz" })
	_, err := rotated.Invoice(context.Background(), "cus_1", period, inv)
	if n := len(e.srv.Invoices("cus_1")); n != 1 {
		t.Fatalf("%d invoices after the rotated key's call (err %v), want 1", n, err)
	}
	if err == nil {
		t.Fatal("the rotated key's call succeeded while the draft was not searchable yet")
	}
}

// lateLanding carries the first request that match picks as a network
// that has already taken it does: the fake gets it only once release is
// closed, whether or not its caller still waits. The caller gets no
// answer; it waits until its context ends. held is closed when the request
// is taken, landed once the fake has answered it.
type lateLanding struct {
	match                 func(*http.Request) bool
	held, release, landed chan struct{}
	once                  sync.Once
}

func newLateLanding(match func(*http.Request) bool) *lateLanding {
	return &lateLanding{match: match, held: make(chan struct{}), release: make(chan struct{}), landed: make(chan struct{})}
}

func (t *lateLanding) RoundTrip(r *http.Request) (*http.Response, error) {
	first := false
	if t.match(r) {
		t.once.Do(func() { first = true })
	}
	if !first {
		return testTransport.RoundTrip(r)
	}
	body, err := io.ReadAll(r.Body)
	r.Body.Close()
	if err != nil {
		return nil, err
	}
	out := r.Clone(context.WithoutCancel(r.Context()))
	out.Body, out.GetBody, out.ContentLength = io.NopCloser(bytes.NewReader(body)), nil, int64(len(body))
	go func() {
		defer close(t.landed)
		<-t.release
		if res, err := testTransport.RoundTrip(out); err == nil {
			io.Copy(io.Discard, res.Body)
			res.Body.Close()
		}
	}()
	close(t.held)
	<-r.Context().Done()
	return nil, r.Context().Err()
}

// A line sent with the old Stripe key is still on its way when its caller
// gives up, and the claim is released; a Biller with the rotated key
// resumes at once. Listing the draft's lines finds none, which proves
// nothing: the old key's request may still land, and the new key's
// request with the same idempotency key would not meet it at Stripe. As
// for a charge's search under another credential, nothing is written
// until the key's window has passed; then the listing settles the step.
// A flow that trusts the listing adds the line under the new key, the old
// request lands too, and the invoice is paid with the line twice.
func TestInvoiceRotatedKeyWaitsForALineStillOnItsWay(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	inv := threeLines()
	late := newLateLanding(func(r *http.Request) bool { return r.Method == http.MethodPost && r.URL.Path == "/v1/invoiceitems" })
	old := e.biller(func(c *billing.Config) { c.HTTPClient = &http.Client{Transport: late} })
	ctx, giveUp := context.WithCancel(context.Background())
	oldDone := make(chan error, 1)
	go func() { _, err := old.Invoice(ctx, "cus_1", period, inv); oldDone <- err }()
	<-late.held // the draft is recorded; line 0 is on its way
	giveUp()
	if err := <-oldDone; !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("the old key's call, given up while line 0 was on its way = %v, want ErrOutcomeUnknown", err)
	}
	if c := e.wantHeldDraft("claim"); c.LeaseUntil.After(time.Now()) {
		t.Fatalf("claim's lease until %s; want it released", c.LeaseUntil)
	}

	var landOnce sync.Once
	land := func() { landOnce.Do(func() { close(late.release); <-late.landed }) }
	rotated := e.biller(func(c *billing.Config) {
		c.SecretKey = rotatedKey
		c.Observe = func(ev billing.Event) {
			if ev.Kind == billing.EventStripeCall && ev.Err == nil {
				land() // the old request lands once the rotated key has written
			}
		}
	})
	r, err := rotated.Invoice(context.Background(), "cus_1", period, inv)
	land()
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices, want 1", len(all))
	}
	got := all[0]
	zeros := 0
	var lines []string // amount#index
	for _, l := range got.Lines {
		if l.Metadata["billonce_line"] == "0" {
			zeros++
		}
		lines = append(lines, fmt.Sprintf("%d#%s", l.Amount, l.Metadata["billonce_line"]))
	}
	if zeros != 1 || got.Payments > 1 {
		t.Fatalf("invoice %s is %s, paid %d times, with line 0 %d times (lines %v); the rotated key's call = %+v, %v",
			got.ID, got.Status, got.Payments, zeros, lines, r, err)
	}
	if err == nil {
		e.wantOneInvoice("cus_1", inv, "paid", 1)
		return
	}
	if !errors.Is(err, billing.ErrSentElsewhere) || got.Status != "draft" {
		t.Fatalf("the rotated key's call = %v with invoice %s %s; want ErrSentElsewhere and the draft left as it is", err, got.ID, got.Status)
	}

	// Once the key's window has passed, the listing settles the step: the
	// old key's line is taken, and the invoice finished once.
	e.advance(25 * time.Hour)
	if r, err = rotated.Invoice(context.Background(), "cus_1", period, inv); err != nil {
		t.Fatal(err)
	}
	if paid := e.wantOneInvoice("cus_1", inv, "paid", 1); r.StripeID != paid.ID || r.Amount != 1290 {
		t.Fatalf("receipt %+v for invoice %s", r, paid.ID)
	}
}

// addedByHand adds an item of amount to customer's draft invoiceID as a
// person on Stripe's dashboard, or other code, would: with a key of its
// own and none of billonce's metadata. It returns the item's id.
func (e *env) addedByHand(customer, invoiceID string, amount int64) string {
	e.tb.Helper()
	items := &invoiceitem.Client{B: stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(e.srv.URL),
		LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull}}), Key: secretKey}
	p := &stripe.InvoiceItemParams{Customer: stripe.String(customer), Invoice: stripe.String(invoiceID),
		Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Description: stripe.String("Added by hand")}
	p.IdempotencyKey = stripe.String("by-hand-" + invoiceID)
	it, err := items.New(p)
	if err != nil {
		e.tb.Errorf("adding an item to %s by hand: %v", invoiceID, err)
		return ""
	}
	return it.ID
}

// addByHandAtFinalize has the fake add an item of amount to customer's
// invoice by hand, once, as billonce finalizes it, the way a person in the
// dashboard might at that moment. The returned function tells the item's
// id once it is added.
func (e *env) addByHandAtFinalize(customer string, amount int64) func() string {
	var mu sync.Mutex
	var item string
	var once sync.Once
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/finalize") {
			id := strings.TrimSuffix(strings.TrimPrefix(r.Path, "/v1/invoices/"), "/finalize")
			once.Do(func() {
				it := e.addedByHand(customer, id, amount)
				mu.Lock()
				item = it
				mu.Unlock()
			})
		}
		return billingtest.Fault{}
	})
	return func() string {
		mu.Lock()
		defer mu.Unlock()
		return item
	}
}

// An item someone else added to billonce's draft (a person on the
// dashboard, other code) is not paid as if it were billonce's: the claim
// and the receipt record the total of billonce's lines. The lines are
// listed before the invoice is finalized, and an item that is not one of
// them leaves the invoice a draft; one added as the invoice is finalized
// shows in its total, which is checked before it is paid: the invoice is
// left open, its automatic collection off, and unpaid. Either way the
// claim waits for a person, with ErrNeedsReconciliation naming what
// differs. A flow that finalizes and pays whatever the draft holds bills
// the customer more than its receipt says.
func TestInvoiceWithAnItemBillonceDidNotAddIsNotPaid(t *testing.T) {
	t.Parallel()
	const extra = 999
	for name, tc := range map[string]struct {
		status string // the invoice's, left for a person
		// add bills inv for cus_1 with e, adding an item by hand at some
		// point; it returns the item's id and the call's error.
		add func(e *env, inv *billing.Invoice) (string, error)
	}{
		"between two calls": {"draft", func(e *env, inv *billing.Invoice) (string, error) {
			e.stopBefore(e.b, "cus_1", "finalize", inv)
			item := e.addedByHand("cus_1", e.invoiceClaim("cus_1").StripeID, extra)
			_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			return item, err
		}},
		"between two steps of one call": {"draft", func(e *env, inv *billing.Invoice) (string, error) {
			var item string
			writes := 0
			b := e.biller(oneAttempt, func(c *billing.Config) {
				c.Observe = func(ev billing.Event) {
					if ev.Kind == billing.EventStripeCall && ev.Err == nil {
						if writes++; writes == 1+len(inv.Lines) { // the draft and its lines are there
							item = e.addedByHand("cus_1", e.srv.Invoices("cus_1")[0].ID, extra)
						}
					}
				}
			})
			_, err := b.Invoice(context.Background(), "cus_1", period, inv)
			return item, err
		}},
		"as it is finalized": {"open", func(e *env, inv *billing.Invoice) (string, error) {
			item := e.addByHandAtFinalize("cus_1", extra)
			_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			e.srv.SetScript(nil)
			return item(), err
		}},
		// Turning the collection off is sent without looking first, even by
		// a Biller with another credential, whose lookups wait out the old
		// key's window: Stripe would collect the invoice meanwhile.
		"as it is finalized, then resumed by a rotated key": {"open", func(e *env, inv *billing.Invoice) (string, error) {
			var item string
			var once sync.Once
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				id, update := strings.CutPrefix(r.Path, "/v1/invoices/in_")
				switch {
				case r.Method != http.MethodPost:
				case strings.HasSuffix(r.Path, "/finalize"):
					once.Do(func() { item = e.addedByHand("cus_1", "in_"+strings.TrimSuffix(id, "/finalize"), extra) })
				case update && !strings.Contains(id, "/"):
					return billingtest.Fault{Kind: billingtest.FaultErrorBefore} // the old key's runner stops there
				}
				return billingtest.Fault{}
			})
			_, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			e.srv.SetScript(nil)
			if err == nil || item == "" {
				e.tb.Fatalf("the old key's call = %v with item %q, want an error", err, item)
			}
			_, err = e.biller(oneAttempt, func(c *billing.Config) { c.SecretKey = rotatedKey }).Invoice(context.Background(), "cus_1", period, inv)
			return item, err
		}},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			item, err := tc.add(e, inv)
			all := e.srv.Invoices("cus_1")
			if len(all) != 1 || item == "" {
				t.Fatalf("%d invoices, item %q", len(all), item)
			}
			got := all[0]
			var ce *billing.ChargeError
			if err == nil || got.Payments != 0 {
				var total int64
				for _, l := range got.Lines {
					total += l.Amount
				}
				t.Fatalf("invoice %s is %s, paid %d times for %d (the item %s of %d added by hand among its lines), while the claim records %d; the call = %v",
					got.ID, got.Status, got.Payments, total, item, extra, e.invoiceClaim("cus_1").Amount, err)
			}
			t.Logf("left for a person: %v", err)
			if !errors.Is(err, billing.ErrNeedsReconciliation) || !errors.As(err, &ce) || ce.StripeID != got.ID {
				t.Fatalf("err = %v, want ErrNeedsReconciliation naming invoice %s", err, got.ID)
			}
			if want := map[string]string{"draft": item, "open": strconv.Itoa(1290 + extra)}[tc.status]; !strings.Contains(err.Error(), want) {
				t.Errorf("err = %v, want it to name %s", err, want)
			}
			finalized := map[string]int{"draft": 0, "open": 1}[tc.status]
			if pays := invoicePosts(e.srv.Log())["pay"]; got.Status != tc.status || got.Finalizations != finalized || pays != 0 {
				t.Fatalf("invoice %s is %s after %d finalizations and %d payment requests, want %s, %d and none",
					got.ID, got.Status, got.Finalizations, pays, tc.status, finalized)
			}
			if c := e.invoiceClaim("cus_1"); c.State != claim.StatePending {
				t.Fatalf("claim %s, want pending", c.State)
			}
			// Nothing collects it meanwhile, and calling again changes nothing.
			if in, err := e.invoices().Get(got.ID, nil); err != nil || in.AutoAdvance {
				t.Fatalf("invoice %s has auto_advance %v (%v): Stripe would collect it", got.ID, in.AutoAdvance, err)
			}
			if _, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv); !errors.Is(err, billing.ErrNeedsReconciliation) {
				t.Fatalf("calling again = %v, want ErrNeedsReconciliation", err)
			}
			if again := e.srv.Invoices("cus_1")[0]; again.Status != tc.status || again.Payments != 0 {
				t.Fatalf("after calling again, invoice %s is %s with %d payments", again.ID, again.Status, again.Payments)
			}
		})
	}
}

// An invoice whose finalized total is not its claim's (an item added by
// hand as it was finalized) is left for a person, and Stripe must not
// collect it meanwhile: not when the call that found the mismatch could
// not turn collection off (Stripe unreachable just then), nor when the
// runner stopped right after finalizing, before it read the total. Hours
// pass before the next call: Stripe's automatic collection charges an
// open invoice with auto_advance on an hour after it is finalized.
func TestInvoiceWithAWrongTotalIsNotCollectedByStripeBeforeTheNextCall(t *testing.T) {
	t.Parallel()
	const extra = 999
	for name, stopAt := range map[string]func(r billingtest.Request) bool{
		"turning collection off fails": func(r billingtest.Request) bool {
			id, update := strings.CutPrefix(r.Path, "/v1/invoices/in_")
			return r.Method == http.MethodPost && update && !strings.Contains(id, "/")
		},
		"the runner stops after finalizing": func(r billingtest.Request) bool { return r.Method == http.MethodGet },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			inv := threeLines()
			var item string
			var once sync.Once
			var finalized atomic.Bool
			e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method == http.MethodPost && strings.HasSuffix(r.Path, "/finalize") {
					id := strings.TrimSuffix(strings.TrimPrefix(r.Path, "/v1/invoices/"), "/finalize")
					once.Do(func() { item = e.addedByHand("cus_1", id, extra) })
					finalized.Store(true)
					if name == "the runner stops after finalizing" {
						return billingtest.Fault{Kind: billingtest.FaultCut}
					}
					return billingtest.Fault{}
				}
				if finalized.Load() && stopAt(r) {
					return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
				}
				return billingtest.Fault{}
			})
			_, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
			e.srv.SetScript(nil)
			if err == nil || item == "" {
				t.Fatalf("the call = %v with item %q, want an error", err, item)
			}
			e.advance(2 * time.Hour)
			_, err = e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
			all := e.srv.Invoices("cus_1")
			if len(all) != 1 {
				t.Fatalf("%d invoices", len(all))
			}
			if got := all[0]; got.Payments != 0 || got.Status != "open" {
				t.Fatalf("invoice %s is %s, paid %d times, with the item %s of %d added by hand; the claim records %d; the next call = %v",
					got.ID, got.Status, got.Payments, item, extra, e.invoiceClaim("cus_1").Amount, err)
			}
			if !errors.Is(err, billing.ErrNeedsReconciliation) {
				t.Errorf("the next call = %v, want ErrNeedsReconciliation", err)
			}
		})
	}
}

// A credit item someone else adds to billonce's draft as it is finalized
// (after its lines were checked) brings its total to zero, and Stripe marks
// it paid at once: the customer paid nothing. The call must not report the
// period billed for the claim's total with a nil error; the total that
// differs is reported for a person, as for an open invoice.
func TestInvoicePaidAtFinalizationWithAnotherTotalIsReported(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.addByHandAtFinalize("cus_1", -1290)
	r, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
	e.srv.SetScript(nil)
	got := e.srv.Invoices("cus_1")[0]
	var total int64
	for _, l := range got.Lines {
		total += l.Amount
	}
	if total != 0 || got.Status != "paid" || got.Payments != 0 {
		t.Fatalf("invoice %s is %s with a total of %d and %d payments, want paid at finalization for 0 by nobody", got.ID, got.Status, total, got.Payments)
	}
	if err == nil {
		t.Errorf("Invoice = %+v, nil: the period is reported billed for %d %s, while invoice %s's total is %d and nobody paid it", r, r.Amount, r.Currency, got.ID, total)
	}
}

// An invoice finalized with another total than the claim's is left open
// and unpaid for a person (see above). A person who writes it off marks it
// uncollectible, which Stripe can still pay: the next call must not pay it
// either, at a total the receipt would not report. Its total is checked
// for every final invoice billonce may pay, not for open ones alone.
func TestInvoiceWithAWrongTotalMarkedUncollectibleIsNotPaid(t *testing.T) {
	t.Parallel()
	const extra = 999
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	item := e.addByHandAtFinalize("cus_1", extra)
	_, err := e.b.Invoice(context.Background(), "cus_1", period, inv)
	e.srv.SetScript(nil)
	if !errors.Is(err, billing.ErrNeedsReconciliation) || item() == "" {
		t.Fatalf("the call = %v with item %q, want ErrNeedsReconciliation", err, item())
	}
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 || all[0].Status != "open" || all[0].Payments != 0 {
		t.Fatalf("invoices after the first call: %+v", all)
	}
	if _, err := e.invoices().MarkUncollectible(all[0].ID, nil); err != nil {
		t.Fatalf("marking %s uncollectible: %v", all[0].ID, err)
	}
	e.advance(2 * time.Hour)
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	all = e.srv.Invoices("cus_1")
	if len(all) != 1 {
		t.Fatalf("%d invoices", len(all))
	}
	if got := all[0]; got.Payments != 0 {
		t.Fatalf("invoice %s, with the item %s of %d added by hand and marked uncollectible, was paid %d times (%s); the claim records %d; the next call = %+v, %v",
			got.ID, item(), extra, got.Payments, got.Status, e.invoiceClaim("cus_1").Amount, r, err)
	}
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("the next call = %v, want ErrNeedsReconciliation", err)
	}
}

// An invoice a person marked uncollectible (written off) while its claim
// was pending, its payment not made, is not charged by the next call:
// Stripe no longer collects it, and invoice.marked_uncollectible makes its
// claim processing, not paid. A resume treats it the same way whether or
// not that event came first.
func TestInvoiceMarkedUncollectibleBeforeItsPaymentIsNotCharged(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	inv := threeLines()
	e.stopBefore(e.biller(oneAttempt), "cus_1", "pay", inv)
	all := e.srv.Invoices("cus_1")
	if len(all) != 1 || all[0].Status != "open" || all[0].Payments != 0 {
		t.Fatalf("invoices after the stopped call: %+v", all)
	}
	if _, err := e.invoices().MarkUncollectible(all[0].ID, nil); err != nil {
		t.Fatalf("marking %s uncollectible: %v", all[0].ID, err)
	}
	r, err := e.biller(oneAttempt).Invoice(context.Background(), "cus_1", period, inv)
	if got := e.srv.Invoices("cus_1"); len(got) != 1 || got[0].Payments != 0 {
		t.Fatalf("invoice written off by a person was charged: %+v; the call = %+v, %v", got, r, err)
	}
	if err != nil || !r.Processing {
		t.Errorf("the call = %+v, %v; want a processing receipt, as the invoice's event makes the claim", r, err)
	}
}

// The invoice paid at finalization for another total (above) is not
// settled by its invoice.paid event either: that event is about the
// claim's invoice, but not for the claim's amount, so the claim is not
// taken as billed, and the next call still reports it for a person.
func TestInvoicePaidAtFinalizationWithAnotherTotalIsNotSettledByItsEvent(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	inv := threeLines()
	h.addByHandAtFinalize("cus_1", -1290)
	_, err := h.b.Invoice(context.Background(), "cus_1", period, inv)
	h.srv.SetScript(nil)
	if err == nil {
		t.Fatalf("Invoice of an invoice paid at finalization for 0 = nil, want it reported")
	}
	got := h.srv.Invoices("cus_1")[0]
	if got.Status != "paid" {
		t.Fatalf("invoice %s is %s, want paid at finalization", got.ID, got.Status)
	}
	h.deliverAll()
	if c := h.invoiceClaim("cus_1"); c.State == claim.StateSucceeded {
		t.Errorf("after invoice %s's events the claim is %s, want it not succeeded: the invoice's total is 0, the claim's %d", got.ID, c.State, c.Amount)
	}
	if r, err := h.b.Invoice(context.Background(), "cus_1", period, inv); err == nil {
		t.Errorf("Invoice after the events = %+v, nil: the period is reported billed for %d %s, while invoice %s's total is 0 and nobody paid it", r, r.Amount, r.Currency, got.ID)
	}
}
