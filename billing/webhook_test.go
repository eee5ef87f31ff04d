package billing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

const whsec = "whsec_billonceTestSigningSecretNeverLog0000"

// hookEnv is an env with a webhook endpoint served by its Biller, and
// what the Biller reported.
type hookEnv struct {
	*env
	url    string
	logs   *syncBuffer
	mu     sync.Mutex
	events []billing.Event // from EventSettled to EventNotApplied
	// results holds the Result of every EventWebhook, in order.
	results []string
}

func newHookEnv(t *testing.T, api billing.API, async map[string]billingtest.Async) *hookEnv {
	t.Helper()
	return newHookEnvWith(t, api, billingtest.Config{Async: async})
}

// newHookEnvWith is newHookEnv on a fake configured with srvCfg.
func newHookEnvWith(t *testing.T, api billing.API, srvCfg billingtest.Config) *hookEnv {
	t.Helper()
	h := &hookEnv{logs: &syncBuffer{}}
	h.env = newEnvWith(t, srvCfg, func(c *billing.Config) {
		c.API = api
		c.Logger = slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
		c.Observe = func(e billing.Event) {
			h.mu.Lock()
			defer h.mu.Unlock()
			switch {
			case e.Kind == billing.EventWebhook:
				h.results = append(h.results, e.Result)
			case e.Kind >= billing.EventSettled && e.Kind <= billing.EventNotApplied:
				h.events = append(h.events, e)
			}
		}
	})
	handler, err := h.b.Webhook(billing.WebhookConfig{Secret: whsec})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(handler)
	t.Cleanup(srv.Close)
	h.url = srv.URL
	return h
}

// post delivers body with the given Stripe-Signature and returns the answer.
func (h *hookEnv) post(body []byte, sig string) (int, string) {
	h.tb.Helper()
	req, _ := http.NewRequest(http.MethodPost, h.url, bytes.NewReader(body))
	if sig != "" {
		req.Header.Set("Stripe-Signature", sig)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// deliver delivers ev signed as Stripe would, and wants 200.
func (h *hookEnv) deliver(ev billingtest.Event) string {
	h.tb.Helper()
	status, body := h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
	if status != http.StatusOK {
		h.tb.Fatalf("delivering %s %s: %d %s", ev.ID, ev.Type, status, body)
	}
	return body
}

// eventsOf returns the fake's events about object id, in order.
func (h *hookEnv) eventsOf(id string) []billingtest.Event {
	var out []billingtest.Event
	for _, e := range h.srv.Events() {
		if e.ObjectID == id {
			out = append(out, e)
		}
	}
	return out
}

func (h *hookEnv) eventRows() int {
	h.tb.Helper()
	var n int
	if err := h.pool.QueryRow(context.Background(), "SELECT count(*) FROM billonce_claims_events").Scan(&n); err != nil {
		h.tb.Fatal(err)
	}
	return n
}

func (h *hookEnv) observed() []billing.Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]billing.Event(nil), h.events...)
}

// webhookResults returns the Result of every EventWebhook so far.
func (h *hookEnv) webhookResults() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.results...)
}

