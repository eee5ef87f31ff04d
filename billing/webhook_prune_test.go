package billing_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/testenv"
)

// Every event of a bank debit that settles, one that fails, a card
// charge, a refund and a dispute is applied; Reconcile then prunes the
// event records past the retention. Stripe delivers every event again
// (a manual resend, a replay tool), newest first and then oldest first:
// each answers "unchanged", no claim moves, nothing is observed or logged
// as news, and nobody is charged again by the next Run or Charge.
func TestWebhookRedeliveredAfterPrune(t *testing.T) {
	t.Parallel()
	for _, api := range []billing.API{billing.Charges, billing.PaymentIntents} {
		t.Run(string(api), func(t *testing.T) {
			t.Parallel()
			h := newHookEnv(t, api, map[string]billingtest.Async{
				"cus_ok":   {After: time.Hour},
				"cus_fail": {After: time.Hour, FailureCode: "insufficient_funds"},
			})
			ctx := context.Background()
			custs := []string{"cus_ok", "cus_fail", "cus_card"}
			for _, c := range custs {
				if _, err := h.b.Charge(ctx, c, period, nil); err != nil {
					t.Fatal(err)
				}
			}
			h.srv.Advance(2 * time.Hour)
			ok := h.claimOf("cus_ok")
			if err := h.srv.Refund(ok.StripeID, 1000); err != nil {
				t.Fatal(err)
			}
			if err := h.srv.Refund(ok.StripeID, 500); err != nil {
				t.Fatal(err)
			}
			if _, err := h.srv.Dispute(ok.StripeID, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			events := h.srv.Events()
			for _, ev := range events {
				h.deliver(ev)
			}
			before := map[string]claim.Claim{}
			counts := map[string]int{}
			for _, c := range custs {
				before[c], counts[c] = h.claimOf(c), h.count(c)
			}
			if c := before["cus_ok"]; c.State != claim.StateSucceeded || c.Refunded != 1500 || c.Dispute == "" {
				t.Fatalf("claim after every event = %+v", c)
			}
			if c := before["cus_fail"]; c.State != claim.StateFailed {
				t.Fatalf("failed claim = %+v", c)
			}
			observed := len(h.observed())

			// 91 days pass for the records; the default retention is 90.
			h.exec("UPDATE billonce_claims_events SET received_at = received_at - interval '91 days'")
			if _, err := h.b.Reconcile(ctx, nil); err != nil {
				t.Fatal(err)
			}
			if n := h.eventRows(); n != 0 {
				t.Fatalf("%d event records left after Reconcile, want 0: older than the retention", n)
			}
			mark := len(h.logs.String())
			reversed := slices.Clone(events)
			slices.Reverse(reversed)
			for _, ev := range append(reversed, events...) {
				if got := h.deliver(ev); got != "unchanged" && got != "duplicate" {
					t.Errorf("%s %s delivered after pruning answered %q, want unchanged", ev.ID, ev.Type, got)
				}
			}
			for _, c := range custs {
				if got := h.claimOf(c); got.UpdatedAt != before[c].UpdatedAt || got.State != before[c].State ||
					got.Refunded != before[c].Refunded || got.Dispute != before[c].Dispute {
					t.Errorf("%s's claim moved: %+v, was %+v", c, got, before[c])
				}
			}
			if n := len(h.observed()); n != observed {
				t.Errorf("observed %d more events after the redeliveries: %+v", n-observed, h.observed()[observed:])
			}
			logs := h.logs.String()[mark:]
			for _, news := range []string{"payment settled", "payment refunded", "payment disputed", "payment failed", "payment is processing", "level=WARN", "level=ERROR"} {
				if strings.Contains(logs, news) {
					t.Errorf("redeliveries after pruning logged %q:\n%s", news, logs)
				}
			}
			if _, err := h.b.Run(ctx, period, billing.Customers(custs...), nil); err != nil && !strings.Contains(err.Error(), "declin") {
				t.Logf("Run: %v", err)
			}
			for _, c := range custs {
				h.b.Charge(ctx, c, period, nil)
				if n := h.count(c); n != counts[c] {
					t.Errorf("%s charged %d times, was %d", c, n, counts[c])
				}
			}
		})
	}
}

// A correctly signed event that can never be applied (a key or an event
// id longer than the claim table takes) is acknowledged with 200, logged
// as an error and changes nothing: answering 4xx would make Stripe
// deliver it again for days, to the same end, and may disable the
// endpoint.
func TestWebhookUnappliableEventAcknowledged(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := h.claimOf("cus_1")
	for _, ev := range []billingtest.Event{
		chargeEvent(t, "evt_longkey", "charge.succeeded", "ch_long", "succeeded", strings.Repeat("k", 300), "cus_x", time.Now()),
		chargeEvent(t, "evt_"+strings.Repeat("9", 300), "charge.refunded", r.StripeID, "succeeded", h.key("cus_1"), "cus_1", time.Now()),
	} {
		for range 2 {
			status, body := h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
			if status != http.StatusOK || !strings.Contains(body, "not applied") {
				t.Errorf("%.20s: %d %q, want 200 saying it was not applied", ev.ID, status, body)
			}
		}
	}
	if c := h.claimOf("cus_1"); c.UpdatedAt != before.UpdatedAt {
		t.Errorf("claim moved: %+v", c)
	}
	if n := strings.Count(h.logs.String(), "level=ERROR msg=\"billonce: webhook event not applied and acknowledged"); n != 4 {
		t.Errorf("%d error lines for 4 unappliable deliveries:\n%s", n, h.logs)
	}
	if n := h.eventRows(); n != 0 {
		t.Errorf("%d event records, want 0", n)
	}
	var ids []string
	for _, e := range h.observed() {
		if e.Kind != billing.EventNotApplied || !errors.Is(e.Err, claim.ErrInvalid) || !strings.Contains(e.Err.Error(), "not applied") {
			t.Errorf("observed %+v, want EventNotApplied wrapping claim.ErrInvalid", e)
		}
		ids = append(ids, e.EventID[:8]+" "+e.StripeID)
	}
	if got := strings.Join(ids, ", "); got != "evt_long ch_long, evt_long ch_long, evt_9999 "+r.StripeID+", evt_9999 "+r.StripeID {
		t.Errorf("observed %s", got)
	}
}

// A dispute whose payment does not exist on this account (Stripe answers
// 404) can never be applied: 200, an error in the log. A dispute whose
// payment cannot be read for now (a 500, a rate limit) is answered 503 so
// that Stripe delivers it again, and the redelivery applies it.
func TestWebhookDisputeUnreadable(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	disp := []byte(`{"id":"evt_disp_missing","object":"event","api_version":"` + billingtest.APIVersion + `","created":1,"type":"charge.dispute.created","data":{"object":{"id":"dp_x","object":"dispute","charge":"ch_nosuch","reason":"fraudulent"}}}`)
	status, body := h.post(disp, billingtest.Sign(disp, whsec, time.Now()))
	if status != http.StatusOK || !strings.Contains(body, "not applied") {
		t.Errorf("dispute of a payment Stripe does not have: %d %q, want 200 saying it was not applied", status, body)
	}
	if !strings.Contains(h.logs.String(), "level=ERROR") {
		t.Errorf("no error logged:\n%s", h.logs)
	}
	if obs := h.observed(); len(obs) != 1 || obs[0].Kind != billing.EventNotApplied || obs[0].EventID != "evt_disp_missing" || obs[0].Err == nil {
		t.Errorf("observed %+v, want one EventNotApplied", obs)
	}

	r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := h.srv.Dispute(r.StripeID, "fraudulent"); err != nil {
		t.Fatal(err)
	}
	evs := h.eventsOf(r.StripeID)
	ev := evs[len(evs)-1]
	if ev.Type != "charge.dispute.created" {
		t.Fatalf("last event %s", ev.Type)
	}
	for _, f := range []billingtest.FaultKind{billingtest.FaultErrorBefore, billingtest.FaultRateLimit} {
		h.srv.FailNext(billingtest.Match{Method: http.MethodGet}, billingtest.Fault{Kind: f})
		status, body := h.post(ev.Body, billingtest.Sign(ev.Body, whsec, time.Now()))
		if status != http.StatusServiceUnavailable {
			t.Errorf("dispute while reading its payment fails (%s): %d %q, want 503", f, status, body)
		}
	}
	if got := h.deliver(ev); got != "changed" {
		t.Errorf("the redelivered dispute answered %q, want changed", got)
	}
	if c := h.claimOf("cus_1"); c.Dispute == "" {
		t.Errorf("dispute not recorded: %+v", c)
	}
	// Every delivery is reported once, with its result.
	if got, want := strings.Join(h.webhookResults(), " "), "not_applied retry retry applied"; got != want {
		t.Errorf("webhook results %q, want %q", got, want)
	}
}

// Config.EventRetention: shorter than the 30 days for which Stripe can
// resend an event is refused; records younger than the retention stay;
// a negative retention keeps every record.
func TestEventRetention(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	for _, d := range []time.Duration{time.Hour, 72 * time.Hour, 29 * 24 * time.Hour} {
		_, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: e.srv.URL, Claims: e.store, EventRetention: d})
		if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), "30 days") {
			t.Errorf("EventRetention %v: %v, want ErrInvalid saying 30 days", d, err)
		}
	}
	for _, c := range []struct {
		retention time.Duration
		age       string
		left      int
	}{
		{0, "89 days", 1}, {0, "91 days", 0}, {31 * 24 * time.Hour, "32 days", 0}, {-1, "3650 days", 1},
	} {
		h := newHookEnv(t, billing.Charges, nil)
		r, err := h.b.Charge(context.Background(), "cus_1", period, nil)
		if err != nil {
			t.Fatal(err)
		}
		h.deliver(h.eventsOf(r.StripeID)[0])
		h.exec("UPDATE billonce_claims_events SET received_at = received_at - interval '" + c.age + "'")
		b := h.biller(func(cfg *billing.Config) { cfg.EventRetention = c.retention })
		if _, err := b.Reconcile(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		if n := h.eventRows(); n != c.left {
			t.Errorf("retention %v, a record %s old: %d left after Reconcile, want %d", c.retention, c.age, n, c.left)
		}
	}
}

