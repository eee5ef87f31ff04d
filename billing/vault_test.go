package billing_test

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

const (
	// appSecret is what the application believes is its Stripe key; behind
	// the proxy it must never leave the process.
	appSecret   = "sk_live_application_secret_must_not_leave_0001"
	upstreamKey = "sk_test_upstream_secret_held_by_proxy_0002"
	vaultKey    = "vault_key_for_run_2026_09_secret_tail_7f3a"
)

// authRecorder records the Authorization headers a handler receives.
type authRecorder struct {
	mu   sync.Mutex
	seen map[string]int
}

func (a *authRecorder) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		a.mu.Lock()
		if a.seen == nil {
			a.seen = make(map[string]int)
		}
		a.seen[r.Header.Get("Authorization")]++
		a.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (a *authRecorder) total() (n int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, c := range a.seen {
		n += c
	}
	return n
}

// quiet waits until every request the proxy received has been answered
// by it: a run that stops may abandon requests the proxy goes on with
// (it never cancels a forwarded request), and they may reach the fake
// Stripe after the run has returned.
func quiet(tb testing.TB, s *stack) {
	tb.Helper()
	for s.px.Usage(vaultKey).Reserved != 0 || len(s.px.Log()) < s.atProxy.total() {
		time.Sleep(5 * time.Millisecond)
	}
}

func (a *authRecorder) only(tb testing.TB, who, want string) {
	tb.Helper()
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.seen) != 1 || a.seen[want] == 0 {
		tb.Errorf("%s saw Authorization headers %v; want only %q", who, a.seen, want)
	}
}

type stack struct {
	srv      *billingtest.Server
	px       *spendcaptest.Proxy
	proxyURL string // the proxy, behind a recorder
	atStripe *authRecorder
	atProxy  *authRecorder
}

// newStack starts a fake Stripe that accepts only upstreamKey, a fake proxy
// in front of it, and recorders of the Authorization headers each sees.
func newStack(tb testing.TB, pcfg spendcaptest.Config) *stack {
	tb.Helper()
	s := &stack{atStripe: &authRecorder{}, atProxy: &authRecorder{}}
	s.srv = billingtest.NewServer(billingtest.Config{APIKeys: []string{upstreamKey}})
	tb.Cleanup(s.srv.Close)
	stripeFront := httptest.NewServer(s.atStripe.wrap(reverse(tb, s.srv.URL)))
	tb.Cleanup(stripeFront.Close)
	pcfg.Upstream, pcfg.StripeKey, pcfg.Clock = stripeFront.URL, upstreamKey, s.srv
	s.px = spendcaptest.NewProxy(pcfg)
	tb.Cleanup(s.px.Close)
	proxyFront := httptest.NewServer(s.atProxy.wrap(reverse(tb, s.px.URL)))
	tb.Cleanup(proxyFront.Close)
	s.proxyURL = proxyFront.URL
	return s
}

func reverse(tb testing.TB, target string) http.Handler {
	tb.Helper()
	u, err := url.Parse(target)
	if err != nil {
		tb.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.ErrorLog = log.New(io.Discard, "", 0)
	return rp
}

// stripeAPI is a stripe-go client that believes it talks to Stripe with
// appSecret, over hc, with stripe-go's own retries off.
func stripeAPI(hc *http.Client) *client.API {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
	})
	api := &client.API{}
	api.Init(appSecret, &stripe.Backends{API: b, Connect: b, Uploads: b})
	return api
}

func proxied(tb testing.TB, proxyURL string) *client.API {
	tb.Helper()
	hc, err := spendcap.Client(proxyURL, vaultKey, nil)
	if err != nil {
		tb.Fatal(err)
	}
	return stripeAPI(hc)
}