// Every event type the handler knows, from the fake's own events, for
// both APIs: processing, then settled or failed with the failure code;
// refunds and disputes recorded without changing the state.
func TestWebhookEveryEventType(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, map[string]billingtest.Async{
				"cus_ok":   {After: time.Hour},
				"cus_fail": {After: time.Hour, FailureCode: "insufficient_funds"},
			})
			h.srv.Decline("cus_card", "insufficient_funds")
			ctx := context.Background()
			for _, c := range []string{"cus_ok", "cus_fail"} {
				r, err := h.b.Charge(ctx, c, period, nil)
				if err != nil || !r.Processing || r.Outcome != billing.Created {
					t.Fatalf("Charge(%s) = %+v, %v; want a created, processing receipt", c, r, err)
				}
			}
			if _, err := h.b.Charge(ctx, "cus_card", period, nil); err == nil {
				t.Fatal("the declined customer was charged")
			}
			rSync, err := h.b.Charge(ctx, "cus_sync", period, nil)
			if err != nil {
				t.Fatal(err)
			}
			ok, fail := h.claimOf("cus_ok"), h.claimOf("cus_fail")
			for _, c := range []claim.Claim{ok, fail} {
				if c.State != claim.StateProcessing || c.ProcessingAt.IsZero() {
					t.Fatalf("claim after Stripe answered processing = %+v", c)
				}
			}

			// The creation events: processing (already known), the
			// synchronous success and the card decline (already known).
			for _, id := range []string{ok.StripeID, fail.StripeID, rSync.StripeID} {
				for _, ev := range h.eventsOf(id) {
					if got := h.deliver(ev); got != "unchanged" {
						t.Errorf("%s for a claim that knew it answered %q, want unchanged", ev.Type, got)
					}
				}
			}
			h.srv.Advance(2 * time.Hour) // the bank debits settle
			wantTypes := map[billing.API][2]string{
				billing.Charges:        {"charge.succeeded", "charge.failed"},
				billing.PaymentIntents: {"payment_intent.succeeded", "payment_intent.payment_failed"},
			}[api]
			for i, id := range []string{ok.StripeID, fail.StripeID} {
				evs := h.eventsOf(id)
				last := evs[len(evs)-1]
				if last.Type != wantTypes[i] {
					t.Fatalf("settlement event = %s, want %s", last.Type, wantTypes[i])
				}
				if got := h.deliver(last); got != "changed" {
					t.Fatalf("%s answered %q, want changed", last.Type, got)
				}
			}
			if c := h.claimOf("cus_ok"); c.State != claim.StateSucceeded || c.SettledAt.IsZero() {
				t.Errorf("settled claim = %+v", c)
			}
			c := h.claimOf("cus_fail")
			if c.State != claim.StateFailed || c.FailureCode != "insufficient_funds" || c.ProcessingAt.IsZero() {
				t.Errorf("failed claim = %+v", c)
			}

			// A refund and a dispute on the settled payment: recorded,
			// the claim stays succeeded.
			if err := h.srv.Refund(ok.StripeID, 1000); err != nil {
				t.Fatal(err)
			}
			if _, err := h.srv.Dispute(ok.StripeID, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			evs := h.eventsOf(ok.StripeID)
			for _, ev := range evs[len(evs)-2:] {
				if got := h.deliver(ev); got != "changed" {
					t.Fatalf("%s answered %q, want changed", ev.Type, got)
				}
			}
			c = h.claimOf("cus_ok")
			if c.State != claim.StateSucceeded || c.Refunded != 1000 || !strings.HasSuffix(c.Dispute, "(fraudulent)") {
				t.Errorf("refunded and disputed claim = %+v", c)
			}

			var kinds []string
			for _, e := range h.observed() {
				kinds = append(kinds, fmt.Sprintf("%d:%s:%s", e.Kind, e.Customer, e.State))
				if e.Key != h.key(e.Customer) {
					t.Errorf("%v event for %s has key %q; want the claim's %q", e.Kind, e.Customer, e.Key, h.key(e.Customer))
				}
				var fe *billing.ChargeError
				if e.Kind == billing.EventSettled && e.State == "failed" && (!errors.As(e.Err, &fe) || !errors.Is(e.Err, billing.ErrDeclined) || !fe.AfterProcessing || fe.Code != "insufficient_funds") {
					t.Errorf("failure event = %+v", e)
				}
			}
			want := fmt.Sprintf("[%d:cus_ok:succeeded %d:cus_fail:failed %d:cus_ok: %d:cus_ok:]",
				billing.EventSettled, billing.EventSettled, billing.EventRefunded, billing.EventDisputed)
			if fmt.Sprint(kinds) != want {
				t.Errorf("observed %v, want %s", kinds, want)
			}
			for _, line := range []string{"payment refunded; the claim stays billed", "payment disputed; the claim stays billed", "payment failed after it was sent"} {
				if !strings.Contains(h.logs.String(), line) {
					t.Errorf("no log line %q", line)
				}
			}
			// Nobody was charged twice; the failed bank debit moved nothing.
			for c, want := range map[string]int{"cus_ok": 1, "cus_fail": 0, "cus_card": 0, "cus_sync": 1} {
				if got := h.srv.CountPeriod(c, period); got != want {
					t.Errorf("%s paid %d times, want %d", c, got, want)
				}
			}
		})
	}
}

