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
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/retry"
)

// syncBuffer is a bytes.Buffer safe for the Run's concurrent log writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// No secrets in logs: the secret key never appears in logs, errors or the Biller's own
// description, across retries, declines, unknown outcomes, reconciliation
// and a 401 that stops a run.
func TestSecretKeyNeverLeaks(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	opts := func(c *billing.Config) { c.Logger = logger; c.Retry.MaxAttempts = 3 }
	e := newEnv(t, opts)
	ctx := context.Background()
	var texts []string
	keep := func(err error) {
		if err != nil {
			texts = append(texts, err.Error(), fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err))
		}
	}

	e.srv.FailNext(billingtest.Match{Customer: "cus_cut"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Customer: "cus_500"}, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	five := billingtest.Fault{Kind: billingtest.FaultErrorBefore}
	e.srv.FailNext(billingtest.Match{Customer: "cus_unknown"}, five, five, five)
	e.srv.Decline("cus_decl", "insufficient_funds")
	for _, c := range []string{"cus_cut", "cus_500", "cus_unknown", "cus_decl"} {
		_, err := e.b.Charge(ctx, c, period, nil)
		keep(err)
	}
	key := e.crashedClaim("cus_old", amount)
	e.ageClaim(key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	sum, err := e.b.Run(ctx, period, billing.Customers("cus_cut", "cus_unknown", "cus_decl", "cus_old", "cus_new"), nil)
	keep(err)
	for _, f := range sum.Failures {
		keep(f)
	}

	// A key Stripe does not accept: the 401 stops the run.
	strict := newEnvWith(t, billingtest.Config{APIKeys: []string{"sk_test_not_the_billers_key_0000"}}, opts)
	_, err = strict.b.Charge(ctx, "cus_401", period, nil)
	keep(err)
	sum, err = strict.b.Run(ctx, period, billing.Customers(customers(5)...), nil)
	keep(err)
	for _, f := range sum.Failures {
		keep(f)
	}

	slog.New(slog.NewTextHandler(&logs, nil)).Info("biller", "biller", e.b)
	logger.Info("biller", "biller", e.b)
	texts = append(texts, e.b.String(), fmt.Sprint(e.b), fmt.Sprintf("%v", e.b), fmt.Sprintf("%+v", e.b), fmt.Sprintf("%#v", e.b),
		fmt.Sprintf("%v", *e.b), fmt.Sprintf("%+v", *e.b), fmt.Sprintf("%#v", *e.b), logs.String())

	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4] // Stripe's own messages show the last four characters
	for _, s := range texts {
		if strings.Contains(s, secret) {
			t.Fatalf("the secret key leaked into: %s", s)
		}
	}
	if !strings.Contains(logs.String(), "retrying with the same key") || !strings.Contains(logs.String(), e.key("cus_cut")) {
		t.Fatalf("the log misses the retries it should show:\n%s", logs.String())
	}
	if len(texts) < 20 {
		t.Fatalf("only %d texts checked; the scenario did not produce its errors", len(texts))
	}
}

