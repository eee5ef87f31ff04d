package billing_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
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

// I9: the secret key never appears in logs, errors or the Biller's own
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

// I9 for URLs: a password or key in a Stripe or proxy URL (user info, query)
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
