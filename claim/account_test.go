package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// A claim's account is part of its identity: the same customer and period
// under another account is refused, whether by the claim's key or by
// another, and nothing is claimed.
func TestClaimUnderAnotherAccountIsRefused(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		r := req("cus_1", "k1", "a")
		r.Account = "acct_1"
		mustClaim(t, h.store, r, claimengine.Won)
		for _, other := range []claimengine.Request{
			func() claimengine.Request { o := r; o.Account = ""; return o }(),
			func() claimengine.Request { o := r; o.Account = "acct_2"; o.Key = "k2"; return o }(),
		} {
			_, err := h.store.Claim(ctx, other)
			var m *claim.MismatchError
			if !errors.As(err, &m) || m.Field != "account" || m.Have != "acct_1" || m.Want != other.Account {
				t.Fatalf("claim under account %q: %v, want a mismatch on account", other.Account, err)
			}
		}
		if _, err := h.store.Get(ctx, "k2"); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("claim k2: %v, want none", err)
		}
		c, err := h.store.Get(ctx, "k1")
		if err != nil || c.Account != "acct_1" {
			t.Fatalf("claim = %+v, %v; want account acct_1", c, err)
		}
	})
}

// An update about another account's object never moves a claim, even with
// the claim's key and object id: ids and metadata mean nothing across
// accounts.
func TestUpdateFromAnotherAccountMovesNothing(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		r := req("cus_1", "k1", "a")
		r.Account = "acct_1"
		mustClaim(t, h.store, r, claimengine.Won)
		if err := h.store.Process(ctx, "k1", "ch_1"); err != nil {
			t.Fatal(err)
		}
		for i, acct := range []string{"", "acct_2"} {
			a, err := h.store.Apply(ctx, claimengine.Update{EventID: "evt_" + string(rune('a'+i)), EventType: "charge.failed", Key: "k1", StripeID: "ch_1",
				Created: time.Now(), State: string(claim.StateFailed), Account: acct})
			if err != nil || a.Outcome != claimengine.OtherPayment {
				t.Fatalf("update from account %q = %+v, %v; want OtherPayment", acct, a, err)
			}
		}
		a, err := h.store.Apply(ctx, claimengine.Update{EventID: "evt_own", EventType: "charge.succeeded", Key: "k1", StripeID: "ch_1",
			Created: time.Now(), State: string(claim.StateSucceeded), Account: "acct_1", Amount: 4200, Currency: "usd"})
		if err != nil || a.Outcome != claimengine.Changed || a.Claim.State != claim.StateSucceeded {
			t.Fatalf("update from the claim's account = %+v, %v; want it succeeded", a, err)
		}
	})
}