// The same event delivered five times is applied once: one "changed",
// four "duplicate", one row in the events table, the claim untouched
// after the first.
func TestWebhookSameEventFiveTimes(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_1": {After: time.Minute}})
	r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Advance(time.Hour)
	evs := h.eventsOf(r.StripeID)
	ev := evs[len(evs)-1]
	var answers []string
	var first claim.Claim
	for i := range 5 {
		answers = append(answers, h.deliver(ev))
		if i == 0 {
			first = h.claimOf("cus_1")
		}
	}
	if fmt.Sprint(answers) != "[changed duplicate duplicate duplicate duplicate]" {
		t.Errorf("answers = %v", answers)
	}
	if c := h.claimOf("cus_1"); c.UpdatedAt != first.UpdatedAt || c.State != claim.StateSucceeded {
		t.Errorf("claim after duplicates = %+v, after the first = %+v", c, first)
	}
	if n := h.eventRows(); n != 1 {
		t.Errorf("%d event rows, want 1", n)
	}
	if n := len(h.observed()); n != 1 {
		t.Errorf("observed %d settlements, want 1", n)
	}
}

func permutations(n int) [][]int {
	if n == 0 {
		return [][]int{{}}
	}
	var out [][]int
	for _, p := range permutations(n - 1) {
		for i := 0; i <= len(p); i++ {
			out = append(out, append(append(append([]int{}, p[:i]...), n-1), p[i:]...))
		}
	}
	return out
}

// The four events of one payment (pending, succeeded, refunded, disputed)
// delivered in each of their 24 orders leave the same claim.
func TestWebhookEveryOrder(t *testing.T) {
	t.Parallel()
	orders := permutations(4)
	async := map[string]billingtest.Async{}
	for i := range orders {
		async[fmt.Sprintf("cus_%02d", i)] = billingtest.Async{After: time.Minute}
	}
	h := newHookEnv(t, billing.Charges, async)
	ctx := context.Background()
	ids := map[string]string{}
	for c := range async {
		r, err := h.b.Charge(ctx, c, period, nil)
		if err != nil {
			t.Fatal(err)
		}
		ids[c] = r.StripeID
	}
	h.srv.Advance(time.Hour)
	for c, id := range ids {
		if err := h.srv.Refund(id, 0); err != nil {
			t.Fatal(err)
		}
		if _, err := h.srv.Dispute(id, "duplicate"); err != nil {
			t.Fatal(err)
		}
		_ = c
	}
	for i, order := range orders {
		c := fmt.Sprintf("cus_%02d", i)
		evs := h.eventsOf(ids[c])
		if len(evs) != 4 {
			t.Fatalf("%s has %d events, want 4", c, len(evs))
		}
		for _, j := range order {
			h.deliver(evs[j])
		}
		got := h.claimOf(c)
		if got.State != claim.StateSucceeded || got.Refunded != amount || !strings.HasSuffix(got.Dispute, "(duplicate)") ||
			!got.EventAt.Equal(evs[3].Created.Truncate(time.Second)) {
			t.Errorf("order %v left %s as %+v", order, c, got)
		}
	}
}