func vaultChargeParams(customer, key string, amount int64) *stripe.ChargeParams {
	p := &stripe.ChargeParams{Amount: stripe.Int64(amount), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
	p.AddMetadata(billing.MetaPeriod, "2026-09")
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

func paidTotal(srv *billingtest.Server) (total int64) {
	for _, p := range srv.Payments() {
		if p.Paid {
			total += p.Amount
		}
	}
	return total
}

// The seeds' worst case: a loop that makes a fresh key on every iteration
// charges again and again. Behind the proxy it stops at the cap.
func TestVaultRunawayLoopStopsAtTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	const capAmount, amount = 10000, 2999
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: capAmount, AllowedEndpoints: []string{"POST /v1/charges"}})
	api := proxied(t, s.proxyURL)

	var err error
	iterations := 0
	for ; iterations < 100; iterations++ {
		//idemvet:ignore a runaway loop with a new key per charge is what the cap must stop
		if _, err = api.Charges.New(vaultChargeParams("cus_1", rand.Text(), amount)); err != nil {
			break
		}
	}
	if !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("loop ended after %d iterations with %v; want ErrSpendCapReached", iterations, err)
	}
	var pe *spendcap.ProxyError
	if !errors.As(err, &pe) || pe.Status != http.StatusTooManyRequests || pe.Message != "Spend cap of $100 for this key reached" {
		t.Fatalf("error %#v; want a *spendcap.ProxyError with status 429 and the proxy's message", err)
	}
	if got := paidTotal(s.srv); got > capAmount || got != 3*amount {
		t.Fatalf("charged %d at the fake; want %d (3 charges under the cap of %d)", got, 3*amount, capAmount)
	}
	if iterations != 3 {
		t.Fatalf("loop stopped after %d charges; want 3", iterations)
	}
	s.atProxy.only(t, "the proxy", "Bearer "+vaultKey)
	s.atStripe.only(t, "the fake Stripe", "Bearer "+upstreamKey)
}

func TestVaultReplaysDoNotConsumeCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 5000})
	api := proxied(t, s.proxyURL)
	// The first response is lost after Stripe committed.
	s.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	var ids []string
	for i := range 4 {
		ch, err := api.Charges.New(vaultChargeParams("cus_1", "cus_1/2026-09", 4000))
		if i == 0 {
			if err == nil {
				t.Fatal("first attempt succeeded; want the proxy's 502 for the cut connection")
			}
			var se *stripe.Error
			if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusBadGateway || se.Type != stripe.ErrorTypeAPI {
				t.Fatalf("first attempt: %v; want a *stripe.Error api_error 502 (retryable, outcome unknown)", err)
			}
			continue
		}
		if err != nil {
			t.Fatalf("attempt %d: %v", i, err)
		}
		ids = append(ids, ch.ID)
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("charge IDs %v; want the same charge replayed", ids)
	}
	if n := s.srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Fatalf("charged %d times; want 1", n)
	}
	if u := s.px.Usage(vaultKey); u.Spent != 4000 {
		t.Fatalf("Usage = %+v; want Spent 4000", u)
	}
}

func TestVaultConcurrentChargesAtTheEdge(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{CapStatus: http.StatusPaymentRequired})
	const amount, fit, n = 300, 20, 50
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: amount*fit + amount - 1})
	api := proxied(t, s.proxyURL)
	var ok, capped, other atomic.Int64
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			_, err := api.Charges.New(vaultChargeParams(fmt.Sprintf("cus_%d", i), fmt.Sprintf("k%d", i), amount))
			switch {
			case err == nil:
				ok.Add(1)
			case errors.Is(err, spendcap.ErrSpendCapReached):
				capped.Add(1)
			default:
				other.Add(1)
				t.Errorf("charge %d: %v", i, err)
			}
		})
	}
	wg.Wait()
	if got := paidTotal(s.srv); got != amount*fit || ok.Load() != fit || capped.Load() != n-fit {
		t.Fatalf("paid %d, ok %d, capped %d, other %d; want %d paid, %d ok, %d capped", got, ok.Load(), capped.Load(), other.Load(), amount*fit, fit, n-fit)
	}
}

