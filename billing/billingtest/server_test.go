package billingtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
)

func TestCreateGetAndListCharges(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)

	p := chargeParams("cus_1", "2026-09", "k1")
	p.Description = stripe.String("September")
	ch, err := api.Charges.New(p)
	if err != nil {
		t.Fatal(err)
	}
	if ch.Amount != 4200 || ch.Currency != "usd" || ch.Customer.ID != "cus_1" || ch.Status != "succeeded" ||
		!ch.Paid || ch.Metadata["billonce_period"] != "2026-09" || ch.Description != "September" {
		t.Fatalf("charge = %+v", ch)
	}
	if ch.LastResponse.RequestID == "" || ch.LastResponse.IdempotencyKey != "k1" {
		t.Fatalf("Request-Id %q, Idempotency-Key %q; want both set", ch.LastResponse.RequestID, ch.LastResponse.IdempotencyKey)
	}
	got, err := api.Charges.Get(ch.ID, nil)
	if err != nil || got.ID != ch.ID || got.Amount != 4200 {
		t.Fatalf("Get = %+v, %v", got, err)
	}
	if _, err := api.Charges.New(chargeParams("cus_2", "2026-09", "k2")); err != nil {
		t.Fatal(err)
	}
	it := api.Charges.List(&stripe.ChargeListParams{Customer: stripe.String("cus_1")})
	var ids []string
	for it.Next() {
		ids = append(ids, it.Charge().ID)
	}
	if it.Err() != nil || len(ids) != 1 || ids[0] != ch.ID {
		t.Fatalf("list for cus_1 = %v, %v; want [%s]", ids, it.Err(), ch.ID)
	}
	_, err = api.Charges.Get("ch_missing", nil)
	if se := stripeErr(t, err); se.HTTPStatusCode != 404 || se.Code != stripe.ErrorCodeResourceMissing || se.Param != "id" {
		t.Fatalf("missing charge: %+v", se)
	}
	if n := srv.Count("cus_1"); n != 1 {
		t.Fatalf("Count(cus_1) = %d; want 1", n)
	}
}

func TestListPaginatesThroughStripeGo(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	for i := range 25 {
		if _, err := api.Charges.New(chargeParams("cus_p", fmt.Sprint(i), fmt.Sprint("k", i))); err != nil {
			t.Fatal(err)
		}
	}
	lp := &stripe.ChargeListParams{Customer: stripe.String("cus_p")}
	lp.Limit = stripe.Int64(10)
	n := 0
	for it := api.Charges.List(lp); it.Next(); {
		n++
	}
	sp := &stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: "customer:'cus_p'", Limit: stripe.Int64(7)}}
	m := 0
	it := api.Charges.Search(sp)
	for it.Next() {
		m++
	}
	if n != 25 || m != 25 || it.Err() != nil {
		t.Fatalf("listed %d, searched %d (%v); want 25 each", n, m, it.Err())
	}
}

func TestReplayReturnsSameObjectAndHeader(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)

	first, err := api.Charges.New(chargeParams("cus_1", "2026-09", "key-A"))
	if err != nil {
		t.Fatal(err)
	}
	if first.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatal("first response marked as replayed")
	}
	second, err := api.Charges.New(chargeParams("cus_1", "2026-09", "key-A"))
	if err != nil {
		t.Fatal(err)
	}
	if second.ID != first.ID {
		t.Fatalf("replay id = %s; want %s", second.ID, first.ID)
	}
	h := second.LastResponse.Header
	if h.Get("Idempotent-Replayed") != "true" || h.Get("Original-Request") != first.LastResponse.RequestID {
		t.Fatalf("replay headers: Idempotent-Replayed=%q Original-Request=%q", h.Get("Idempotent-Replayed"), h.Get("Original-Request"))
	}
	if n, st := srv.CountPeriod("cus_1", "2026-09"), srv.Stats(); n != 1 || st.Replays != 1 || st.Created != 1 {
		t.Fatalf("CountPeriod = %d, stats = %+v; want 1 charge, 1 replay", n, st)
	}
}

func TestSameKeyDifferentParamsOrEndpoint(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "shared")); err != nil {
		t.Fatal(err)
	}

	// The key fixed at client construction: the next customer gets an error,
	// not cus_1's charge, because the parameters differ.
	_, err := api.Charges.New(chargeParams("cus_2", "2026-09", "shared"))
	se := stripeErr(t, err)
	var ie *stripe.IdempotencyError
	if se.Type != stripe.ErrorTypeIdempotency || se.HTTPStatusCode != 400 || !errors.As(se.Err, &ie) {
		t.Fatalf("different params: %+v; want 400 idempotency_error", se)
	}

	pi := &stripe.PaymentIntentParams{Amount: stripe.Int64(4200), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
	pi.SetIdempotencyKey("shared")
	_, err = api.PaymentIntents.New(pi)
	if se := stripeErr(t, err); se.Type != stripe.ErrorTypeIdempotency || !strings.Contains(se.Msg, "same endpoint") {
		t.Fatalf("different endpoint: %+v; want idempotency_error about the endpoint", se)
	}
	if st := srv.Stats(); st.IdempotencyErrors != 2 || len(srv.Payments()) != 1 {
		t.Fatalf("stats %+v, %d payments; want 2 idempotency errors and 1 payment", st, len(srv.Payments()))
	}
}