// A delivery whose signature is missing, malformed, wrong, expired, or
// made with another secret is refused with 400 and changes nothing; the
// log says why without the body, the header or the secret.
func TestWebhookBadSignatures(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_1": {After: time.Minute}})
	r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Advance(time.Hour)
	evs := h.eventsOf(r.StripeID)
	ev := evs[len(evs)-1]
	tampered := bytes.Replace(ev.Body, []byte(`"succeeded"`), []byte(`"failed"`), 1)
	now := time.Now()
	for name, c := range map[string]struct {
		body []byte
		sig  string
		want string
	}{
		"none":          {ev.Body, "", "no Stripe-Signature header"},
		"malformed":     {ev.Body, "t=abc,v1", "malformed Stripe-Signature header"},
		"other secret":  {ev.Body, billingtest.Sign(ev.Body, "whsec_someoneElse", now), "no valid signature"},
		"tampered body": {tampered, billingtest.Sign(ev.Body, whsec, now), "no valid signature"},
		"expired":       {ev.Body, billingtest.Sign(ev.Body, whsec, now.Add(-10*time.Minute)), "outside the tolerance"},
		"not an event":  {[]byte(`{"id": `), billingtest.Sign([]byte(`{"id": `), whsec, now), "not a Stripe event"},
	} {
		status, body := h.post(c.body, c.sig)
		if status != http.StatusBadRequest || !strings.Contains(body, c.want) {
			t.Errorf("%s: %d %q, want 400 saying %q", name, status, body, c.want)
		}
	}
	if c := h.claimOf("cus_1"); c.State != claim.StateProcessing {
		t.Errorf("claim after refused deliveries = %+v", c)
	}
	if n := h.eventRows(); n != 0 {
		t.Errorf("%d event rows after refused deliveries, want 0", n)
	}
	logs := h.logs.String()
	for _, secret := range []string{whsec, "whsec_someoneElse", "v1=", string(ev.Body[:40]), "t=abc"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the log holds %q:\n%s", secret, logs)
		}
	}
	if !strings.Contains(logs, "webhook refused") {
		t.Errorf("no log line for the refusals:\n%s", logs)
	}
	// And the genuine delivery still applies.
	if got := h.deliver(ev); got != "changed" {
		t.Errorf("genuine delivery answered %q", got)
	}
	if status, _ := h.post(nil, ""); status != http.StatusBadRequest {
		t.Errorf("empty POST answered %d", status)
	}
	req, _ := http.NewRequest(http.MethodGet, h.url, nil)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("GET answered %v, %v", resp, err)
	}
}

// Events of other types, and events about payments without billonce's
// metadata or whose key has no claim here, are acknowledged and change
// nothing.
func TestWebhookIgnoresOthers(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	// A charge made by other code: no metadata.
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{URL: stripe.String(h.srv.URL), MaxNetworkRetries: stripe.Int64(0)})
	cc := charge.Client{B: backend, Key: secretKey}
	//idemvet:ignore a charge made by other code, which sends no key
	if _, err := cc.New(&stripe.ChargeParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"), Customer: stripe.String("cus_other")}); err != nil {
		t.Fatal(err)
	}
	// A charge with billonce's metadata whose claim is in another table.
	p := &stripe.ChargeParams{Amount: stripe.Int64(100), Currency: stripe.String("usd"), Customer: stripe.String("cus_elsewhere")}
	p.Metadata = map[string]string{billing.MetaKey: "bk1_elsewhere", billing.MetaCustomer: "cus_elsewhere", billing.MetaPeriod: period}
	//idemvet:ignore a charge made by other code, which sends no key
	if _, err := cc.New(p); err != nil {
		t.Fatal(err)
	}
	evs := h.srv.Events()
	if len(evs) != 2 {
		t.Fatalf("%d events, want 2", len(evs))
	}
	if got := h.deliver(evs[0]); got != "ignored: not a billonce payment" {
		t.Errorf("event without metadata answered %q", got)
	}
	if got := h.deliver(evs[1]); got != "ignored: no claim for this payment" {
		t.Errorf("event for an unknown claim answered %q", got)
	}
	other := []byte(`{"id":"evt_x","object":"event","type":"customer.created","created":1,"data":{"object":{"id":"cus_1","object":"customer"}}}`)
	if status, body := h.post(other, billingtest.Sign(other, whsec, time.Now())); status != 200 || body != "ignored: event type not handled" {
		t.Errorf("other event type answered %d %q", status, body)
	}
	if n := h.eventRows(); n != 0 || h.claimRows() != 0 {
		t.Errorf("%d event rows and %d claims after ignored events", n, h.claimRows())
	}
}

