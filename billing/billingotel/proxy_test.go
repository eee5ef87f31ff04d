package billingotel_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/retry"
)

// A Run through a spend-cap proxy whose cap admits one charge: the
// proxy's requests are counted as admitted, then refused by the cap.
func TestProxyRequests(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	tel := newTelemetry(t)
	srv := billingtest.Start(t, billingtest.Config{})
	const vault = "vault_test_billingotelProxyKey0001"
	store := spendcap.NewMemoryStore()
	if err := store.IssueKey(ctx, vault, spendcap.Key{CapAmount: 1500, Per: spendcap.PerRun}); err != nil {
		t.Fatal(err)
	}
	px, err := spendcap.NewProxy(spendcap.ProxyConfig{Upstream: srv.URL, StripeKey: secretKey, Store: store,
		Observe: tel.obs.ObserveProxy})
	if err != nil {
		t.Fatal(err)
	}
	hs := httptest.NewServer(px)
	t.Cleanup(hs.Close)
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: hs.URL, VaultKey: vault,
		Base: http.DefaultTransport.(*http.Transport).Clone()})
	if err != nil {
		t.Fatal(err)
	}
	claims, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := claims.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{
		SecretKey: secretKey,
		Claims:    claims,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 1500, Currency: "usd", PaymentMethod: "pm_card_visa"}, nil
		},
		RateLimit:  -1,
		HTTPClient: &http.Client{Transport: vt},
		Retry:      retry.Policy{InitialInterval: time.Millisecond, MaxInterval: 10 * time.Millisecond, MaxAttempts: 2, AttemptTimeout: 5 * time.Second},
		Observe:    tel.obs.Observe,
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.Charge(ctx, "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Charge(ctx, "cus_2", period, nil); !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("second charge: %v; want ErrSpendCapReached", err)
	}
	m := tel.metrics(t)
	// One POST each: the first admitted, the second refused by the cap.
	equal(t, "billonce.proxy.requests", sums(t, m["billonce.proxy.requests"]), map[string]int64{
		"billonce.result=admitted": 1, "billonce.result=cap": 1,
	})
	equal(t, "billonce.writes", sums(t, m["billonce.writes"]), map[string]int64{
		"billonce.api=charges,billonce.object=charge,billonce.outcome=created":                                 1,
		"billonce.api=charges,billonce.object=charge,billonce.outcome=not_billed,error.type=spend_cap_reached": 1,
	})
}