func TestConcurrentSameKeyGetsOne409(t *testing.T) {
	t.Parallel()
	arrived := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	srv := newServer(t, billingtest.Config{Script: func(r billingtest.Request) billingtest.Fault {
		if r.IdempotencyKey == "k" && r.Attempt == 1 {
			once.Do(func() { close(arrived) })
			return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
		}
		return billingtest.Fault{}
	}})
	api := newAPI(t, srv, testKey, nil)

	type out struct {
		ch  *stripe.Charge
		err error
	}
	first := make(chan out, 1)
	go func() {
		ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
		first <- out{ch, err}
	}()
	<-arrived
	// The script answers as the request arrives, before the charge is
	// stored; once it is, the first request is held while executing and
	// the ledger already holds the charge.
	for srv.Count("cus_1") == 0 {
		time.Sleep(time.Millisecond)
	}
	if n := srv.Count("cus_1"); n != 1 {
		t.Fatalf("Count while executing = %d; want 1", n)
	}
	_, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 409 || se.Code != stripe.ErrorCodeIdempotencyKeyInUse || se.Type != stripe.ErrorTypeInvalidRequest {
		t.Fatalf("second request: %+v; want 409 idempotency_key_in_use", se)
	}
	close(release)
	o := <-first
	if o.err != nil {
		t.Fatal(o.err)
	}
	again, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil || again.ID != o.ch.ID {
		t.Fatalf("after release: %v, %v; want replay of %s", again, err, o.ch.ID)
	}
	if st := srv.Stats(); st.InUse != 1 || st.Created != 1 {
		t.Fatalf("stats = %+v; want exactly one 409 and one charge", st)
	}
}

// The seeds' central failure: Stripe commits, the response is lost.
func TestCutThenRetry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		retryKey string
		want     int
	}{
		{"same key returns the original", "k1", 1},
		{"new key charges twice", "k1-retry", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := newServer(t, billingtest.Config{})
			api := newAPI(t, srv, testKey, nil)
			srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})

			_, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
			var se *stripe.Error
			if err == nil || errors.As(err, &se) {
				t.Fatalf("first attempt error = %v; want a transport error", err)
			}
			committed := srv.Payments()
			if len(committed) != 1 {
				t.Fatalf("ledger after cut holds %d payments; want 1 (Stripe committed)", len(committed))
			}
			ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", tc.retryKey))
			if err != nil {
				t.Fatal(err)
			}
			if got := srv.CountPeriod("cus_1", "2026-09"); got != tc.want {
				t.Fatalf("CountPeriod = %d; want %d", got, tc.want)
			}
			if tc.want == 1 && (ch.ID != committed[0].ID || ch.LastResponse.Header.Get("Idempotent-Replayed") != "true") {
				t.Fatalf("retry got %s; want the replayed %s", ch.ID, committed[0].ID)
			}
		})
	}
}

// A drop with no bytes on a reused keep-alive connection is resent once by
// net/http itself (the request carries an Idempotency-Key, which net/http
// treats as replayable), so the client sees the replay. On a fresh
// connection the client sees the error.
func TestDropWithoutBytes(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})

	reused := newAPI(t, srv, testKey, nil)
	if _, err := reused.Charges.Get("ch_warm", nil); err == nil {
		t.Fatal("warm-up request found a charge")
	}
	srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultDrop})
	ch, err := reused.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
	if err != nil {
		t.Fatalf("reused connection: %v; want net/http's own resend to get the replay", err)
	}
	if ch.LastResponse.Header.Get("Idempotent-Replayed") != "true" {
		t.Fatal("reused connection: the answer was not the replay")
	}

	fresh := newAPI(t, srv, testKey, &http.Client{Transport: &http.Transport{DisableKeepAlives: true}})
	srv.FailNext(billingtest.Match{Customer: "cus_2"}, billingtest.Fault{Kind: billingtest.FaultDrop})
	if _, err := fresh.Charges.New(chargeParams("cus_2", "2026-09", "k2")); err == nil {
		t.Fatal("fresh connection: no error after a drop")
	}
	if srv.Count("cus_1") != 1 || srv.Count("cus_2") != 1 {
		t.Fatalf("counts cus_1=%d cus_2=%d; want 1 each", srv.Count("cus_1"), srv.Count("cus_2"))
	}
	if st := srv.Stats(); st.Faults[billingtest.FaultDrop] != 2 {
		t.Fatalf("drop faults = %d; want 2", st.Faults[billingtest.FaultDrop])
	}
}