func TestVaultRefusalsAreTypedAndNotRetried(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100000, AllowedEndpoints: []string{"POST /v1/payment_intents"}})
	hc, err := spendcap.Client(s.proxyURL, vaultKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	api := stripeAPI(hc)

	_, err = api.Charges.New(vaultChargeParams("cus_1", "k1", 100))
	var pe *spendcap.ProxyError
	if !errors.Is(err, spendcap.ErrEndpointNotAllowed) || !errors.As(err, &pe) || len(pe.AllowedEndpoints) != 1 || pe.AllowedEndpoints[0] != "POST /v1/payment_intents" {
		t.Fatalf("blocked endpoint: %v; want ErrEndpointNotAllowed with the allowlist", err)
	}
	if errors.Is(err, spendcap.ErrSpendCapReached) || errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Errorf("blocked endpoint also matches another sentinel: %v", err)
	}

	s.px.Suspend(true)
	//idemvet:ignore the proxy refuses this write before Stripe sees it: no key needed
	_, err = api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
	if !errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Fatalf("kill switch: %v; want ErrVaultKeyRevoked", err)
	}
	s.px.Suspend(false)
	s.px.Revoke(vaultKey)
	//idemvet:ignore the proxy refuses this write before Stripe sees it: no key needed
	_, err = api.PaymentIntents.New(&stripe.PaymentIntentParams{Amount: stripe.Int64(100), Currency: stripe.String("usd")})
	if !errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Fatalf("revoked: %v; want ErrVaultKeyRevoked", err)
	}
	if log := s.px.Log(); len(log) != 3 {
		t.Fatalf("the proxy answered %d requests; want 3, one per refusal, none retried: %+v", len(log), log)
	}
	if st := s.srv.Stats(); st.Requests != 0 {
		t.Fatalf("the fake Stripe saw %d requests; want 0", st.Requests)
	}
}

// A Stripe 429 that the proxy only forwards stays a Stripe error, so the
// retry layer retries it; only the proxy's own refusal stops.
func TestVaultStripeRateLimitPassesThrough(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100000})
	api := proxied(t, s.proxyURL)
	for _, kind := range []billingtest.FaultKind{billingtest.FaultLockTimeout, billingtest.FaultRateLimit} {
		s.srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: kind})
		_, err := api.Charges.New(vaultChargeParams("cus_1", "k-"+string(kind), 100))
		var se *stripe.Error
		if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusTooManyRequests || !strings.HasPrefix(se.RequestID, "req_") {
			t.Fatalf("%s: %v; want Stripe's 429 as a *stripe.Error", kind, err)
		}
		var pe *spendcap.ProxyError
		if errors.As(err, &pe) || errors.Is(err, spendcap.ErrSpendCapReached) {
			t.Fatalf("%s: a forwarded Stripe 429 was taken for a proxy refusal: %v", kind, err)
		}
	}
}