// Two handler processes apply every event of 200 payments (bank debits
// that settle or fail, refunds in two steps, disputes), each delivered up
// to twice and shuffled, then all of them again, while this process
// prunes every record over and over (retention 0: every redelivery is
// applied afresh). Every claim ends as its payment is at the fake, with
// its full refund and its dispute; nobody is charged twice, and the next
// run sends nothing.
func TestWebhookPruneAcrossProcesses(t *testing.T) {
	t.Parallel()
	customers := testenv.Size(50, 200)
	async := map[string]billingtest.Async{}
	var ids []string
	for i := range customers {
		c := fmt.Sprintf("cus_%04d", i)
		ids = append(ids, c)
		switch i % 5 {
		case 0:
			async[c] = billingtest.Async{After: time.Hour}
		case 1:
			async[c] = billingtest.Async{After: time.Hour, FailureCode: "insufficient_funds"}
		}
	}
	e := newEnvWith(t, billingtest.Config{Async: async}, func(c *billing.Config) { c.RateLimit = -1 })
	ctx := context.Background()
	if _, err := e.b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 8}); err != nil {
		t.Fatal(err)
	}
	e.srv.Advance(2 * time.Hour)
	refunded, disputed := map[string]int64{}, map[string]bool{}
	for i, c := range ids {
		cl := e.claimOf(c)
		if i%5 == 1 || i%3 != 0 {
			continue
		}
		for _, amt := range []int64{300, 700} {
			if err := e.srv.Refund(cl.StripeID, amt); err != nil {
				t.Fatal(err)
			}
			refunded[c] += amt
		}
		if i%2 == 0 {
			if _, err := e.srv.Dispute(cl.StripeID, "fraudulent"); err != nil {
				t.Fatal(err)
			}
			disputed[c] = true
		}
	}
	rc := replicaConfig{DatabaseURL: e.pool.Config().ConnString(), StripeURL: e.srv.URL, Secret: whsec}
	replicas := []*replica{startReplica(t, rc), startReplica(t, rc)}
	var next atomic.Int64
	lb := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(&url.URL{Scheme: "http", Host: replicas[next.Add(1)%2].addr})
	}}
	lbSrv := httptest.NewServer(lb)
	t.Cleanup(lbSrv.Close)

	stop := make(chan struct{})
	var prunes, pruned atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-stop:
				return
			default:
			}
			n, err := engineOf(e.store).PruneEvents(ctx, 0)
			if err != nil {
				t.Error(err)
				return
			}
			prunes.Add(1)
			pruned.Add(int64(n))
		}
	}()
	events := e.srv.Events()
	for round := range 2 {
		sender, err := billingtest.NewSender(billingtest.SenderConfig{URL: lbSrv.URL, Secret: whsec, Seed: int64(round + 1),
			Duplicate: 0.5, Reorder: true, Workers: 16, Attempts: 10, Retry: 2 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		if rep := sender.Send(ctx, events); len(rep.Undelivered) > 0 {
			t.Fatalf("round %d: %d events never acknowledged", round, len(rep.Undelivered))
		}
	}
	close(stop)
	wg.Wait()

	final := e.srv.Final()
	want := map[string]claim.State{"succeeded": claim.StateSucceeded, "failed": claim.StateFailed}
	var wrong []string
	for _, c := range ids {
		cl := e.claimOf(c)
		if cl.State != want[final[cl.StripeID]] || cl.Refunded != refunded[c] || (cl.Dispute != "") != disputed[c] {
			wrong = append(wrong, fmt.Sprintf("%s: %s refunded %d dispute %q; payment %s refunded %d disputed %v",
				c, cl.State, cl.Refunded, cl.Dispute, final[cl.StripeID], refunded[c], disputed[c]))
		}
	}
	paid := map[string]int{}
	for _, p := range e.srv.Payments() {
		if p.Status != "failed" && p.Status != "requires_payment_method" {
			paid[p.Customer]++
		}
	}
	for c, n := range paid {
		if n > 1 {
			wrong = append(wrong, fmt.Sprintf("%s paid %d times", c, n))
		}
	}
	t.Logf("%d events delivered in two rounds to two processes; %d prunes deleted %d records meanwhile", len(events), prunes.Load(), pruned.Load())
	if len(wrong) > 0 {
		t.Fatalf("%d wrong, first: %v", len(wrong), wrong[:min(10, len(wrong))])
	}
	if pruned.Load() == 0 {
		t.Fatal("nothing was pruned: the test proved nothing")
	}
	before := len(e.srv.Log())
	again, err := e.b.Run(ctx, period, billing.Customers(ids...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(e.srv.Log()) != before || again.Created != 0 {
		t.Errorf("next run = %+v with %d requests to Stripe", again.Progress, len(e.srv.Log())-before)
	}
}

// failingPrune is a claim store whose PruneEvents fails.
type failingPrune struct{ testStore }

func (failingPrune) PruneEvents(context.Context, time.Duration) (int, error) {
	return 0, errors.New("connection reset")
}

// A failure to prune does not stop Reconcile: the claims are settled, and
// the error comes back with the complete summary, saying what failed.
func TestReconcilePruneFails(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	key := e.crashedClaim("cus_1", amount)
	e.ageClaim(key, time.Hour)
	b := e.biller(func(c *billing.Config) { c.Claims = failingPrune{wrapStore(e.store)} })
	sum, err := b.Reconcile(context.Background(), nil)
	if err == nil || !strings.Contains(err.Error(), "pruning webhook event records") || !strings.Contains(err.Error(), "connection reset") {
		t.Fatalf("Reconcile = %v, want the pruning error", err)
	}
	if sum.Total != 1 || e.claimOf("cus_1").State != claim.StateSucceeded || e.count("cus_1") != 1 {
		t.Fatalf("summary %+v, claim %+v, %d charges; want the claim settled once", sum.Progress, e.claimOf("cus_1"), e.count("cus_1"))
	}
}