func TestSlowResponseOutlivesClientTimeout(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	release := make(chan struct{})
	srv.FailNext(billingtest.Match{IdempotencyKey: "k1"}, billingtest.Fault{Kind: billingtest.FaultSlow, Release: release})
	impatient := newAPI(t, srv, testKey, &http.Client{Timeout: time.Second})
	if _, err := impatient.Charges.New(chargeParams("cus_1", "2026-09", "k1")); err == nil {
		t.Fatal("no client timeout")
	}
	if n := srv.Count("cus_1"); n != 1 {
		t.Fatalf("Count = %d; want 1: the server committed before the client gave up", n)
	}
	api := newAPI(t, srv, testKey, nil)
	_, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 409 {
		t.Fatalf("retry while executing: %+v; want 409", se)
	}
	close(release)
	// The held request finishes on its own goroutine; poll for its result.
	deadline := time.Now().Add(5 * time.Second)
	for {
		ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
		if err == nil {
			if ch.ID != srv.Payments()[0].ID || srv.Count("cus_1") != 1 {
				t.Fatalf("got %s, count %d; want the original charge once", ch.ID, srv.Count("cus_1"))
			}
			return
		}
		if se := stripeErr(t, err); se.HTTPStatusCode != 409 || time.Now().After(deadline) {
			t.Fatalf("after release: %+v", se)
		}
	}
}

func TestErrorsBeforeAndAfterCommit(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)

	// Before commit: nothing stored, the same key then succeeds.
	for _, k := range []billingtest.FaultKind{billingtest.FaultErrorBefore, billingtest.FaultLockTimeout, billingtest.FaultInFlight, billingtest.FaultRateLimit} {
		srv.FailNext(billingtest.Match{IdempotencyKey: "before"}, billingtest.Fault{Kind: k})
	}
	want := []struct {
		status int
		retry  string
		code   stripe.ErrorCode
	}{{500, "true", ""}, {429, "true", stripe.ErrorCodeLockTimeout}, {409, "", stripe.ErrorCodeIdempotencyKeyInUse}, {429, "", stripe.ErrorCodeRateLimit}}
	for _, w := range want {
		_, err := api.Charges.New(chargeParams("cus_1", "2026-09", "before"))
		se := stripeErr(t, err)
		if se.HTTPStatusCode != w.status || se.Code != w.code || se.LastResponse.Header.Get("Stripe-Should-Retry") != w.retry {
			t.Fatalf("got %d %q should-retry=%q; want %+v", se.HTTPStatusCode, se.Code, se.LastResponse.Header.Get("Stripe-Should-Retry"), w)
		}
	}
	if len(srv.Payments()) != 0 {
		t.Fatal("a fault before commit created a payment")
	}
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "before"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" {
		t.Fatalf("same key after faults before commit: %v; want a fresh charge", err)
	}

	// After commit: the 500 is stored and replayed; the charge exists.
	srv.FailNext(billingtest.Match{IdempotencyKey: "after"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	for i := range 2 {
		_, err := api.Charges.New(chargeParams("cus_2", "2026-09", "after"))
		se := stripeErr(t, err)
		replayed := se.LastResponse.Header.Get("Idempotent-Replayed") == "true"
		if se.HTTPStatusCode != 500 || se.Type != stripe.ErrorTypeAPI || replayed != (i == 1) ||
			se.LastResponse.Header.Get("Stripe-Should-Retry") != "false" {
			t.Fatalf("attempt %d: %+v replayed=%v; want the stored 500", i, se, replayed)
		}
	}
	if srv.Count("cus_2") != 1 {
		t.Fatalf("Count(cus_2) = %d; want 1: the charge committed before the 500", srv.Count("cus_2"))
	}
}

func TestKeyExpiresAfter24Hours(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	first, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil {
		t.Fatal(err)
	}
	srv.Advance(23*time.Hour + 59*time.Minute)
	inside, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil || inside.ID != first.ID {
		t.Fatalf("inside the window: %v, %v; want replay of %s", inside, err, first.ID)
	}
	srv.Advance(2 * time.Minute)
	after, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil {
		t.Fatal(err)
	}
	if after.ID == first.ID || srv.CountPeriod("cus_1", "2026-09") != 2 {
		t.Fatalf("after 24h got %s, count %d; want a second charge", after.ID, srv.CountPeriod("cus_1", "2026-09"))
	}
}

func TestSearchByMetadata(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	var want string
	for _, c := range []struct{ cust, period string }{{"cus_1", "2026-08"}, {"cus_1", "2026-09"}, {"cus_2", "2026-09"}} {
		ch, err := api.Charges.New(chargeParams(c.cust, c.period, c.cust+c.period))
		if err != nil {
			t.Fatal(err)
		}
		if c.cust == "cus_1" && c.period == "2026-09" {
			want = ch.ID
		}
	}
	pi := &stripe.PaymentIntentParams{Amount: stripe.Int64(4200), Currency: stripe.String("usd"), Customer: stripe.String("cus_1"),
		PaymentMethod: stripe.String("pm_card_visa"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
	pi.AddMetadata("billonce_period", "2026-09")
	pi.AddMetadata("customer", "cus_1")
	pi.SetIdempotencyKey("pi-1")
	intent, err := api.PaymentIntents.New(pi)
	if err != nil || intent.Status != stripe.PaymentIntentStatusSucceeded {
		t.Fatalf("payment intent: %+v, %v", intent, err)
	}

	search := func(q string) []string {
		it := api.Charges.Search(&stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: q}})
		var ids []string
		for it.Next() {
			ids = append(ids, it.Charge().ID)
		}
		if it.Err() != nil {
			t.Fatalf("search %q: %v", q, it.Err())
		}
		return ids
	}
	if got := search(`metadata['customer']:'cus_1' AND metadata["billonce_period"]:"2026-09"`); len(got) != 1 || got[0] != want {
		t.Fatalf("search = %v; want [%s]", got, want)
	}
	if got := search(`metadata['billonce_period']:'2026-09'`); len(got) != 2 {
		t.Fatalf("period search found %d charges; want 2", len(got))
	}
	if got := search(`metadata['billonce_period']:'1999-01'`); len(got) != 0 {
		t.Fatalf("search for an unknown period = %v; want none", got)
	}
	it := api.PaymentIntents.Search(&stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: "metadata['customer']:'cus_1' AND status:'succeeded'"}})
	var pis []string
	for it.Next() {
		pis = append(pis, it.PaymentIntent().ID)
	}
	if it.Err() != nil || len(pis) != 1 || pis[0] != intent.ID {
		t.Fatalf("intent search = %v, %v; want [%s]", pis, it.Err(), intent.ID)
	}
	bad := api.Charges.Search(&stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: "refunded:'true' OR x"}})
	if bad.Next() {
		t.Fatal("unsupported query returned results")
	}
	if se := stripeErr(t, bad.Err()); se.HTTPStatusCode != 400 || se.Param != "query" {
		t.Fatalf("unsupported query: %+v; want 400 on param query", se)
	}
}

