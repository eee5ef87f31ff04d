package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

const lease = time.Minute

func req(customer, key, owner string) claimengine.Request {
	return claimengine.Request{Customer: customer, Period: "2025-01", Key: key, Amount: 4200, Currency: "usd", Owner: owner}
}

func mustClaim(t *testing.T, s engine, r claimengine.Request, want claimengine.Outcome) result {
	t.Helper()
	res, err := s.Claim(context.Background(), r)
	if err != nil {
		t.Fatalf("Claim(%s as %s): %v", r.Key, r.Owner, err)
	}
	if res.Outcome != want {
		t.Fatalf("Claim(%s as %s) = %v, want %v (claim %+v)", r.Key, r.Owner, res.Outcome, want, res.Claim)
	}
	return res
}

func TestClaimLifecycle(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		won := mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		c := won.Claim
		if c.State != claim.StatePending || c.Leases != 1 || c.Owner != "a" || c.Amount != 4200 || c.Currency != "usd" ||
			c.Customer != "cus_1" || c.Period != "2025-01" || c.Key != "k1" {
			t.Fatalf("won claim = %+v", c)
		}
		if d := c.LeaseUntil.Sub(c.CreatedAt); d < lease-time.Second || d > lease+time.Second {
			t.Errorf("lease runs %v after creation, want %v", d, lease)
		}
		if got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.InProgress).Claim; got.Owner != "a" || got.Leases != 1 {
			t.Errorf("in progress claim = %+v, want owner a, attempts 1", got)
		}
		if got := mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Resumed).Claim; got.Owner != "a" || got.Leases != 2 {
			t.Errorf("resumed own claim = %+v, want owner a, attempts 2", got)
		}
		if err := s.Succeed(ctx, "k1", "ch_1"); err != nil {
			t.Fatal(err)
		}
		if err := s.Succeed(ctx, "k1", "ch_1"); err != nil {
			t.Errorf("second Succeed with the same id: %v", err)
		}
		if err := s.Succeed(ctx, "k1", "ch_2"); !errors.Is(err, claimengine.ErrConflict) {
			t.Errorf("Succeed with another id = %v, want ErrConflict", err)
		}
		if err := s.Fail(ctx, "k1", "", "declined"); !errors.Is(err, claimengine.ErrConflict) {
			t.Errorf("Fail after success = %v, want ErrConflict", err)
		}
		for _, owner := range []string{"a", "b"} {
			got := mustClaim(t, s, req("cus_1", "k1", owner), claimengine.Succeeded).Claim
			if got.StripeID != "ch_1" || got.State != claim.StateSucceeded || got.Leases != 2 {
				t.Errorf("succeeded claim = %+v", got)
			}
		}
		if err := s.Renew(ctx, "k1", "a"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Renew of a succeeded claim = %v, want ErrLeaseLost", err)
		}
		if err := s.CheckSend(ctx, "k1", "a", time.Hour); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("CheckSend of a succeeded claim = %v, want ErrLeaseLost", err)
		}
	})
}

func TestFailIsTerminalForTheKey(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		if err := s.Fail(ctx, "k1", "", "card_declined"); err != nil {
			t.Fatal(err)
		}
		if err := s.Fail(ctx, "k1", "", "card_declined again"); err != nil {
			t.Errorf("second Fail: %v", err)
		}
		if err := s.Succeed(ctx, "k1", "ch_1"); !errors.Is(err, claimengine.ErrConflict) {
			t.Errorf("Succeed after Fail = %v, want ErrConflict", err)
		}
		got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Failed).Claim
		if got.LastError != "card_declined" || got.Leases != 1 {
			t.Errorf("failed claim = %+v", got)
		}
		// Billing again is an explicit new attempt under a new key.
		if got := mustClaim(t, s, req("cus_1", "k1-attempt2", "b"), claimengine.Won).Claim; got.Leases != 1 {
			t.Errorf("new attempt = %+v", got)
		}
		mustClaim(t, s, req("cus_1", "k1", "c"), claimengine.Failed)
		// While the new attempt is live, a third key for the period is refused.
		var mm *claim.MismatchError
		if _, err := s.Claim(ctx, req("cus_1", "k1-attempt3", "c")); !errors.As(err, &mm) || mm.Field != "key" || mm.Have != "k1-attempt2" {
			t.Errorf("third key while the second is pending = %v, want a key mismatch with k1-attempt2", err)
		}
	})
}

