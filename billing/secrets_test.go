package billing_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
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
		_, err := e.b.Charge(ctx, c, period)
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
	_, err = strict.b.Charge(ctx, "cus_401", period)
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