func TestPaymentIntentStates(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	//idemvet:ignore the fake is tested with keyless writes, as stripe-go sends them when the caller sets no key
	unconfirmed, err := api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("eur"),
		Customer: stripe.String("cus_1"), PaymentMethod: stripe.String("pm_1")})
	if err != nil || unconfirmed.Status != stripe.PaymentIntentStatusRequiresConfirmation {
		t.Fatalf("unconfirmed: %+v, %v", unconfirmed, err)
	}
	got, err := api.PaymentIntents.Get(unconfirmed.ID, nil)
	if err != nil || got.PaymentMethod.ID != "pm_1" || got.Customer.ID != "cus_1" {
		t.Fatalf("Get: %+v, %v", got, err)
	}
	if srv.Count("cus_1") != 0 {
		t.Fatal("an unconfirmed payment intent counted as paid")
	}
	//idemvet:ignore the fake is tested with keyless writes, as stripe-go sends them when the caller sets no key
	_, err = api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("eur"),
		Customer: stripe.String("cus_1"), Confirm: stripe.Bool(true)})
	if se := stripeErr(t, err); se.HTTPStatusCode != 400 || se.Param != "payment_method" {
		t.Fatalf("confirm without payment method: %+v", se)
	}
}

func TestDeclines(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Declines: map[string]string{"cus_broke": "insufficient_funds"}})
	api := newAPI(t, srv, testKey, nil)

	for i := range 2 {
		_, err := api.Charges.New(chargeParams("cus_broke", "2026-09", "k"))
		se := stripeErr(t, err)
		var ce *stripe.CardError
		if se.HTTPStatusCode != 402 || se.Type != stripe.ErrorTypeCard || se.Code != stripe.ErrorCodeCardDeclined ||
			se.DeclineCode != "insufficient_funds" || !errors.As(se.Err, &ce) || se.ChargeID == "" {
			t.Fatalf("attempt %d: %+v; want 402 card_error insufficient_funds", i, se)
		}
		if replayed := se.LastResponse.Header.Get("Idempotent-Replayed") == "true"; replayed != (i == 1) {
			t.Fatalf("attempt %d replayed = %v", i, replayed)
		}
	}
	ps := srv.Payments()
	if len(ps) != 1 || ps[0].Paid || ps[0].Status != "failed" || srv.Count("cus_broke") != 0 {
		t.Fatalf("ledger %+v, count %d; want one failed charge, none paid", ps, srv.Count("cus_broke"))
	}

	srv.Decline("cus_pi", "expired_card")
	pi := &stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"), Customer: stripe.String("cus_pi"),
		PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
	//idemvet:ignore the fake is tested with keyless writes, as stripe-go sends them when the caller sets no key
	_, err := api.PaymentIntents.New(pi)
	se := stripeErr(t, err)
	if se.HTTPStatusCode != 402 || se.DeclineCode != "expired_card" || se.PaymentIntent == nil ||
		se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
		t.Fatalf("intent decline: %+v", se)
	}
	srv.Honor("cus_pi")
	//idemvet:ignore the fake is tested with keyless writes, as stripe-go sends them when the caller sets no key
	if _, err := api.PaymentIntents.New(pi); err != nil {
		t.Fatalf("after Honor: %v", err)
	}
}

