package claim_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// One batch that mixes every answer a claim can get (won, resumed, in
// progress, succeeded, failed, a mismatch of every field, an overlapping
// window, another scope, a later attempt, a refund past its payment, a
// second refund of a payment past what the first left, a refund of no
// claim) answers each request exactly as it would be answered alone, in
// Postgres and Memory alike: what the statement inserts or takes over
// never hides, nor is hidden by, the rows that refuse the others. Claiming
// the same batch again answers every request that won or resumed with the
// claim it now holds, and nothing else changes.
func TestClaimBatchOfEveryOutcomeAnswersEachRequestAsAlone(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) { claimBatchOfEveryOutcome(t, h, claimengine.Fence{}) })
	for _, isolation := range []string{"repeatable read", "serializable"} {
		t.Run(isolation, func(t *testing.T) {
			t.Parallel()
			s, pool := isolatedStore(t, isolation)
			claimBatchOfEveryOutcome(t, harness{store: s, pass: pgPass(pool)}, claimengine.Fence{})
		})
	}
	t.Run("fenced", func(t *testing.T) {
		t.Parallel()
		s, pool := newPostgres(t, claim.Config{Lease: lease})
		_, fence := newLeaseHolder(t, pool)
		claimBatchOfEveryOutcome(t, harness{store: s, pass: pgPass(pool)}, fence)
	})
}

