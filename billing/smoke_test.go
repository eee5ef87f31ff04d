package billing_test

import (
	"context"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestSmoke(t *testing.T) {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_x", StripeURL: srv.URL, Claims: store,
		Price: func(ctx context.Context, c, p string) (billing.Price, error) {
			return billing.Price{Amount: 100, Currency: "usd"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	srv.FailNext(billingtest.Match{Customer: "cus_1"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := b.Charge(ctx, "cus_1", "2026-09")
	t.Logf("%+v %v", r, err)
	r, err = b.Charge(ctx, "cus_1", "2026-09")
	t.Logf("%+v %v", r, err)
	sum, err := b.Run(ctx, "2026-09", billing.Customers("cus_1", "cus_2", "cus_3", "bad id"), nil)
	t.Logf("%+v %v", sum, err)
	for _, c := range []string{"cus_1", "cus_2", "cus_3"} {
		if n := srv.CountPeriod(c, "2026-09"); n != 1 {
			t.Errorf("%s charged %d times", c, n)
		}
	}
	t.Logf("%+v", srv.Stats())
}

func TestRunSameCustomerTwiceChargesOnce(t *testing.T) {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	b, err := billing.New(billing.Config{SecretKey: "sk_test_x", StripeURL: srv.URL, Claims: claim.NewMemory(claim.Config{}),
		Price: func(ctx context.Context, c, p string) (billing.Price, error) {
			return billing.Price{Amount: 100, Currency: "usd"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	sum, err := b.Run(ctx, "2026-09", billing.Customers("cus_1", "cus_2", "cus_1"), nil)
	if err != nil {
		t.Fatal(err)
	}
	if n := srv.CountPeriod("cus_1", "2026-09"); n != 1 {
		t.Errorf("cus_1 charged %d times", n)
	}
	if sum.Created != 2 || sum.Invalid != 1 {
		t.Errorf("summary %+v: want 2 created, 1 invalid (listed twice)", sum.Progress)
	}
}