// An off-session PaymentIntent declined with authentication_required is
// completed on session, as Stripe's recovery goes: confirmed again without
// off_session, the same PaymentIntent succeeds, is counted, and emits
// payment_intent.succeeded. Confirmed off session again it declines again;
// any other decline declines on session too; a succeeded one cannot be
// confirmed.
func TestDeclinedIntentCompletedOnSession(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	srv.Decline("cus_3ds", "authentication_required")
	srv.Decline("cus_broke", "insufficient_funds")
	failed := map[string]string{}
	for _, c := range []string{"cus_3ds", "cus_broke"} {
		p := &stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"), Customer: stripe.String(c),
			PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true)}
		p.SetIdempotencyKey("k-" + c)
		_, err := api.PaymentIntents.New(p)
		se := stripeErr(t, err)
		if se.HTTPStatusCode != 402 || se.PaymentIntent == nil || se.PaymentIntent.Status != stripe.PaymentIntentStatusRequiresPaymentMethod {
			t.Fatalf("%s off session: %+v; want 402 and requires_payment_method", c, se)
		}
		failed[c] = se.PaymentIntent.ID
	}
	if se := stripeErr(t, func() error {
		_, err := api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(900), Currency: stripe.String("usd"),
			Customer: stripe.String("cus_3ds"), PaymentMethod: stripe.String("pm_1"), Confirm: stripe.Bool(true), OffSession: stripe.Bool(true),
			Params: stripe.Params{IdempotencyKey: stripe.String("k-3ds-again")}})
		return err
	}()); se.Code != stripe.ErrorCodeAuthenticationRequired || se.DeclineCode != "authentication_required" {
		t.Fatalf("authentication decline = code %q, decline code %q; want authentication_required for both", se.Code, se.DeclineCode)
	}
	n := 0
	confirm := func(id string, offSession bool) (*stripe.PaymentIntent, error) {
		p := &stripe.PaymentIntentConfirmParams{}
		if offSession {
			p.OffSession = stripe.Bool(true)
		}
		n++
		p.SetIdempotencyKey(fmt.Sprintf("confirm-%d", n))
		return api.PaymentIntents.Confirm(id, p)
	}
	if _, err := confirm(failed["cus_3ds"], true); stripeErr(t, err).HTTPStatusCode != 402 {
		t.Fatalf("confirmed off session again: %v; want declined", err)
	}
	if _, err := confirm(failed["cus_broke"], false); stripeErr(t, err).DeclineCode != "insufficient_funds" {
		t.Fatalf("an insufficient_funds decline confirmed on session: %v; want declined again", err)
	}
	pi, err := confirm(failed["cus_3ds"], false)
	if err != nil || pi.Status != stripe.PaymentIntentStatusSucceeded || pi.ID != failed["cus_3ds"] {
		t.Fatalf("confirmed on session: %+v, %v; want the same PaymentIntent succeeded", pi, err)
	}
	if n := srv.Count("cus_3ds"); n != 1 {
		t.Errorf("cus_3ds paid %d times, want 1", n)
	}
	var types []string
	for _, ev := range srv.Events() {
		if ev.ObjectID == pi.ID {
			types = append(types, ev.Type)
		}
	}
	if want := "[payment_intent.payment_failed payment_intent.payment_failed payment_intent.succeeded]"; fmt.Sprint(types) != want {
		t.Errorf("events of %s = %v, want %s", pi.ID, types, want)
	}
	if _, err := confirm(pi.ID, true); stripeErr(t, err).Code != "payment_intent_unexpected_state" {
		t.Errorf("a succeeded PaymentIntent confirmed again: %v; want payment_intent_unexpected_state", err)
	}
}