func TestMismatchIsRefused(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		mustClaim(t, s, req("cus_2", "k2", "a"), claimengine.Won)
		if err := s.Succeed(ctx, "k2", "ch_2"); err != nil {
			t.Fatal(err)
		}
		h.pass(t, 2*lease) // expired leases must not let a mismatch through
		amount, currency, otherKey := req("cus_1", "k1", "b"), req("cus_2", "k2", "b"), req("cus_1", "k9", "b")
		amount.Amount = 4300
		currency.Currency = "eur"
		otherPeriod := req("cus_1", "k1", "b")
		otherPeriod.Period = "2025-02"
		for _, tc := range []struct {
			name  string
			req   claimengine.Request
			field string
			have  string
		}{
			{"amount", amount, "amount", "4200"},
			{"currency of a succeeded claim", currency, "currency", "usd"},
			{"another key for a pending period", otherKey, "key", "k1"},
			{"key of another customer", req("cus_3", "k1", "b"), "customer", "cus_1"},
			{"key of another period", otherPeriod, "period", "2025-01"},
		} {
			_, err := s.Claim(ctx, tc.req)
			var mm *claim.MismatchError
			if !errors.As(err, &mm) {
				t.Errorf("%s: Claim = %v, want a *MismatchError", tc.name, err)
				continue
			}
			if mm.Field != tc.field || mm.Have != tc.have || mm.Existing.Leases != 1 {
				t.Errorf("%s: mismatch %+v, want field %s have %s", tc.name, mm, tc.field, tc.have)
			}
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%s: error %q does not name the field", tc.name, err)
			}
		}
		// Nothing was taken over or written.
		for _, k := range []string{"k1", "k2"} {
			c, err := s.Get(ctx, k)
			if err != nil || c.Leases != 1 || c.Owner != "a" || c.Amount != 4200 || c.Currency != "usd" {
				t.Errorf("after mismatches Get(%s) = %+v, %v", k, c, err)
			}
		}
		if _, err := s.Get(ctx, "k9"); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get(k9) = %v, want ErrNotFound", err)
		}
	})
}

func TestTakeoverAfterCrash(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "crashed"), claimengine.Won)
		h.pass(t, lease/2)
		mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.InProgress)
		if st, err := s.Stale(ctx, ""); err != nil || len(st) != 0 {
			t.Fatalf("Stale with a live lease = %v, %v", st, err)
		}
		h.pass(t, lease/2+time.Second) // the crashed runner never renews
		st, err := s.Stale(ctx, "")
		if err != nil || len(st) != 1 || st[0].Key != "k1" || st[0].Owner != "crashed" {
			t.Fatalf("Stale = %+v, %v; want k1 held by crashed", st, err)
		}
		got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed).Claim
		if got.Key != "k1" || got.Owner != "b" || got.Leases != 2 || got.Age < lease {
			t.Errorf("resumed = %+v", got)
		}
		if err := s.Renew(ctx, "k1", "crashed"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Renew by the crashed owner = %v, want ErrLeaseLost", err)
		}
		if err := s.Release(ctx, "k1", "crashed", "", "late"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Release by the crashed owner = %v, want ErrLeaseLost", err)
		}
		if err := s.Renew(ctx, "k1", "b"); err != nil {
			t.Errorf("Renew by the new owner: %v", err)
		}
		if st, err := s.Stale(ctx, ""); err != nil || len(st) != 0 {
			t.Errorf("Stale after takeover = %v, %v", st, err)
		}
	})
}

func TestRenewKeepsTheClaim(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		for range 4 {
			h.pass(t, lease*3/4)
			if err := s.Renew(ctx, "k1", "a"); err != nil {
				t.Fatal(err)
			}
		}
		h.pass(t, lease*3/4)
		mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.InProgress)
		h.pass(t, lease/4+time.Second)
		mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed)
	})
}