// billerBehind returns a Biller whose Stripe calls go through s's proxy with
// vaultKey, claims in a fresh PostgreSQL database, every customer owing
// amount usd, and logs written to logs.
func billerBehind(tb testing.TB, s *stack, amount int64, api billing.API, logs io.Writer) (*billing.Biller, *claim.Postgres) {
	tb.Helper()
	// A short lease: a run that stops leaves the claims it was sending
	// leased, and the next run resumes them once the lease is over.
	store, err := claim.NewPostgres(pgtest.Pool(tb), claim.Config{Lease: 100 * time.Millisecond})
	if err != nil {
		tb.Fatal(err)
	}
	if err := store.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	hc, err := spendcap.Client(s.proxyURL, vaultKey, &http.Client{})
	if err != nil {
		tb.Fatal(err)
	}
	if logs == nil {
		logs = io.Discard
	}
	b, err := billing.New(billing.Config{
		SecretKey:  appSecret, // dropped by the transport
		HTTPClient: hc,
		Claims:     store,
		API:        api,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
		Retry:  retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 5 * time.Millisecond},
		Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b, store
}

// checkClaims asserts that every customer's claim agrees with the fake's
// ledger: never failed, never charged twice, pending (or never claimed) when
// not charged, and succeeded when charged, or pending when final is false
// (a run that stops abandons requests in flight, whose outcome it does not
// learn; the next run resumes them with the same key). It returns how many
// were charged.
func checkClaims(tb testing.TB, b *billing.Biller, store *claim.Postgres, srv *billingtest.Server, ids []string, final bool) (charged int) {
	tb.Helper()
	ctx := context.Background()
	for _, c := range ids {
		n := srv.CountPeriod(c, "2026-09")
		if n > 1 {
			tb.Errorf("%s charged %d times", c, n)
		}
		charged += n
		key, err := b.Key(c, "2026-09", 1)
		if err != nil {
			tb.Fatal(err)
		}
		cl, err := store.Get(ctx, key.String())
		switch {
		case errors.Is(err, claim.ErrNotFound):
			if n != 0 {
				tb.Errorf("%s charged but never claimed", c)
			}
		case err != nil:
			tb.Fatal(err)
		case n == 1 && cl.State != claim.StateSucceeded && (final || cl.State != claim.StatePending),
			n == 0 && cl.State != claim.StatePending:
			tb.Errorf("%s: charged %d times, claim %s (%s); want succeeded when charged, pending otherwise", c, n, cl.State, cl.LastError)
		}
	}
	return charged
}

func TestVaultBillerRunStopsAtTheCap(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	const amount = 3000
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 10000, Per: spendcap.PerDay})
	var logs bytes.Buffer
	b, store := billerBehind(t, s, amount, billing.Charges, &logs)
	ids := customers(20)
	ctx := context.Background()

	sum, err := b.Run(ctx, "2026-09", billing.Customers(ids...), &billing.RunOptions{Concurrency: 4, BatchSize: 5})
	if !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("Run: %v; want ErrSpendCapReached", err)
	}
	// What is guaranteed: never above the cap, and claims that agree with
	// the ledger. How many of the admitted charges the fake has committed
	// when Run returns depends on timing: a run that stops abandons
	// requests in flight, which the proxy still forwards.
	if sum.Created > 3 || sum.Declined != 0 || sum.Complete() {
		t.Fatalf("summary %+v; want at most 3 created, none failed, an incomplete run", sum.Progress)
	}
	quiet(t, s)
	got := paidTotal(s.srv)
	if got > 10000 {
		t.Fatalf("charged %d at the fake; the cap is 10000", got)
	}
	if n := checkClaims(t, b, store, s.srv, ids, false); int64(n)*amount != got {
		t.Fatalf("claims agree with %d charges; the fake holds %d", n, got)
	}
	refused := map[string]int{}
	for _, e := range s.px.Log() {
		if e.Refused != "" {
			refused[e.IdempotencyKey]++
		}
	}
	for k, n := range refused {
		if n > 1 {
			t.Errorf("key %s was refused %d times: a cap refusal must not be retried", k, n)
		}
	}
	if len(refused) == 0 || len(refused) > 4 {
		t.Errorf("%d customers were refused; want between 1 and the run's concurrency (4)", len(refused))
	}

	// Once the cap is raised, later runs finish the job with the same keys,
	// charging nobody twice. (The fake's clock stays put: moving it past
	// Stripe's 24-hour key window without moving the database's would
	// resend keys Stripe has forgotten, which billonce reconciles only by
	// the database clock.) Claims abandoned in flight stay leased until the
	// lease ends on the database clock, so run again until complete.
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100000, Per: spendcap.PerDay})
	for {
		sum, err = b.Run(ctx, "2026-09", billing.Customers(ids...), nil)
		if err != nil {
			t.Fatalf("later run: %v", err)
		}
		if sum.Complete() {
			break
		}
	}
	if got := checkClaims(t, b, store, s.srv, ids, true); got != 20 {
		t.Fatalf("%d customers charged; want 20, once each", got)
	}
	s.atProxy.only(t, "the proxy", "Bearer "+vaultKey)
	s.atStripe.only(t, "the fake Stripe", "Bearer "+upstreamKey)
	for _, secret := range []string{vaultKey, appSecret} {
		if strings.Contains(logs.String(), secret) {
			t.Errorf("the Biller's logs contain a secret %q:\n%s", secret[:8], logs.String())
		}
	}
	if !strings.Contains(logs.String(), "spend cap") {
		t.Errorf("the logs do not mention the cap:\n%s", logs.String())
	}
}