// No secrets in logs, for URLs: a password or key in a Stripe or proxy URL (user info, query)
// never shows in an error, in the Biller's or the transport's String,
// GoString and %v/%+v/%#v, or in a log line, whether the URL parses or not.
// Such URLs are refused at construction, with the URL redacted.
func TestURLCredentialsNeverLeak(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	secrets := []string{"s3cr3t", "sk_live_x"}
	urls := []string{
		"https://user:s3cr3tpass@api.example.com/?key=sk_live_x",          // parses
		"https://user:s3cr3tpass@api.example.com:bad/?key=sk_live_x",      // bad port
		"http://user:s3cr3tpass@api exa mple.com/?key=sk_live_x",          // space in host
		"https://user:s3cr3t/pass@api.example.com/?key=sk_live_x",         // '/' in the password
		"https://user:s3cr3t?pass@api.example.com/v1?key=sk_live_x#frag",  // '?' in the password
		"https://user:s3cr3tpass@api.example.com/%zz?key=sk_live_x",       // bad escape
		"https://user:s3cr3tpass@[::1/?key=sk_live_x",                     // bad IPv6 literal
		"user:s3cr3tpass@api.example.com/?key=sk_live_x",                  // no scheme
		"https://api.example.com/?key=sk_live_x&s3cr3t=1",                 // query only
		"https://api.example.com/\x00?key=sk_live_x&s3cr3t=1",             // control character
		"https://api.example.com/stripe?key=sk_live_x\nuser:s3cr3t@evil/", // newline
	}
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	jsonLogger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var texts []string
	keep := func(v any) {
		texts = append(texts, fmt.Sprint(v), fmt.Sprintf("%v", v), fmt.Sprintf("%+v", v), fmt.Sprintf("%#v", v), fmt.Sprintf("%s", v), fmt.Sprintf("%q", v))
		logger.Info("value", "v", v)
		jsonLogger.Info("value", "v", v)
	}
	for _, u := range urls {
		b, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: u, Claims: e.store, Price: flatPrice(amount),
			Logger: logger, RateLimit: -1, HTTPClient: &http.Client{Transport: testTransport}, Retry: retry.Policy{MaxAttempts: 1}})
		if !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("New with StripeURL %q: %v; want ErrInvalid", u, err)
		}
		if err != nil {
			keep(err)
		}
		if b != nil {
			keep(b)
			keep(*b)
			_, err := b.Charge(ctx, "cus_url", period, nil)
			if err != nil {
				keep(err)
			}
		}
		for _, call := range []func() (any, error){
			func() (any, error) {
				return spendcap.NewTransport(spendcap.Config{ProxyURL: u, VaultKey: "vault_key_0001"})
			},
			func() (any, error) {
				return spendcap.NewTransport(spendcap.Config{ProxyURL: u, VaultKey: "vault_key_0001", AllowInsecure: true})
			},
			func() (any, error) { return spendcap.Client(u, "vault_key_0001", nil) },
		} {
			v, err := call()
			if !errors.Is(err, spendcap.ErrInvalid) {
				t.Errorf("proxy URL %q: %v; want ErrInvalid", u, err)
			}
			if err != nil {
				keep(err)
			} else {
				keep(v)
			}
		}
	}
	texts = append(texts, logs.String())
	for _, s := range texts {
		for _, secret := range secrets {
			if strings.Contains(s, secret) {
				t.Errorf("%q leaked into: %s", secret, s)
			}
		}
	}
	if len(texts) < 100 {
		t.Fatalf("only %d texts checked", len(texts))
	}
}

// No formatting verb shows a secret (no secrets in logs).
//
// Scenario: a Biller (or a VaultTransport) printed with a formatting verb
// other than v/s/q/x/X, e.g. a mistaken log.Printf("%d billers: %v", b).
// String, GoString and LogValue only cover those verbs; fmt prints the
// struct's fields for every other verb, unexported ones included.
//
// Expected: no verb shows the secret key or the vault key; without the
// guard, %d (and %t, %o, %e, ...) would print Config.SecretKey and the
// vault key.
func TestFormatVerbsNeverShowSecrets(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	const vaultKey = "vault_live_S3cretVaultKeyNeverPrint9876"
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com/stripe", VaultKey: vaultKey})
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4]
	vsecret := vaultKey[:len(vaultKey)-4]
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%t", "%o"} {
		for name, v := range map[string]any{"*Biller": e.b, "Biller": *e.b, "*VaultTransport": vt} {
			out := fmt.Sprintf(verb, v)
			if strings.Contains(out, secret) || strings.Contains(out, vsecret) {
				t.Errorf("fmt %s of %s prints a secret: %.160s…", verb, name, out)
			}
		}
	}
}