func TestReleaseLetsTheNextRunResume(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won)
		if err := s.Release(ctx, "k1", "a", "", "timeout after 30s"); err != nil {
			t.Fatal(err)
		}
		if err := s.Renew(ctx, "k1", "a"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Renew after Release = %v, want ErrLeaseLost", err)
		}
		h.pass(t, time.Millisecond)
		st, err := s.Stale(ctx, "")
		if err != nil || len(st) != 1 || st[0].LastError != "timeout after 30s" || st[0].Owner != "" {
			t.Fatalf("Stale after Release = %+v, %v", st, err)
		}
		got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed).Claim
		if got.LastError != "timeout after 30s" || got.Leases != 2 || got.State != claim.StatePending {
			t.Errorf("resumed = %+v", got)
		}
	})
}

// A release that names the object the claim's steps made (an invoice)
// records it on a claim that records none, without moving the key's
// window, and never replaces one the claim records; a claim that records
// one is never abandoned.
func TestReleaseRecordsTheObjectTheClaimHolds(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		first := mustClaim(t, s, req("cus_1", "k1", "a"), claimengine.Won).Claim
		if err := s.Release(ctx, "k1", "a", "in_1", "timeout after 30s"); err != nil {
			t.Fatal(err)
		}
		got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed).Claim
		if got.StripeID != "in_1" || got.Step != "" || !got.FirstSentAt.Equal(first.FirstSentAt) {
			t.Fatalf("after a release holding in_1: stripe id %q, step %q, window from %v (claimed from %v)", got.StripeID, got.Step, got.FirstSentAt, first.FirstSentAt)
		}
		if err := s.Release(ctx, "k1", "b", "in_2", "again"); err != nil {
			t.Fatal(err)
		}
		got = mustClaim(t, s, req("cus_1", "k1", "c"), claimengine.Resumed).Claim
		if got.StripeID != "in_1" {
			t.Fatalf("a second release holding in_2 left stripe id %q, want in_1 kept", got.StripeID)
		}
		if err := s.Abandon(ctx, "k1", "c"); err == nil {
			t.Fatal("abandoned a claim that holds in_1")
		}
		if c, err := s.Get(ctx, "k1"); err != nil || c.State != claim.StatePending || c.StripeID != "in_1" {
			t.Fatalf("after the refused abandon: %+v, %v", c, err)
		}
	})
}

// The deadline: the key's window starts when the claim is made and closes after the
// given window on the store's clock; a search that found nothing reopens
// it, for the endpoint and credential that will send the key from then on.
func TestKeyWindow(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		r := req("cus_1", "k1", "a")
		r.Endpoint, r.Credential, r.Scope, r.Attempt = "charges", "fp1", "s", 1
		got := mustClaim(t, s, r, claimengine.Won).Claim
		if got.Endpoint != "charges" || got.Credential != "fp1" || got.Scope != "s" || got.Attempt != 1 ||
			got.FirstSentAt.IsZero() || got.SentAge > time.Minute || !got.ReconciledAt.IsZero() {
			t.Fatalf("won claim = %+v", got)
		}
		if err := s.CheckSend(ctx, "k1", "a", 23*time.Hour); err != nil {
			t.Errorf("CheckSend of a new claim = %v", err)
		}
		if err := s.CheckSend(ctx, "k1", "b", 23*time.Hour); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("CheckSend by another owner = %v, want ErrLeaseLost", err)
		}
		h.pass(t, 23*time.Hour)
		if err := s.CheckSend(ctx, "k1", "a", 23*time.Hour); !errors.Is(err, claimengine.ErrWindowClosed) {
			t.Errorf("CheckSend after 23h = %v, want ErrWindowClosed", err)
		}
		// A resume does not move the window, whoever resumes.
		r.Owner, r.Endpoint, r.Credential = "b", "payment_intents", "fp2"
		got = mustClaim(t, s, r, claimengine.Resumed).Claim
		if got.Endpoint != "charges" || got.Credential != "fp1" || got.SentAge < 23*time.Hour {
			t.Errorf("resumed claim = %+v; want the first endpoint, credential and window", got)
		}
		if err := s.Reopen(ctx, "k1", "a", "payment_intents", "fp2"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Reopen by a former owner = %v, want ErrLeaseLost", err)
		}
		if err := s.Reopen(ctx, "k1", "b", "payment_intents", "fp2"); err != nil {
			t.Fatal(err)
		}
		if err := s.CheckSend(ctx, "k1", "b", 23*time.Hour); err != nil {
			t.Errorf("CheckSend after Reopen = %v", err)
		}
		got, err := s.Get(ctx, "k1")
		if err != nil || got.Endpoint != "payment_intents" || got.Credential != "fp2" || got.SentAge > time.Minute ||
			got.ReconciledAt.IsZero() || got.Age < 23*time.Hour {
			t.Errorf("reopened claim = %+v, %v", got, err)
		}
	})
}