func TestVaultBillerStopsOnRefusals(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		want  error
		api   billing.API
		setup func(s *stack)
	}{
		{"endpoint not allowed", spendcap.ErrEndpointNotAllowed, billing.PaymentIntents, func(s *stack) {
			s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1 << 40, AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges/*"}})
		}},
		{"revoked", spendcap.ErrVaultKeyRevoked, billing.Charges, func(s *stack) {
			s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1 << 40})
			s.px.Revoke(vaultKey)
		}},
		{"kill switch mid-run", spendcap.ErrVaultKeyRevoked, billing.Charges, func(s *stack) {
			s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 1 << 40})
			var n atomic.Int32
			s.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
				if r.Method == http.MethodPost && n.Add(1) == 5 {
					s.px.Suspend(true)
				}
				return billingtest.Fault{}
			})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s := newStack(t, spendcaptest.Config{})
			tt.setup(s)
			var logs bytes.Buffer
			b, store := billerBehind(t, s, 500, tt.api, &logs)
			ids := customers(30)
			sum, err := b.Run(context.Background(), "2026-09", billing.Customers(ids...), &billing.RunOptions{Concurrency: 3, BatchSize: 4})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Run: %v; want %v", err, tt.want)
			}
			if billing.Classify(err) != retry.Stop() {
				t.Errorf("Classify(%v) retries; want Stop", err)
			}
			if sum.Complete() || sum.Declined != 0 {
				t.Errorf("summary %+v; want an incomplete run with nothing failed", sum.Progress)
			}
			quiet(t, s)
			charged := checkClaims(t, b, store, s.srv, ids, false)
			if tt.name == "kill switch mid-run" {
				if charged < 5 || charged > 5+3 {
					t.Errorf("%d charged; want the 5 before the switch, plus at most those in flight", charged)
				}
			} else if charged != 0 || s.srv.Stats().Requests != 0 {
				t.Errorf("%d charged, %d requests at the fake; want none", charged, s.srv.Stats().Requests)
			}
			seen := map[string]int{}
			for _, e := range s.px.Log() {
				if e.Refused != "" {
					seen[e.IdempotencyKey]++
				}
			}
			if len(seen) == 0 || len(seen) > 3 {
				t.Errorf("%d customers refused; want between 1 and the run's concurrency (3)", len(seen))
			}
			for k, n := range seen {
				if n != 1 {
					t.Errorf("key %s refused %d times; a refusal is never retried", k, n)
				}
			}
			printed := fmt.Sprintf("%v\n%+v\n%s", err, sum.Failures, logs.String())
			if strings.Contains(printed, vaultKey) || strings.Contains(printed, appSecret) {
				t.Errorf("a secret was logged or returned:\n%s", printed)
			}
		})
	}
}

func TestVaultClassify(t *testing.T) {
	t.Parallel()
	s := newStack(t, spendcaptest.Config{})
	s.px.IssueKey(vaultKey, spendcap.Key{CapAmount: 100})
	api := proxied(t, s.proxyURL)
	s.srv.FailNext(billingtest.Match{}, billingtest.Fault{Kind: billingtest.FaultLockTimeout})
	_, err := api.Charges.New(vaultChargeParams("cus_1", "k1", 100))
	if billing.Classify(err) == retry.Stop() {
		t.Errorf("Classify(forwarded lock_timeout %v) = Stop; want a retry", err)
	}
	if _, err := api.Charges.New(vaultChargeParams("cus_1", "k1", 100)); err != nil {
		t.Fatal(err)
	}
	_, err = api.Charges.New(vaultChargeParams("cus_2", "k2", 100))
	if !errors.Is(err, spendcap.ErrSpendCapReached) || billing.Classify(err) != retry.Stop() {
		t.Errorf("Classify(cap refusal %v) retries, or the error does not match ErrSpendCapReached", err)
	}
}