// The webhook secret and the Stripe key appear in no error, answer or log
// line, whatever is wrong: a secret with white space, a delivery signed
// with another secret, a dispute whose payment cannot be read.
func TestWebhookSecretsNeverShown(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	bad := "whsec_" + "leakme0123456789 x"
	_, err := h.b.Webhook(billing.WebhookConfig{Secret: bad, Tolerance: -1})
	if err == nil || strings.Contains(err.Error(), "leakme") {
		t.Fatalf("Webhook with a bad secret: %v", err)
	}
	r, err := h.b.Charge(context.Background(), "cus_s", period, nil)
	if err != nil {
		t.Fatal(err)
	}
	ev := chargeEvent(t, "evt_attack3_secret", "charge.succeeded", r.StripeID, "succeeded", h.key("cus_s"), "cus_s", time.Now())
	_, body1 := h.post(ev.Body, billingtest.Sign(ev.Body, "whsec_other0123456789", time.Now()))
	// A dispute about a payment the fake does not know: reading it fails.
	disp := []byte(`{"id":"evt_attack3_disp","object":"event","api_version":"` + billingtest.APIVersion + `","created":1,"type":"charge.dispute.created","data":{"object":{"id":"dp_x","object":"dispute","charge":"ch_nosuch","reason":"fraudulent"}}}`)
	_, body2 := h.post(disp, billingtest.Sign(disp, whsec, time.Now()))
	// An event the claim table cannot take: acknowledged, logged and
	// observed as not applied.
	long := chargeEvent(t, "evt_attack3_long", "charge.succeeded", "ch_long", "succeeded", strings.Repeat("k", 300), "cus_s", time.Now())
	_, body3 := h.post(long.Body, billingtest.Sign(long.Body, whsec, time.Now()))
	var observed []string
	for _, e := range h.observed() {
		observed = append(observed, fmt.Sprintf("%v %+v", e.Err, e))
	}
	for _, s := range append([]string{body1, body2, body3, h.logs.String()}, observed...) {
		for _, secret := range []string{whsec, secretKey, "whsec_other", secretKey[len(secretKey)-8:]} {
			if strings.Contains(s, secret) {
				t.Fatalf("%q shows a secret: %s", secret, s)
			}
		}
	}
	if len(observed) != 2 {
		t.Errorf("observed %d events, want the two not applied", len(observed))
	}
	t.Logf("answers: %q, %q, %q", body1, body2, body3)
}

// A configuration printed whole, the way start-up code and panics print
// them (fmt verbs, slog's text and JSON handlers), shows no secret: not the
// Stripe key in billing.Config, nor the vault key in spendcap.Config.
func TestConfigsPrintNoSecret(t *testing.T) {
	t.Parallel()
	const vault = "vault_live_S3cretVaultKeyNeverPrint9876"
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4]
	vsecret := vault[:len(vault)-4]
	values := map[string]any{
		"billing.Config":                   billing.Config{SecretKey: secretKey, StripeURL: "https://api.stripe.com", Scope: "s"},
		"billing.Config with a credential": billing.Config{SecretKey: vault, Credential: secretKey},
		"*billing.Config":                  &billing.Config{SecretKey: secretKey},
		"spendcap.Config":                  spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vault},
		"*spendcap.Config":                 &spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: vault},
	}
	px, err := spendcap.NewProxy(spendcap.ProxyConfig{Upstream: "https://api.stripe.com", StripeKey: secretKey, Store: spendcap.NewMemoryStore()})
	if err != nil {
		t.Fatal(err)
	}
	values["spendcap.ProxyConfig"] = spendcap.ProxyConfig{Upstream: "https://api.stripe.com", StripeKey: secretKey}
	values["*spendcap.Proxy"] = px
	for name, v := range values {
		var outs []string
		for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%X", "%d", "%t", "%o"} {
			outs = append(outs, verb+" "+fmt.Sprintf(verb, v))
		}
		var text, js bytes.Buffer
		slog.New(slog.NewTextHandler(&text, nil)).Info("start", "config", v)
		slog.New(slog.NewJSONHandler(&js, nil)).Info("start", "config", v)
		outs = append(outs, "slog text "+text.String(), "slog json "+js.String())
		for _, out := range outs {
			if strings.Contains(out, secret) || strings.Contains(out, vsecret) {
				t.Errorf("%s prints a secret: %.200s", name, out)
			}
		}
	}
}