// Stale lists expired leases of one scope, and of claims whose scope is
// unknown, oldest first.
func TestStaleByScope(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		for i, scope := range []string{"a", "b", ""} {
			r := req(fmt.Sprintf("cus_%d", i), "k_"+scope, "x")
			r.Scope = scope
			mustClaim(t, h.store, r, claimengine.Won)
			h.pass(t, time.Millisecond)
		}
		mustClaim(t, h.store, req("cus_done", "done", "x"), claimengine.Won)
		if err := h.store.Succeed(ctx, "done", "ch_done"); err != nil {
			t.Fatal(err)
		}
		h.pass(t, lease+time.Second)
		mustClaim(t, h.store, req("cus_live", "live", "x"), claimengine.Won)
		keys := func(scope string) string {
			t.Helper()
			cs, err := h.store.Stale(ctx, scope)
			if err != nil {
				t.Fatal(err)
			}
			var ks []string
			for _, c := range cs {
				ks = append(ks, c.Key)
			}
			return strings.Join(ks, ",")
		}
		for scope, want := range map[string]string{"a": "k_a,k_", "b": "k_b,k_", "": "k_a,k_b,k_", "c": "k_"} {
			if got := keys(scope); got != want {
				t.Errorf("Stale(%q) = %s, want %s", scope, got, want)
			}
		}
	})
}

func TestClaimBatchOutcomes(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		mustClaim(t, s, req("busy", "k-busy", "other"), claimengine.Won)
		mustClaim(t, s, req("paid", "k-paid", "other"), claimengine.Won)
		mustClaim(t, s, req("declined", "k-declined", "other"), claimengine.Won)
		mustClaim(t, s, req("stale", "k-stale", "other"), claimengine.Won)
		if err := errors.Join(s.Succeed(ctx, "k-paid", "ch_paid"), s.Fail(ctx, "k-declined", "", "card_declined")); err != nil {
			t.Fatal(err)
		}
		h.pass(t, lease+time.Second)
		mustClaim(t, s, req("busy", "k-busy", "other"), claimengine.Resumed) // renewed by its owner
		wrongAmount := req("busy", "k-busy", "me")
		wrongAmount.Amount = 1
		reqs := []claimengine.Request{
			req("fresh", "k-fresh", "me"),
			req("paid", "k-paid", "me"),
			req("stale", "k-stale", "me"),
			req("declined", "k-declined", "me"),
			wrongAmount,
			req("fresh2", "k-fresh2", "me"),
		}
		want := []claimengine.Outcome{claimengine.Won, claimengine.Succeeded, claimengine.Resumed, claimengine.Failed, claimengine.Mismatch, claimengine.Won}
		res, err := s.ClaimBatch(ctx, reqs)
		var mm *claim.MismatchError
		if !errors.As(err, &mm) || mm.Field != "amount" || mm.Existing.Key != "k-busy" {
			t.Errorf("ClaimBatch error = %v, want the amount mismatch on k-busy", err)
		}
		if len(res) != len(reqs) {
			t.Fatalf("ClaimBatch returned %d results for %d requests", len(res), len(reqs))
		}
		for i, r := range res {
			if r.Outcome != want[i] || r.Claim.Key != reqs[i].Key {
				t.Errorf("result %d = %v for %s, want %v for %s", i, r.Outcome, r.Claim.Key, want[i], reqs[i].Key)
			}
			if (r.Conflict != nil) != (r.Outcome == claimengine.Mismatch) {
				t.Errorf("result %d: outcome %v with Conflict %v", i, r.Outcome, r.Conflict)
			}
		}
		if c, ok := res[4].Conflict.(*claim.MismatchError); !ok || c.Field != "amount" {
			t.Errorf("mismatched result's Conflict = %v, want the amount mismatch", res[4].Conflict)
		}
		if res[1].Claim.StripeID != "ch_paid" {
			t.Errorf("succeeded result has StripeID %q", res[1].Claim.StripeID)
		}
		if res, err := s.ClaimBatch(ctx, nil); res != nil || err != nil {
			t.Errorf("empty batch = %v, %v", res, err)
		}
	})
}

