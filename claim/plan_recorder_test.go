package claim_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// A round of the recorder (CheckSendSucceed: checks before sending, and
// successes) reads the rows it names, through indexes, however many
// pending claims a killed run left since the connection cached the
// statements' generic plans on a small table.
func TestCheckSendReadsNoMoreWhenPendingClaimsPileUp(t *testing.T) {
	recorderReadsNoMore(t, "checks before sending")
}

func TestSucceedBatchReadsNoMoreWhenPendingClaimsPileUp(t *testing.T) {
	recorderReadsNoMore(t, "successes")
}

func recorderReadsNoMore(t *testing.T, subject string) {
	for _, first := range []int{0, 300} {
		t.Run(fmt.Sprintf("planned on %d claims", first), func(t *testing.T) { checkSendSucceedReadsNoMore(t, first, subject) })
	}
}

func checkSendSucceedReadsNoMore(t *testing.T, first int, subject string) {
	ctx := context.Background()
	pool, p := genericPlanStore(t)
	s := pgStore{p, engineOf(p)}
	const size = 100
	const window = 23 * time.Hour
	round := func(n int) {
		t.Helper()
		reqs := make([]claimengine.Request, size)
		for i := range reqs {
			reqs[i] = req(fmt.Sprintf("cus_r%d_%d", n, i), fmt.Sprintf("key_r%d_%d", n, i), "runner")
		}
		res, err := s.engine.ClaimBatch(ctx, reqs)
		if err != nil || len(res) != size {
			t.Fatalf("round %d: %d results, %v", n, len(res), err)
		}
		checks := make([]claimengine.SendCheck, size)
		done := make([]claimengine.Success, size)
		for i := range reqs {
			checks[i] = claimengine.SendCheck{Key: reqs[i].Key, Owner: "runner"}
			done[i] = claimengine.Success{Key: reqs[i].Key, StripeID: fmt.Sprintf("ch_r%d_%d", n, i)}
		}
		checkErrs, _ := s.CheckSendSucceed(ctx, window, checks, nil)
		for i, err := range checkErrs {
			if err != nil {
				t.Fatalf("round %d, check %d: %v", n, i, err)
			}
		}
		_, doneErrs := s.CheckSendSucceed(ctx, window, nil, done)
		for i, err := range doneErrs {
			if err != nil {
				t.Fatalf("round %d, success %d: %v", n, i, err)
			}
		}
	}
	// The plan is made on a small table, empty or of a few hundred claims.
	if _, err := pool.Exec(ctx, `INSERT INTO `+claim.DefaultTable+` (key, customer, period, amount, currency, state, stripe_id)
		SELECT 'first_' || g, 'cus_first_' || g, '2024-12', 4200, 'usd', 'succeeded', 'ch_first_' || g
		FROM generate_series(1, $1::int) g`, first); err != nil {
		t.Fatal(err)
	}
	for n := range 6 {
		round(n)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO `+claim.DefaultTable+` (key, customer, period, amount, currency, state, owner, lease_until)
		SELECT 'old_' || g, 'cus_old_' || g, '2025-01', 4200, 'usd', 'pending', 'killed', now() - interval '30 minutes'
		FROM generate_series(1, 30000) g`); err != nil {
		t.Fatal(err)
	}
	read := func() int64 { return rowsRead(t, pool) }
	// The claims of the round, measured apart from its checks and successes.
	reqs := make([]claimengine.Request, size)
	for i := range reqs {
		reqs[i] = req(fmt.Sprintf("cus_m_%d", i), fmt.Sprintf("key_m_%d", i), "runner")
	}
	before := read()
	if _, err := s.engine.ClaimBatch(ctx, reqs); err != nil {
		t.Fatal(err)
	}
	claimed := read() - before
	checks := make([]claimengine.SendCheck, size)
	done := make([]claimengine.Success, size)
	for i := range reqs {
		checks[i] = claimengine.SendCheck{Key: reqs[i].Key, Owner: "runner"}
		done[i] = claimengine.Success{Key: reqs[i].Key, StripeID: fmt.Sprintf("ch_m_%d", i)}
	}
	before = read()
	checkErrs, _ := s.CheckSendSucceed(ctx, window, checks, nil)
	checked := read() - before
	before = read()
	_, doneErrs := s.CheckSendSucceed(ctx, window, nil, done)
	succeeded := read() - before
	for i := range size {
		if checkErrs[i] != nil || doneErrs[i] != nil {
			t.Fatalf("request %d: check %v, success %v", i, checkErrs[i], doneErrs[i])
		}
	}
	t.Logf("of a table of 30,000 pending claims, a batch of %d: claims read %d rows, checks %d, successes %d", size, claimed, checked, succeeded)
	for _, m := range []struct {
		what string
		n    int64
	}{{"claims", claimed}, {"checks before sending", checked}, {"successes", succeeded}} {
		if m.what == subject && m.n > 20*size {
			t.Errorf("%d %s read %d rows of a table of 30,000 pending claims: want a few per claim, through indexes", size, m.what, m.n)
		}
	}
}