// Secrets around the identity checks: neither the secret key nor the
// Credential name shows in IdentityError or the log lines of a rotation.
func TestNoSecretInIdentityErrors(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, oneAttempt, func(c *billing.Config) { c.Logger = logger })
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	e.b.Charge(ctx, "cus_1", period, nil)
	rot := e.biller(oneAttempt, func(c *billing.Config) { c.Logger = logger; c.SecretKey = rotatedKey })
	_, err := rot.Charge(ctx, "cus_1", period, nil)
	if err == nil {
		t.Fatal("rotated Charge succeeded within the window")
	}
	text := fmt.Sprintf("%v %+v %#v %s", err, err, err, logs.String())
	for _, s := range []string{secretKey[8 : len(secretKey)-4], rotatedKey[8 : len(rotatedKey)-4]} {
		if strings.Contains(text, s) {
			t.Fatalf("a secret leaked: %s", text)
		}
	}
}

// No secrets in the refund path: its errors (a lost answer, a 500, an
// unknown outcome, Stripe's refusal, bad input, a refused key) and its log
// lines never show the secret key.
func TestSecretKeyNeverLeaksFromRefunds(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, func(c *billing.Config) { c.Logger = logger; c.Retry.MaxAttempts = 2 })
	ctx := context.Background()
	pay := paidFor(t, e, "cus_s")
	var texts []string
	var errs []string
	keep := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
			texts = append(texts, err.Error(), fmt.Sprintf("%v", err), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err))
		}
	}
	post := billingtest.Match{Method: "POST", Path: "/v1/refunds"}
	five := billingtest.Fault{Kind: billingtest.FaultErrorBefore}
	e.srv.FailNext(post, billingtest.Fault{Kind: billingtest.FaultCut})
	_, err := e.b.Refund(ctx, "cus_s", period, "cut", 100)
	keep(err)
	e.srv.FailNext(post, billingtest.Fault{Kind: billingtest.FaultErrorAfter})
	_, err = e.b.Refund(ctx, "cus_s", period, "five-after", 100)
	keep(err)
	e.srv.FailNext(post, five, five)
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/refunds"}, billingtest.Fault{}, five, five)
	_, err = e.b.Refund(ctx, "cus_s", period, "unknown", 100)
	keep(err)
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/refunds"}, five, five)
	_, err = e.b.Refund(ctx, "cus_s", period, "list-down", 100)
	keep(err)
	if err := e.srv.Refund(pay, 2000); err != nil {
		t.Fatal(err)
	}
	_, err = e.b.Refund(ctx, "cus_s", period, "too-large", 400) // Stripe holds 300 as left
	keep(err)
	_, err = e.b.Refund(ctx, "cus_s", period, "bad id", 100)
	keep(err)
	_, err = e.b.Refund(ctx, "cus_none", period, "none", 100)
	keep(err)
	// A key Stripe refuses, the payment's claim in place.
	strict := newEnvWith(t, billingtest.Config{APIKeys: []string{secretKey}})
	paidFor(t, strict, "cus_s")
	refused := strict.biller(func(c *billing.Config) { c.Logger = logger; c.SecretKey = "sk_test_not_the_billers_key_0000" })
	_, err = refused.Refund(ctx, "cus_s", period, "refused-key", 100)
	keep(err)
	texts = append(texts, logs.String())

	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4] // Stripe's own messages show the last four characters
	for _, s := range texts {
		if strings.Contains(s, secret) {
			t.Fatalf("the secret key leaked into: %s", s)
		}
	}
	if len(errs) != 6 || !strings.Contains(logs.String(), "retrying with the same key") {
		t.Fatalf("errors checked: %q; want 6 (an unknown outcome, a listing down, Stripe's refusal, two bad inputs, a refused key)", errs)
	}
}

