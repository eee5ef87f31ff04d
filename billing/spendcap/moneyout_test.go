package spendcap_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// The proxy bounds money going out as it bounds charges: a payout's and a
// refund's amounts count against the vault key's cap, and a key that does
// not allow an endpoint refuses it.
func TestProxyBoundsPayoutsAndRefunds(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	srv, px := newProxy(t, spendcaptest.Config{})
	allowed := []string{"POST /v1/charges", "GET /v1/charges/*", "POST /v1/payouts", "GET /v1/payouts", "GET /v1/payouts/*",
		"POST /v1/refunds", "GET /v1/refunds"}
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: 10000, AllowedEndpoints: allowed})
	hc, err := spendcap.Client(px.URL, vaultKey, nil)
	if err != nil {
		t.Fatal(err)
	}
	store, err := claim.NewPostgres(pgtest.Pool(t), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{SecretKey: vaultKey, HTTPClient: hc, StripeURL: px.URL, Claims: store,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		}})
	if err != nil {
		t.Fatal(err)
	}
	acct := srv.CreateAccount()
	srv.SetBalance(acct, "usd", 100_000)
	p := billing.Price{Amount: 6000, Currency: "usd"}
	if _, err := b.Payout(ctx, acct, "2026-09", p, nil); err != nil {
		t.Fatalf("payout under the cap: %v", err)
	}
	if _, err := b.Payout(ctx, acct, "2026-10", p, nil); !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("payout past the cap: %v, want ErrSpendCapReached", err)
	}
	if _, err := b.Charge(ctx, "cus_1", "2026-09", nil); err != nil {
		t.Fatalf("charge under the cap: %v", err)
	}
	if _, err := b.Refund(ctx, "cus_1", "2026-09", "rma-1", 2000); !errors.Is(err, spendcap.ErrSpendCapReached) {
		t.Fatalf("refund past the cap: %v, want ErrSpendCapReached", err)
	}
	if _, err := b.Transfer(ctx, acct, "2026-09", billing.Price{Amount: 1, Currency: "usd"}, nil); !errors.Is(err, spendcap.ErrEndpointNotAllowed) {
		t.Fatalf("transfer with a key that does not allow transfers: %v, want ErrEndpointNotAllowed", err)
	}
	if n := len(srv.Movements("payout")); n != 1 {
		t.Fatalf("%d payouts at the fake, want 1", n)
	}
	if n := len(srv.Movements("refund")) + len(srv.Movements("transfer")); n != 0 {
		t.Fatalf("%d refunds and transfers at the fake, want none", n)
	}
}