func TestRateLimiterAnswers429AndStoresNothing(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{RateLimit: 0.001, RateBurst: 1})
	api := newAPI(t, srv, testKey, nil)
	if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1")); err != nil {
		t.Fatal(err)
	}
	_, err := api.Charges.New(chargeParams("cus_2", "2026-09", "k2"))
	if se := stripeErr(t, err); se.HTTPStatusCode != 429 || se.Code != stripe.ErrorCodeRateLimit {
		t.Fatalf("over the limit: %+v; want 429 rate_limit", se)
	}
	if err := srv.SetRateLimit(0, 0); err != nil {
		t.Fatal(err)
	}
	ch, err := api.Charges.New(chargeParams("cus_2", "2026-09", "k2"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" || srv.Count("cus_2") != 1 {
		t.Fatalf("same key after the 429: %v; want a fresh charge", err)
	}
	if st := srv.Stats(); st.RateLimited != 1 {
		t.Fatalf("RateLimited = %d; want 1", st.RateLimited)
	}
}

// FaultRefuse answers the Stripe error it is given and stores nothing: the
// same key executes once the refusal is gone.
func TestRefuseAnswersTheGivenErrorAndStoresNothing(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	srv.FailNext(billingtest.Match{Customer: "cus_1"},
		billingtest.Fault{Kind: billingtest.FaultRefuse, Refusal: billingtest.Refusal{Code: "parameter_unknown", Param: "colour"}},
		billingtest.Fault{Kind: billingtest.FaultRefuse, Status: 404, Refusal: billingtest.Refusal{Code: "resource_missing", Param: "customer", Message: "No such customer: 'cus_1'"}},
		billingtest.Fault{Kind: billingtest.FaultRefuse, Status: 402, Refusal: billingtest.Refusal{Type: "card_error", Code: "card_declined", DeclineCode: "do_not_honor"}})
	for _, want := range []struct {
		status            int
		typ               stripe.ErrorType
		code, param, decl string
	}{
		{400, stripe.ErrorTypeInvalidRequest, "parameter_unknown", "colour", ""},
		{404, stripe.ErrorTypeInvalidRequest, "resource_missing", "customer", ""},
		{402, stripe.ErrorTypeCard, "card_declined", "", "do_not_honor"},
	} {
		_, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
		se := stripeErr(t, err)
		if se.HTTPStatusCode != want.status || se.Type != want.typ || string(se.Code) != want.code ||
			se.Param != want.param || string(se.DeclineCode) != want.decl || se.Msg == "" || se.RequestID == "" {
			t.Fatalf("refusal %+v; want %+v", se, want)
		}
	}
	ch, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k1"))
	if err != nil || ch.LastResponse.Header.Get("Idempotent-Replayed") != "" || srv.Count("cus_1") != 1 {
		t.Fatalf("same key after the refusals: %v; want a fresh charge", err)
	}
	if st := srv.Stats(); st.Faults[billingtest.FaultRefuse] != 3 || st.Created != 1 {
		t.Fatalf("stats %+v; want 3 refusals and 1 payment", st)
	}
}

func TestAuthAndKeyScoping(t *testing.T) {
	t.Parallel()
	other := "sk_test_other_key_000000000000005678"
	srv := newServer(t, billingtest.Config{APIKeys: []string{testKey, other}})

	for _, key := range []string{"", "sk_test_wrong_secret_99999999abcd"} {
		_, err := newAPI(t, srv, key, nil).Charges.New(chargeParams("cus_1", "2026-09", "k"))
		se := stripeErr(t, err)
		if se.HTTPStatusCode != 401 {
			t.Fatalf("key %q: %+v; want 401", key, se)
		}
		if key != "" && strings.Contains(se.Msg, "wrong_secret") {
			t.Fatalf("401 message leaks the key: %q", se.Msg)
		}
	}
	a, err := newAPI(t, srv, testKey, nil).Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil {
		t.Fatal(err)
	}
	b, err := newAPI(t, srv, other, nil).Charges.New(chargeParams("cus_1", "2026-09", "k"))
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || srv.Count("cus_1") != 2 {
		t.Fatalf("same idempotency key under two API keys: %s and %s; want two charges", a.ID, b.ID)
	}
	// No API key ever reaches the log or the ledger.
	logJSON, _ := json.Marshal(srv.Log())
	ledgerJSON, _ := json.Marshal(srv.Payments())
	for _, secret := range []string{testKey, other, "wrong_secret"} {
		if bytes.Contains(logJSON, []byte(secret)) || bytes.Contains(ledgerJSON, []byte(secret)) {
			t.Fatalf("secret %q found in the log or the ledger", secret)
		}
	}
}