// A bank debit that fails after the run: the next run does not charge the
// customer again (same key: its claim is failed) and reports the failure
// apart from card declines.
func TestProcessingFailedNotChargedAgain(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{
		"cus_bank": {After: time.Hour, FailureCode: "account_closed"},
		"cus_ach":  {After: time.Hour},
	})
	h.srv.Decline("cus_card", "")
	ctx := context.Background()
	customers := billing.Customers("cus_bank", "cus_ach", "cus_card", "cus_ok")
	sum, err := h.b.Run(ctx, period, customers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Created != 1 || sum.Processing != 2 || sum.Declined != 1 || sum.DeclinedAfterProcessing != 0 || sum.Complete() {
		t.Fatalf("first run = %+v", sum.Progress)
	}
	h.srv.Advance(2 * time.Hour)
	for _, ev := range h.srv.Events() {
		h.deliver(ev)
	}
	before := len(h.srv.Log())
	sum, err = h.b.Run(ctx, period, customers, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.AlreadyBilled != 2 || sum.Declined != 1 || sum.DeclinedAfterProcessing != 1 || sum.Processing != 0 {
		t.Fatalf("second run = %+v", sum.Progress)
	}
	var fe *billing.ChargeError
	for _, f := range sum.Failures {
		if errors.As(f, &fe) && fe.Customer == "cus_bank" {
			break
		}
		fe = nil
	}
	if fe == nil || !errors.Is(fe, billing.ErrDeclined) || !fe.AfterProcessing || fe.Code != "account_closed" {
		t.Fatalf("failures = %v", sum.Failures)
	}
	if n := len(h.srv.Log()) - before; n != 0 {
		t.Errorf("the second run sent %d requests to Stripe, want 0", n)
	}
	var created int
	for _, p := range h.srv.Payments() {
		if p.Customer == "cus_bank" {
			created++
		}
	}
	if created != 1 || h.srv.CountPeriod("cus_bank", period) != 0 || h.srv.CountPeriod("cus_ach", period) != 1 {
		t.Errorf("cus_bank has %d payments (%d paid), cus_ach %d paid", created, h.srv.CountPeriod("cus_bank", period), h.srv.CountPeriod("cus_ach", period))
	}
}

// One event delivered at once to several replicas of the handler, each
// with its own Biller and pool: exactly one applies it.
func TestWebhookConcurrentReplicas(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_1": {After: time.Minute}})
	r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.srv.Advance(time.Hour)
	evs := h.eventsOf(r.StripeID)
	ev := evs[len(evs)-1]
	const replicas = 6
	var urls []string
	for range replicas {
		pool := newPool(t, h.pool)
		b := h.biller(func(c *billing.Config) { c.Claims = newStore(t, pool) })
		handler, err := b.Webhook(billing.WebhookConfig{Secret: whsec})
		if err != nil {
			t.Fatal(err)
		}
		srv := httptest.NewServer(handler)
		t.Cleanup(srv.Close)
		urls = append(urls, srv.URL)
	}
	answers := make(chan string, replicas*3)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range replicas * 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			req, _ := http.NewRequest(http.MethodPost, urls[i%replicas], bytes.NewReader(ev.Body))
			req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, whsec, time.Now()))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			answers <- strings.TrimSpace(string(b))
		}()
	}
	close(start)
	wg.Wait()
	close(answers)
	count := map[string]int{}
	for a := range answers {
		count[a]++
	}
	if count["changed"] != 1 || count["duplicate"] != replicas*3-1 {
		t.Errorf("answers = %v, want one changed, the rest duplicate", count)
	}
	if n := h.eventRows(); n != 1 {
		t.Errorf("%d event rows, want 1", n)
	}
}