func TestClaimNotFound(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		for name, err := range map[string]error{
			"Renew":   s.Renew(ctx, "nope", "a"),
			"Release": s.Release(ctx, "nope", "a", "", "x"),
			"Succeed": s.Succeed(ctx, "nope", "ch_1"),
			"Fail":    s.Fail(ctx, "nope", "", "x"),
		} {
			if !errors.Is(err, claim.ErrNotFound) {
				t.Errorf("%s of an unknown key = %v, want ErrNotFound", name, err)
			}
		}
		if _, err := s.Get(ctx, "nope"); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get of an unknown key = %v, want ErrNotFound", err)
		}
	})
}

func TestBadInputWritesNothing(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", 256) // one byte over the limit
	edit := func(f func(*claimengine.Request)) claimengine.Request {
		r := req("cus_1", "k1", "a")
		f(&r)
		return r
	}
	bad := []struct {
		name string
		req  claimengine.Request
		want string
	}{
		{"empty customer", edit(func(r *claimengine.Request) { r.Customer = "" }), "customer is empty"},
		{"long customer", edit(func(r *claimengine.Request) { r.Customer = long }), "customer is 256 bytes"},
		{"empty period", edit(func(r *claimengine.Request) { r.Period = "" }), "period is empty"},
		{"long period", edit(func(r *claimengine.Request) { r.Period = long }), "period is 256 bytes"},
		{"zero key", edit(func(r *claimengine.Request) { r.Key = "" }), "key is empty"},
		{"long key", edit(func(r *claimengine.Request) { r.Key = long }), "key is 256 bytes"},
		{"NUL in key", edit(func(r *claimengine.Request) { r.Key = "k\x001" }), "key must be valid UTF-8"},
		{"bad UTF-8 customer", edit(func(r *claimengine.Request) { r.Customer = "\xff" }), "customer must be valid UTF-8"},
		{"no owner", edit(func(r *claimengine.Request) { r.Owner = "" }), "owner is empty"},
		{"zero amount", edit(func(r *claimengine.Request) { r.Amount = 0 }), "amount 0 must be positive"},
		{"negative amount", edit(func(r *claimengine.Request) { r.Amount = -100 }), "amount -100 must be positive"},
		{"uppercase currency", edit(func(r *claimengine.Request) { r.Currency = "USD" }), `currency "USD"`},
		{"short currency", edit(func(r *claimengine.Request) { r.Currency = "us" }), `currency "us"`},
		{"long currency", edit(func(r *claimengine.Request) { r.Currency = "usdx" }), `currency "usdx"`},
		{"digits currency", edit(func(r *claimengine.Request) { r.Currency = "us1" }), `currency "us1"`},
	}
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		for _, tc := range bad {
			if _, err := s.Claim(ctx, tc.req); !errors.Is(err, claim.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("%s: Claim = %v, want ErrInvalid saying %q", tc.name, err, tc.want)
			}
			if _, err := s.ClaimBatch(ctx, []claimengine.Request{req("cus_ok", "k_ok", "a"), tc.req}); !errors.Is(err, claim.ErrInvalid) || !strings.Contains(err.Error(), "request 1") {
				t.Errorf("%s: ClaimBatch = %v, want ErrInvalid naming request 1", tc.name, err)
			}
		}
		dupKey, dupPeriod := req("cus_2", "k1", "a"), req("cus_1", "k2", "a")
		for name, batch := range map[string][]claimengine.Request{
			"duplicate key":    {req("cus_1", "k1", "a"), dupKey},
			"duplicate period": {req("cus_1", "k1", "a"), dupPeriod},
		} {
			if _, err := s.ClaimBatch(ctx, batch); !errors.Is(err, claim.ErrInvalid) || !strings.Contains(err.Error(), "requests 0 and 1") {
				t.Errorf("%s: ClaimBatch = %v, want ErrInvalid naming requests 0 and 1", name, err)
			}
		}
		for name, err := range map[string]error{
			"Renew without key":     s.Renew(ctx, "", "a"),
			"Renew without owner":   s.Renew(ctx, "k1", ""),
			"Release without owner": s.Release(ctx, "k1", "", "", "x"),
			"Release with NUL":      s.Release(ctx, "k1", "a", "", "\x00"),
			"Succeed without id":    s.Succeed(ctx, "k1", ""),
			"Succeed with long id":  s.Succeed(ctx, "k1", long),
			"Fail without key":      s.Fail(ctx, "", "", "x"),
			"Fail with bad UTF-8":   s.Fail(ctx, "k1", "", "\xff"),
			"Get without key":       func() error { _, err := s.Get(ctx, ""); return err }(),
			"CheckSend, no window":  s.CheckSend(ctx, "k1", "a", 0),
			"Reopen, no endpoint":   s.Reopen(ctx, "k1", "a", "", "fp"),
		} {
			if !errors.Is(err, claim.ErrInvalid) {
				t.Errorf("%s = %v, want ErrInvalid", name, err)
			}
		}
		for _, k := range []string{"k1", "k2", "k_ok"} {
			if c, err := s.Get(ctx, k); !errors.Is(err, claim.ErrNotFound) {
				t.Errorf("after bad input Get(%s) = %+v, %v; want nothing written", k, c, err)
			}
		}
	})
}