// No secrets in logs, for answers: a gateway in front of Stripe that
// echoes the request's Authorization header into its answer (a Stripe-
// shaped error, a Request-Id, an error page larger than Stripe's) never
// puts the key into an error, a log line or an event given to
// Config.Observe; and nothing is charged twice for it.
func TestSecretKeyEchoedByAnAnswerNeverLeaks(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var (
		mu     sync.Mutex
		events []billing.Event
	)
	observe := func(ev billing.Event) {
		mu.Lock()
		defer mu.Unlock()
		events = append(events, ev)
	}
	e := newEnv(t)
	fake, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httputil.NewSingleHostReverseProxy(fake)
	proxy.ModifyResponse = func(resp *http.Response) error {
		resp.Header.Set("Request-Id", "req_"+resp.Request.Header.Get("Authorization"))
		return nil
	}
	gw := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		form, _ := url.ParseQuery(string(body))
		switch form.Get("customer") {
		case "cus_shaped": // a Stripe-shaped error, every field the header
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, `{"error":{"type":%q,"code":%q,"message":%q,"param":%q,"decline_code":%q,"doc_url":%q,"request_log_url":%q}}`,
				"api_error", auth, "upstream refused "+auth, auth, auth, auth, auth)
		case "cus_stamped": // the same, stamped as Stripe's
			w.Header().Set("Request-Id", "req_"+auth)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusBadRequest)
			fmt.Fprintf(w, `{"error":{"type":"invalid_request_error","message":%q}}`, "bad header "+auth)
		case "cus_page": // a large page that starts with the header
			w.Header().Set("Content-Type", "text/html")
			w.WriteHeader(http.StatusBadGateway)
			fmt.Fprintf(w, "<html>%s %s", auth, strings.Repeat("x", 70<<10))
		default: // Stripe's own answer, with the header as its Request-Id
			proxy.ServeHTTP(w, r)
		}
	}))
	t.Cleanup(gw.Close)
	b := e.biller(func(c *billing.Config) {
		c.StripeURL, c.Logger, c.Observe, c.Retry.MaxAttempts = gw.URL, logger, observe, 2
	})
	ctx := context.Background()
	var texts []string
	for _, c := range []string{"cus_shaped", "cus_stamped", "cus_page", "cus_ok"} {
		r, err := b.Charge(ctx, c, period, nil)
		if err != nil {
			texts = append(texts, err.Error(), fmt.Sprintf("%+v", err), fmt.Sprintf("%#v", err))
		}
		texts = append(texts, fmt.Sprintf("%+v", r))
	}
	mu.Lock()
	for _, ev := range events {
		texts = append(texts, fmt.Sprintf("%+v", ev))
		if ev.Err != nil {
			texts = append(texts, ev.Err.Error())
		}
	}
	n := len(events)
	mu.Unlock()
	texts = append(texts, logs.String())
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4]
	for _, s := range texts {
		if strings.Contains(s, secret) {
			t.Errorf("the secret key leaked into: %.600s", s)
		}
	}
	if n < 8 {
		t.Fatalf("only %d events; the scenario did not produce its calls", n)
	}
	if got := e.count("cus_ok"); got != 1 {
		t.Errorf("cus_ok charged %d times, want once", got)
	}
	for _, c := range []string{"cus_shaped", "cus_stamped", "cus_page"} {
		if got := e.count(c); got != 0 {
			t.Errorf("%s charged %d times, want none: the gateway answered for Stripe", c, got)
		}
	}
}