// Without webhooks, Reconcile reads each payment processing for longer
// than Config.SettleAfter, one GET per claim, and settles it.
func TestReconcilePollsProcessing(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, map[string]billingtest.Async{
		"cus_a": {After: time.Hour},
		"cus_b": {After: time.Hour, FailureCode: "insufficient_funds"},
		"cus_c": {After: 48 * time.Hour},
	})
	ctx := context.Background()
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_a", "cus_b", "cus_c"), nil); err != nil {
		t.Fatal(err)
	}
	// Too young: Reconcile reads nothing.
	before := len(h.srv.Log())
	sum, err := h.b.Reconcile(ctx, nil)
	if err != nil || sum.Total != 0 || len(h.srv.Log()) != before {
		t.Fatalf("Reconcile of young claims = %+v, %v, %d requests", sum.Progress, err, len(h.srv.Log())-before)
	}
	h.srv.Advance(2 * time.Hour)
	h.exec("UPDATE billonce_claims SET processing_at = processing_at - interval '2 hours'")
	sum, err = h.b.Reconcile(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Total != 3 || sum.AlreadyBilled != 1 || sum.DeclinedAfterProcessing != 1 || sum.Processing != 1 {
		t.Fatalf("Reconcile = %+v", sum.Progress)
	}
	var gets int
	for _, e := range h.srv.Log()[before:] {
		if e.Method == http.MethodGet {
			gets++
		}
	}
	if gets != 3 {
		t.Errorf("Reconcile made %d GETs, want one per processing claim (3)", gets)
	}
	for c, want := range map[string]claim.State{"cus_a": claim.StateSucceeded, "cus_b": claim.StateFailed, "cus_c": claim.StateProcessing} {
		if got := h.claimOf(c); got.State != want {
			t.Errorf("%s is %s, want %s", c, got.State, want)
		}
	}
	if fc := h.claimOf("cus_b").FailureCode; fc != "insufficient_funds" {
		t.Errorf("failure code = %q", fc)
	}
}

func TestWebhookConfigRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, cfg := range []billing.WebhookConfig{{}, {Secret: "whsec_x\n"}, {Secret: whsec, Tolerance: -1}, {Secret: whsec, MaxBody: -1}} {
		if _, err := e.b.Webhook(cfg); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("Webhook(%+v) = %v, want ErrInvalid", cfg, err)
		} else if strings.Contains(err.Error(), "whsec_x") {
			t.Errorf("the error quotes the secret: %v", err)
		}
	}
}

// newPool opens another pool on the database of p, as another replica
// would.
func newPool(t *testing.T, p *pgxpool.Pool) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.NewWithConfig(context.Background(), p.Config().Copy())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// The signing secret is never printed, whatever the verb or the logger.
func TestWebhookSecretNeverPrinted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	cfg := billing.WebhookConfig{Secret: whsec}
	h, err := e.b.Webhook(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var logs bytes.Buffer
	slog.New(slog.NewJSONHandler(&logs, nil)).Info("webhook", "config", cfg, "handler", h)
	out := fmt.Sprintf("%v %+v %#v %s %q %d %x", cfg, cfg, cfg, cfg, cfg, cfg, cfg) +
		fmt.Sprintf("%v %+v %#v %s %x", h, h, h, h, h) + logs.String()
	if strings.Contains(out, whsec) || strings.Contains(out, fmt.Sprintf("%x", whsec)) {
		t.Errorf("the secret is printed:\n%s", out)
	}
	if !strings.Contains(out, "Secret: ****") {
		t.Errorf("no redacted secret in:\n%s", out)
	}
}