// 64 runners claim the same customer and period at once: exactly one wins.
func TestConcurrentClaimsOneWinner(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		counts := race(t, 64, func(i int) (result, error) {
			return h.store.Claim(context.Background(), req("cus_1", "k1", fmt.Sprintf("runner-%d", i)))
		})
		if counts[claimengine.Won] != 1 || counts[claimengine.InProgress] != 63 {
			t.Errorf("outcomes = %v, want 1 Won and 63 InProgress", counts)
		}
		if c, err := h.store.Get(context.Background(), "k1"); err != nil || c.Leases != 1 {
			t.Errorf("claim = %+v, %v; want 1 attempt", c, err)
		}
	})
}

// 64 runners find the same crashed claim at once: exactly one resumes it.
func TestConcurrentTakeoverOneWinner(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		mustClaim(t, h.store, req("cus_1", "k1", "crashed"), claimengine.Won)
		h.pass(t, lease+time.Second)
		counts := race(t, 64, func(i int) (result, error) {
			return h.store.Claim(context.Background(), req("cus_1", "k1", fmt.Sprintf("runner-%d", i)))
		})
		if counts[claimengine.Resumed] != 1 || counts[claimengine.InProgress] != 63 {
			t.Errorf("outcomes = %v, want 1 Resumed and 63 InProgress", counts)
		}
		if c, err := h.store.Get(context.Background(), "k1"); err != nil || c.Leases != 2 {
			t.Errorf("claim = %+v, %v; want 2 attempts", c, err)
		}
	})
}

// Runners racing with different keys for one customer and period: at most
// one live claim, everyone else gets an error.
func TestConcurrentDifferentKeysOneWinner(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		var errs int
		var mu sync.Mutex
		counts := race(t, 16, func(i int) (result, error) {
			r, err := h.store.Claim(context.Background(), req("cus_1", fmt.Sprintf("k%d", i), "a"))
			if err != nil {
				mu.Lock()
				errs++
				mu.Unlock()
				return result{Outcome: claimengine.Mismatch}, nil
			}
			return r, nil
		})
		if counts[claimengine.Won] != 1 || errs != 15 {
			t.Errorf("outcomes = %v with %d errors, want 1 Won and 15 errors", counts, errs)
		}
		var live int
		for i := range 16 {
			if _, err := h.store.Get(context.Background(), fmt.Sprintf("k%d", i)); err == nil {
				live++
			}
		}
		if live != 1 {
			t.Errorf("%d claims written, want exactly one", live)
		}
	})
}

// race runs f(0..n-1) concurrently, released together, and counts outcomes.
func race(t *testing.T, n int, f func(i int) (result, error)) map[claimengine.Outcome]int {
	t.Helper()
	var wg sync.WaitGroup
	var mu sync.Mutex
	start := make(chan struct{})
	counts := map[claimengine.Outcome]int{}
	for i := range n {
		wg.Go(func() {
			<-start
			r, err := f(i)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				t.Errorf("runner %d: %v", i, err)
				return
			}
			counts[r.Outcome]++
		})
	}
	close(start)
	wg.Wait()
	return counts
}