func TestValidation(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	for _, tc := range []struct {
		name  string
		edit  func(*stripe.ChargeParams)
		param string
	}{
		{"missing amount", func(p *stripe.ChargeParams) { p.Amount = nil }, "amount"},
		{"zero amount", func(p *stripe.ChargeParams) { p.Amount = stripe.Int64(0) }, "amount"},
		{"negative amount", func(p *stripe.ChargeParams) { p.Amount = stripe.Int64(-5) }, "amount"},
		{"huge amount", func(p *stripe.ChargeParams) { p.Amount = stripe.Int64(1e9) }, "amount"},
		{"missing currency", func(p *stripe.ChargeParams) { p.Currency = nil }, "currency"},
		{"unknown currency", func(p *stripe.ChargeParams) { p.Currency = stripe.String("xyz") }, "currency"},
		{"uppercase currency", func(p *stripe.ChargeParams) { p.Currency = stripe.String("USD") }, "currency"},
		{"no customer", func(p *stripe.ChargeParams) { p.Customer = nil }, "customer"},
		{"unknown param", func(p *stripe.ChargeParams) { p.Shipping = &stripe.ShippingDetailsParams{Name: stripe.String("x")} }, "shipping[name]"},
		{"long metadata key", func(p *stripe.ChargeParams) { p.AddMetadata(strings.Repeat("k", 41), "v") }, "metadata[" + strings.Repeat("k", 41) + "]"},
	} {
		p := chargeParams("cus_1", "2026-09", "v-"+tc.name)
		tc.edit(p)
		_, err := api.Charges.New(p)
		se := stripeErr(t, err)
		var ire *stripe.InvalidRequestError
		if se.HTTPStatusCode != 400 || se.Param != tc.param || !errors.As(se.Err, &ire) || se.Msg == "" {
			t.Errorf("%s: %+v; want 400 invalid_request_error on %s", tc.name, se, tc.param)
		}
		// A rejected request stores nothing under its key.
		if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "v-"+tc.name)); err != nil {
			t.Errorf("%s: valid retry with the same key: %v", tc.name, err)
		}
	}
	if n := srv.Count("cus_1"); n != 10 {
		t.Fatalf("Count = %d; want 10 (one per valid retry)", n)
	}
}

// stripe-go v79 puts an Idempotency-Key on every POST that has params, even
// with MaxNetworkRetries 0: two identical calls without a key are two charges.
func TestStripeGoAddsARandomKeyToEveryPost(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	api := newAPI(t, srv, testKey, nil)
	for range 2 {
		if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "")); err != nil {
			t.Fatal(err)
		}
	}
	log := srv.Log()
	if len(log) != 2 || log[0].IdempotencyKey == "" || log[0].IdempotencyKey == log[1].IdempotencyKey {
		t.Fatalf("log = %+v; want two different generated keys", log)
	}
	if srv.Count("cus_1") != 2 {
		t.Fatalf("Count = %d; want 2", srv.Count("cus_1"))
	}
}

func TestSeededRatesAreDeterministic(t *testing.T) {
	t.Parallel()
	rates := map[billingtest.FaultKind]float64{billingtest.FaultErrorBefore: 0.2, billingtest.FaultErrorAfter: 0.2, billingtest.FaultLockTimeout: 0.2}
	run := func() []billingtest.FaultKind {
		srv := newServer(t, billingtest.Config{Script: faults(7, rates)})
		api := newAPI(t, srv, testKey, nil)
		var kinds []billingtest.FaultKind
		for i := range 40 {
			api.Charges.New(chargeParams(fmt.Sprint("cus_", i), "2026-09", fmt.Sprint("k", i)))
		}
		for _, e := range srv.Log() {
			kinds = append(kinds, e.Fault)
		}
		return kinds
	}
	a, b := run(), run()
	if fmt.Sprint(a) != fmt.Sprint(b) {
		t.Fatalf("same seed, different faults:\n%v\n%v", a, b)
	}
	faulted := 0
	for _, k := range a {
		if k != "" {
			faulted++
		}
	}
	if faulted < 10 || faulted > 38 {
		t.Fatalf("%d of 40 requests faulted at a 60%% rate", faulted)
	}

	for _, bad := range []map[billingtest.FaultKind]float64{{"explode": 0.1}, {billingtest.FaultDrop: 1.5}, {billingtest.FaultDrop: 0.6, billingtest.FaultCut: 0.6}} {
		if _, err := billingtest.RandomFaults(1, bad); err == nil {
			t.Errorf("RandomFaults(%v) accepted", bad)
		}
	}
}