// A charge.failed delivered after charge.succeeded for the same payment
// (out of order, or a forged-but-signed replay) must not reopen the period.
func TestWebhookFailedAfterSucceededKeepsPayment(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	ctx := context.Background()
	r, err := h.b.Charge(ctx, "cus_a", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	h.deliverAll()
	h.deliver(chargeEvent(t, "evt_attack3_failed", "charge.failed", r.StripeID, "failed", h.key("cus_a"), "cus_a", time.Now().Add(time.Minute)))
	if c := h.claimOf("cus_a"); c.State != claim.StateSucceeded {
		t.Fatalf("claim is %s after a late charge.failed", c.State)
	}
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_a"), nil); err != nil {
		t.Fatal(err)
	}
	r2, err2 := h.b.Rebill(ctx, "cus_a", period, 2, nil)
	if n := h.count("cus_a"); n != 1 {
		t.Fatalf("cus_a charged %d times; Rebill = %+v, %v", n, r2, err2)
	}
}

// A full refund, its events delivered, then Charge, Run and Reconcile
// again: a refund is never a reason to bill again.
func TestWebhookRefundThenRunChargesNothing(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, nil)
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_r", period, nil)
			if err != nil {
				t.Fatal(err)
			}
			if err := h.srv.Refund(r.StripeID, amount); err != nil {
				t.Fatal(err)
			}
			h.deliverAll()
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_r"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Charge(ctx, "cus_r", period, nil); err != nil {
				t.Fatal(err)
			}
			if n := len(h.srv.Payments()); n != 1 {
				t.Fatalf("%d payments at Stripe after a refund and runs, want 1", n)
			}
		})
	}
}

// Attempt 1 fails after processing; attempt 2 is created and succeeds; then
// attempt 1's events arrive late (redelivered, and a forged success for a
// new id). The period is billed once and stays so.
func TestWebhookLateEventsForEarlierAttemptKeepPeriodBilledOnce(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_l": {After: time.Hour, FailureCode: "account_closed"}})
	ctx := context.Background()
	r1, err := h.b.Charge(ctx, "cus_l", period, nil)
	if err != nil || !r1.Processing {
		t.Fatalf("Charge = %+v, %v", r1, err)
	}
	h.srv.Advance(2 * time.Hour)
	events := h.srv.Events()
	for _, ev := range events {
		h.deliver(ev)
	}
	if c := h.claimOf("cus_l"); c.State != claim.StateFailed {
		t.Fatalf("attempt 1 is %s, want failed", c.State)
	}
	h.srv.SettleLater("cus_l", billingtest.Async{})
	if _, err := h.b.Rebill(ctx, "cus_l", period, 2, nil); err != nil {
		t.Fatal(err)
	}
	h.srv.Advance(time.Minute)
	for _, ev := range h.srv.Events()[len(events):] {
		h.deliver(ev)
	}
	if c2 := h.claimOf2("cus_l", 2); c2.State != claim.StateSucceeded {
		t.Fatalf("attempt 2 is %s, want succeeded", c2.State)
	}
	// Redeliver attempt 1's events in reverse, then a success about it.
	for i := len(events) - 1; i >= 0; i-- {
		h.post(events[i].Body, billingtest.Sign(events[i].Body, whsec, time.Now()))
	}
	h.deliver(chargeEvent(t, "evt_attack3_late", "charge.succeeded", r1.StripeID, "succeeded", h.key("cus_l"), "cus_l", time.Now()))
	if _, err := h.b.Run(ctx, period, billing.Customers("cus_l"), nil); err != nil {
		t.Fatal(err)
	}
	_, err3 := h.b.Rebill(ctx, "cus_l", period, 3, nil)
	if n := h.count("cus_l"); n != 1 {
		t.Fatalf("cus_l charged %d times; Rebill(3) = %v", n, err3)
	}
}