// One live claim per customer and period, whatever the scope: a Biller
// whose scope was renamed while claims were live cannot bill their
// customers again. Products that bill the same customers for the same
// periods use a claim table each.
func TestLiveClaimAcrossScopes(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		a, b := req("cus_1", "ka", "x"), req("cus_1", "kb", "x")
		a.Scope, b.Scope = "subscription", "renamed"
		mustClaim(t, h.store, a, claimengine.Won)
		var mm *claim.MismatchError
		if _, err := h.store.Claim(context.Background(), b); !errors.As(err, &mm) || mm.Field != "key" {
			t.Errorf("a live claim under another scope = %v, want *MismatchError on key", err)
		}
	})
}

// Abandon deletes a pending claim its owner never sent; only the owner can,
// and only while pending. The next Claim starts afresh.
func TestAbandon(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		mustClaim(t, h.store, req("cus_1", "k1", "a"), claimengine.Won)
		if err := h.store.Abandon(ctx, "k1", "b"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Abandon by another owner = %v, want ErrLeaseLost", err)
		}
		if err := h.store.Abandon(ctx, "k1", "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := h.store.Get(ctx, "k1"); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get after Abandon = %v, want ErrNotFound", err)
		}
		r := req("cus_1", "k1", "b")
		r.Credential = "fp2"
		if got := mustClaim(t, h.store, r, claimengine.Won).Claim; got.Credential != "fp2" {
			t.Errorf("claim after Abandon = %+v", got)
		}
		if err := h.store.Succeed(ctx, "k1", "ch_1"); err != nil {
			t.Fatal(err)
		}
		if err := h.store.Abandon(ctx, "k1", "b"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Abandon of a succeeded claim = %v, want ErrLeaseLost", err)
		}
	})
}

// A claim made in steps records each step and the object they build on,
// starts its next key's window with each step, keeps its object, and is
// never abandoned once a step is done at Stripe. A usage report's claim
// has no currency.
func TestAdvanceRecordsSteps(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		r := req("cus_1", "inv", "a")
		mustClaim(t, s, r, claimengine.Won)
		if err := s.Advance(ctx, "inv", "b", "in_1", "draft"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Advance by another owner: %v, want ErrLeaseLost", err)
		}
		if err := s.Advance(ctx, "inv", "a", "in_1", "draft"); err != nil {
			t.Fatal(err)
		}
		c, err := s.Get(ctx, "inv")
		if err != nil {
			t.Fatal(err)
		}
		if c.Step != "draft" || c.StripeID != "in_1" || c.State != claim.StatePending {
			t.Fatalf("after Advance: %+v", c)
		}
		if err := s.Advance(ctx, "inv", "a", "in_2", "line 0"); !errors.Is(err, claimengine.ErrConflict) {
			t.Errorf("Advance with another object: %v, want ErrConflict", err)
		}
		if err := s.Abandon(ctx, "inv", "a"); err == nil {
			t.Error("Abandon of a claim with a step done at Stripe succeeded")
		}
		if err := s.Advance(ctx, "inv", "a", "in_1", "line 0"); err != nil {
			t.Fatal(err)
		}
		if err := s.Succeed(ctx, "inv", "in_1"); err != nil {
			t.Fatal(err)
		}
		if c, _ := s.Get(ctx, "inv"); c.Step != "line 0" || c.State != claim.StateSucceeded {
			t.Errorf("after Succeed: %+v", c)
		}
		if err := s.Advance(ctx, "inv", "a", "in_1", "paid"); !errors.Is(err, claimengine.ErrLeaseLost) {
			t.Errorf("Advance of a succeeded claim: %v, want ErrLeaseLost", err)
		}

		u := claimengine.Request{Customer: "cus_1", Period: "meter:api_calls:2026-11-30T10:00Z", Key: "use", Amount: 17, Owner: "a"}
		if got := mustClaim(t, s, u, claimengine.Won).Claim; got.Currency != "" || got.Amount != 17 {
			t.Errorf("usage claim = %+v", got)
		}
	})
}