func TestScriptSeesAttempts(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var seen []billingtest.Request
	srv := newServer(t, billingtest.Config{})
	srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		mu.Lock()
		seen = append(seen, r)
		mu.Unlock()
		if r.Attempt == 1 {
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		}
		return billingtest.Fault{}
	})
	api := newAPI(t, srv, testKey, nil)
	if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k")); err == nil {
		t.Fatal("first attempt succeeded")
	}
	if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", "k")); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if len(seen) != 2 || seen[1].Attempt != 2 || seen[0].Customer != "cus_1" || seen[0].Path != "/v1/charges" || seen[0].IdempotencyKey != "k" {
		t.Fatalf("script saw %+v", seen)
	}
}

func TestUnknownEndpoint(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	resp, err := http.Post(srv.URL+"/v1/subscriptions", "application/x-www-form-urlencoded", strings.NewReader("customer=cus_1"))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 || resp.Header.Get("Request-Id") == "" {
		t.Fatalf("unauthenticated unknown endpoint: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/v1/subscriptions", strings.NewReader("customer=cus_1"))
	req.Header.Set("Authorization", "Bearer "+testKey)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 404 {
		t.Fatalf("unknown endpoint: %d; want 404", resp.StatusCode)
	}
}

// 64 clients hammer one server with faults on; the ledger must stay
// consistent: at most one payment per key, counts equal to the ledger.
func TestConcurrentClientsUnderFaults(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{Script: faults(42, map[billingtest.FaultKind]float64{
		billingtest.FaultCut: 0.05, billingtest.FaultErrorAfter: 0.05, billingtest.FaultErrorBefore: 0.05,
		billingtest.FaultLockTimeout: 0.05, billingtest.FaultInFlight: 0.05, billingtest.FaultDecline: 0.05,
	})})
	const clients, customers = 64, 50
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			api := newAPI(t, srv, testKey, nil)
			for i := range customers {
				cust := fmt.Sprint("cus_", (i+c)%customers)
				// Every client retries each customer with the customer's one key.
				for range 3 {
					if _, err := api.Charges.New(chargeParams(cust, "2026-09", "key-"+cust)); err == nil {
						break
					}
				}
			}
		}()
	}
	wg.Wait()
	srv.Close() // wait for handlers whose connection was cut
	perKey := map[string]int{}
	paid := 0
	for _, p := range srv.Payments() {
		perKey[p.IdempotencyKey]++
		if p.Paid {
			paid++
		}
	}
	for k, n := range perKey {
		if n != 1 {
			t.Errorf("key %s created %d payments; want 1", k, n)
		}
	}
	total := 0
	for i := range customers {
		total += srv.CountPeriod(fmt.Sprint("cus_", i), "2026-09")
	}
	st := srv.Stats()
	if total != paid || int64(paid) != st.Paid || int64(len(perKey)) != st.Created || st.Requests != int64(len(srv.Log())) {
		t.Fatalf("counts %d, paid %d, stats %+v, log %d: inconsistent", total, paid, st, len(srv.Log()))
	}
}

// Close does not wait on a connection a client opened and never used.
func TestCloseDoesNotWaitForUnusedConnections(t *testing.T) {
	srv := billingtest.NewServer(billingtest.Config{})
	c, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	done := make(chan struct{})
	go func() { srv.Close(); close(done) }()
	<-done // a Close that waited for the connection would never return: it stays open until the test ends
}

// A client that dies while it sends a request's body (a process killed
// mid-write) leaves a request no one can answer: Stripe never received
// it, so the log shows it without a status, not as a 400 the client was
// refused with, and nothing is stored under its key.
func TestBodyCutByTheClientIsNoRequest(t *testing.T) {
	t.Parallel()
	srv := newServer(t, billingtest.Config{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(srv.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	body := "amount=100&charge=ch_1"
	fmt.Fprintf(conn, "POST /v1/refunds HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nIdempotency-Key: kcut\r\n"+
		"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n\r\n%s", testKey, len(body), body[:7])
	conn.Close()

	deadline := time.Now().Add(time.Minute)
	var log []billingtest.Entry
	for len(log) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
		log = srv.Log()
	}
	if len(log) != 1 {
		t.Fatalf("log holds %d entries, want the one cut request", len(log))
	}
	if e := log[0]; e.Status != 0 || e.IdempotencyKey != "kcut" || e.Path != "/v1/refunds" {
		t.Fatalf("cut request logged as %+v, want POST /v1/refunds key kcut without a status", e)
	}
	// The key holds nothing: the whole request, sent now, is executed.
	resp, b := do(t, srv, http.MethodPost, "/v1/refunds", "kcut", url.Values{"amount": {"100"}, "charge": {"ch_1"}})
	if resp.StatusCode != http.StatusNotFound {
		t.Fatalf("full request after the cut: %d %s, want 404 for the unknown charge", resp.StatusCode, b)
	}
}