// A Run dies between Stripe's answer (a bank debit, pending) and its
// write; the payment settles, its webhook events arrive while the claim is
// still pending (nothing shows they are about the claim's own send, so they
// change nothing), 25 hours pass on both clocks, and runs come back: the
// claim's own search settles it, and nobody is charged again.
func TestWebhookEventsOfACrashedRunsPaymentChargeNobodyAgain(t *testing.T) {
	t.Parallel()
	for _, fail := range []string{"", "insufficient_funds"} {
		t.Run("failure="+fail, func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, billing.Charges, map[string]billingtest.Async{"cus_c": {After: time.Hour, FailureCode: fail}})
			ctx := context.Background()
			key := h.crashedClaim("cus_c", amount)
			h.chargeDirect("cus_c", key, amount)
			h.srv.Advance(25 * time.Hour)
			// Concurrent deliveries of every event, twice each.
			evs := h.srv.Events()
			done := make(chan struct{})
			for i := 0; i < 2; i++ {
				for _, ev := range evs {
					go func() {
						defer func() { done <- struct{}{} }()
						h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
					}()
				}
			}
			for i := 0; i < 2*len(evs); i++ {
				<-done
			}
			if c := h.claimOf("cus_c"); c.State != claim.StatePending {
				t.Fatalf("claim after events it has not recorded the payment of = %s, want pending", c.State)
			}
			h.ageClaim(key, 25*time.Hour)
			sum, err := h.b.Run(ctx, period, billing.Customers("cus_c"), nil)
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			want := 1
			if fail != "" {
				want = 0
			}
			if n, p := h.count("cus_c"), len(h.srv.Payments()); n != want || p != 1 {
				t.Fatalf("cus_c: %d payments, %d counted, want 1 and %d; Run = %+v, %v; claim %+v", p, n, want, sum, err, h.claimOf("cus_c"))
			}
		})
	}
}

// Every event of one payment (processing, settled, a partial refund, a
// dispute) delivered to several replicas at once, three times each and in
// both orders: the claim ends succeeded with the refund and the dispute,
// and later runs bill nothing.
func TestWebhookConcurrentEventsForOnePayment(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, map[string]billingtest.Async{"cus_e": {After: time.Hour}})
			ctx := context.Background()
			r, err := h.b.Charge(ctx, "cus_e", period, nil)
			if err != nil || !r.Processing {
				t.Fatalf("Charge = %+v, %v", r, err)
			}
			h.srv.Advance(2 * time.Hour)
			if err := h.srv.Refund(r.StripeID, 1000); err != nil {
				t.Fatal(err)
			}
			if _, err := h.srv.Dispute(r.StripeID, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			evs := h.srv.Events()
			done := make(chan int)
			n := 0
			for round := 0; round < 3; round++ {
				for i := range evs {
					ev := evs[i]
					if round == 1 {
						ev = evs[len(evs)-1-i]
					}
					n++
					go func() {
						status, _ := h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
						done <- status
					}()
				}
			}
			for i := 0; i < n; i++ {
				if s := <-done; s != 200 {
					t.Errorf("a delivery was answered %d", s)
				}
			}
			c := h.claimOf("cus_e")
			if c.State != claim.StateSucceeded || c.Refunded != 1000 || c.Dispute == "" {
				t.Fatalf("claim after the events: state %s, refunded %d, dispute %q", c.State, c.Refunded, c.Dispute)
			}
			if _, err := h.b.Run(ctx, period, billing.Customers("cus_e"), nil); err != nil {
				t.Fatal(err)
			}
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if p := len(h.srv.Payments()); p != 1 || h.count("cus_e") != 1 {
				t.Fatalf("%d payments, %d counted; want 1", p, h.count("cus_e"))
			}
			if rows := h.eventRows(); rows != len(evs) {
				t.Fatalf("%d event rows for %d events", rows, len(evs))
			}
		})
	}
}
