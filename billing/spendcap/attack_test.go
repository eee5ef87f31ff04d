package spendcap_test

import (
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// A 500 that stored nothing at the upstream (error before execution) marks
// the idempotency key as counted. A resend with that key and a larger
// amount then reserves nothing, yet the upstream executes it afresh: money
// moves past the cap.
func TestAttackUnknownThenBiggerAmountSameKey(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, billingtest.ProxyConfig{})
	px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 1000})
	srv.FailNext(billingtest.Match{IdempotencyKey: "k-unknown"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if a := post(t, px.URL, vaultKey, "k-unknown", "cus_1", 100); a.status != 500 {
		t.Fatalf("first: status %d, want 500", a.status)
	}
	a := post(t, px.URL, vaultKey, "k-unknown", "cus_1", 5000)
	total, _ := paid(srv)
	u := px.Usage(vaultKey)
	t.Logf("resend status %d; paid at fake %d; proxy counted spent %d reserved %d; cap 1000", a.status, total, u.Spent, u.Reserved)
	if total > 1000 || total > u.Spent {
		t.Errorf("moved %d at the fake but the proxy counts %d (cap 1000)", total, u.Spent)
	}
}

// The same, across vault keys: a key with a tiny cap reuses an idempotency
// key another vault key got counted by an unknown outcome.
func TestAttackCountedKeyReusedByOtherVaultKey(t *testing.T) {
	t.Parallel()
	srv, px := newProxy(t, billingtest.ProxyConfig{})
	const small = "vault_key_test_small_00000000000000007"
	px.IssueKey(billingtest.VaultKey{Key: vaultKey, CapAmount: 1000})
	px.IssueKey(billingtest.VaultKey{Key: small, CapAmount: 10})
	srv.FailNext(billingtest.Match{IdempotencyKey: "k-shared"}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	post(t, px.URL, vaultKey, "k-shared", "cus_1", 100)
	a := post(t, px.URL, small, "k-shared", "cus_2", 5000)
	total, _ := paid(srv)
	t.Logf("small-cap key resend status %d; paid at fake %d; small key usage %+v", a.status, total, px.Usage(small))
	if total > 0 && px.Usage(small).Spent < 5000 && a.status < 300 {
		t.Errorf("vault key with cap 10 moved %d at the fake, counted %d", total, px.Usage(small).Spent)
	}
}