// claimBatchOfEveryOutcome claims the batch of every outcome in h, its
// requests under fence.
func claimBatchOfEveryOutcome(t *testing.T, h harness, fence claimengine.Fence) {
	ctx := context.Background()
	s := h.store
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	won := func(r claimengine.Request) { t.Helper(); mustClaim(t, s, r, claimengine.Won) }
	with := func(r claimengine.Request, f func(*claimengine.Request)) claimengine.Request { f(&r); return r }

	// The table before the batch.
	won(req("c-stale", "k-stale", "other"))
	won(req("c-busy", "k-busy", "other"))
	won(req("c-paid", "k-paid", "other"))
	won(req("c-declined", "k-declined", "other"))
	won(req("c-amount", "k-amount", "other"))
	won(req("c-currency", "k-currency", "other"))
	won(req("c-customer", "k-customer", "other"))
	won(req("c-period", "k-period", "other"))
	won(with(req("c-account", "k-account", "other"), func(r *claimengine.Request) { r.Account = "acct_1" }))
	won(req("c-livekey", "k-livekey", "other"))
	won(usageReq("c-usage", "k-usage-0-60", 0, 60))
	won(scoped("c-scope", "c-scope#1@old", "old", 1))
	won(scoped("c-later", "c-later#2@s", "s", 2))
	won(with(req("c-pay", "k-pay", "payer"), func(r *claimengine.Request) { r.Amount = 1000 }))
	won(with(req("c-pay2", "k-pay2", "payer"), func(r *claimengine.Request) { r.Amount = 300 }))
	must(errors.Join(s.Succeed(ctx, "k-paid", "ch_paid"), s.Fail(ctx, "k-declined", "", "card_declined"),
		s.Fail(ctx, "c-scope#1@old", "pi_s", "card_declined"), s.Fail(ctx, "c-later#2@s", "pi_l", "card_declined"),
		s.Succeed(ctx, "k-pay", "ch_pay"), s.Succeed(ctx, "k-pay2", "ch_pay2")))
	h.pass(t, lease+time.Second)
	mustClaim(t, s, req("c-busy", "k-busy", "other"), claimengine.Resumed) // held again by its owner

	refund := func(of, id string, amount int64) claimengine.Request {
		r := refundReq(of, id, amount)
		r.Customer = "c-refund-" + id
		return r
	}
	type want struct {
		outcome           claimengine.Outcome
		key               string // of the claim answered
		field, have, want string // of a *MismatchError
		invalid           bool   // a refusal wrapping ErrInvalid instead
	}
	cases := []struct {
		req  claimengine.Request
		want want
	}{
		{req("c-fresh", "k-fresh", "me"), want{outcome: claimengine.Won, key: "k-fresh"}},
		{req("c-stale", "k-stale", "me"), want{outcome: claimengine.Resumed, key: "k-stale"}},
		{req("c-busy", "k-busy", "me"), want{outcome: claimengine.InProgress, key: "k-busy"}},
		{req("c-paid", "k-paid", "me"), want{outcome: claimengine.Succeeded, key: "k-paid"}},
		{req("c-declined", "k-declined", "me"), want{outcome: claimengine.Failed, key: "k-declined"}},
		{with(req("c-amount", "k-amount", "me"), func(r *claimengine.Request) { r.Amount = 1 }),
			want{claimengine.Mismatch, "k-amount", "amount", "4200", "1", false}},
		{with(req("c-currency", "k-currency", "me"), func(r *claimengine.Request) { r.Currency = "eur" }),
			want{claimengine.Mismatch, "k-currency", "currency", "usd", "eur", false}},
		{req("c-customer-2", "k-customer", "me"),
			want{claimengine.Mismatch, "k-customer", "customer", "c-customer", "c-customer-2", false}},
		{with(req("c-period", "k-period", "me"), func(r *claimengine.Request) { r.Period = "2025-02" }),
			want{claimengine.Mismatch, "k-period", "period", "2025-01", "2025-02", false}},
		{req("c-account", "k-account", "me"),
			want{claimengine.Mismatch, "k-account", "account", "acct_1", "", false}},
		{req("c-livekey", "k-livekey-2", "me"),
			want{claimengine.Mismatch, "k-livekey", "key", "k-livekey", "k-livekey-2", false}},
		{with(usageReq("c-usage", "k-usage-30-90", 30, 90), func(r *claimengine.Request) { r.Owner = "me" }),
			want{outcome: claimengine.Mismatch, key: "k-usage-0-60", field: "window"}},
		{with(usageReq("c-usage-2", "k-usage2-60-120", 60, 120), func(r *claimengine.Request) { r.Owner = "me" }),
			want{outcome: claimengine.Won, key: "k-usage2-60-120"}},
		{scoped("c-scope", "c-scope#1@new", "new", 1), want{claimengine.Mismatch, "c-scope#1@old", "scope", "old", "new", false}},
		{scoped("c-later", "c-later#1@s", "s", 1), want{outcome: claimengine.Failed, key: "c-later#2@s"}},
		{refund("k-pay", "a", 600), want{outcome: claimengine.Won, key: "k-pay/refund/a"}},
		{refund("k-pay", "b", 600), want{claimengine.Mismatch, "k-pay", "refund", "400", "600", false}},
		{refund("k-pay2", "c", 301), want{claimengine.Mismatch, "k-pay2", "refund", "300", "301", false}},
		{refund("k-none", "d", 1), want{outcome: claimengine.Mismatch, invalid: true}},
	}
	reqs := make([]claimengine.Request, len(cases))
	for i, c := range cases {
		reqs[i] = c.req
		reqs[i].Fence = fence
	}
	check := func(round string, res []result, err error, again bool) {
		t.Helper()
		if len(res) != len(reqs) {
			t.Fatalf("%s: ClaimBatch returned %d results for %d requests (%v)", round, len(res), len(reqs), err)
		}
		for i, c := range cases {
			w, r := c.want, res[i]
			if again && (w.outcome == claimengine.Won || w.outcome == claimengine.Resumed) {
				w.outcome = claimengine.Resumed // its own claim, held by the same owner
			}
			if r.Outcome != w.outcome {
				t.Errorf("%s: %s = %v (claim %s, %v), want %v", round, c.req.Key, r.Outcome, r.Claim.Key, r.Conflict, w.outcome)
				continue
			}
			if w.invalid {
				if !errors.Is(r.Conflict, claim.ErrInvalid) || !errors.Is(err, claim.ErrInvalid) {
					t.Errorf("%s: %s: Conflict %v, batch error %v; want ErrInvalid in both", round, c.req.Key, r.Conflict, err)
				}
				continue
			}
			if r.Claim.Key != w.key {
				t.Errorf("%s: %s answered with claim %q, want %q", round, c.req.Key, r.Claim.Key, w.key)
			}
			var m *claim.MismatchError
			switch {
			case w.field == "" && r.Conflict != nil:
				t.Errorf("%s: %s: Conflict %v, want none", round, c.req.Key, r.Conflict)
			case w.field != "" && (!errors.As(r.Conflict, &m) || m.Field != w.field || m.Existing.Key != w.key):
				t.Errorf("%s: %s: Conflict %v, want a mismatch on %s with %s", round, c.req.Key, r.Conflict, w.field, w.key)
			case w.field != "" && w.field != "window" && (m.Have != w.have || m.Want != w.want):
				t.Errorf("%s: %s: mismatch on %s has %q want %q; want %q and %q", round, c.req.Key, w.field, m.Have, m.Want, w.have, w.want)
			case w.field != "" && !errors.As(err, &m):
				t.Errorf("%s: %s: batch error %v does not carry its mismatch", round, c.req.Key, err)
			}
		}
	}
	res, err := s.ClaimBatch(ctx, reqs)
	check("first batch", res, err, false)
	res, err = s.ClaimBatch(ctx, reqs)
	check("same batch again", res, err, true)

	// Nothing refused was written.
	for _, key := range []string{"k-livekey-2", "k-usage-30-90", "c-scope#1@new", "c-later#1@s", "k-pay/refund/b", "k-pay2/refund/c", "k-none/refund/d"} {
		if _, err := s.Get(ctx, key); !errors.Is(err, claim.ErrNotFound) {
			t.Errorf("Get(%s) = %v, want ErrNotFound: a refused request wrote a claim", key, err)
		}
	}
}
