package claim_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/lock"
)

// BenchmarkClaim measures one winning claim: one round trip to a local
// database.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	s, _ := newPostgres(b, claim.Config{})
	i := 0
	for b.Loop() {
		i++
		r := claimengine.Request{Customer: fmt.Sprintf("cus_%d", i), Period: "2025-01", Key: fmt.Sprintf("key_%d", i), Amount: 4200, Currency: "usd", Owner: "bench"}
		if res, err := s.Claim(ctx, r); err != nil || res.Outcome != claimengine.Won {
			b.Fatalf("Claim = %v, %v", res.Outcome, err)
		}
	}
	b.ReportMetric(float64(i)/b.Elapsed().Seconds(), "claims/s")
}

// BenchmarkClaimBatch measures batches of winning claims for one period.
func BenchmarkClaimBatch(b *testing.B) {
	for _, size := range []int{1000, 10000} {
		b.Run(fmt.Sprint(size), func(b *testing.B) {
			ctx := context.Background()
			s, _ := newPostgres(b, claim.Config{})
			run := 0
			for b.Loop() {
				run++
				reqs := make([]claimengine.Request, size)
				for i := range reqs {
					reqs[i] = claimengine.Request{Customer: fmt.Sprintf("cus_%d", i), Period: fmt.Sprintf("run-%d", run),
						Key: fmt.Sprintf("key_%d_%d", run, i), Amount: 4200, Currency: "usd", Owner: "bench"}
				}
				res, err := s.ClaimBatch(ctx, reqs)
				if err != nil || len(res) != size || res[size-1].Outcome != claimengine.Won {
					b.Fatalf("ClaimBatch: %d results, %v", len(res), err)
				}
			}
			b.ReportMetric(float64(run*size)/b.Elapsed().Seconds(), "claims/s")
		})
	}
}

// BenchmarkClaimFence measures the claims of a run with and without the
// check of a lease's fencing token in the claim statement: one claim, and
// a batch of billing's default size, each winning. Each iteration makes
// one unfenced and one fenced claim statement on the same table, so that
// both meet the same load; it reports the time of each and their ratio.
//
//	go test ./claim -run '^$' -bench ClaimFence -count 5
func BenchmarkClaimFence(b *testing.B) {
	for _, size := range []int{1, 100} {
		b.Run(fmt.Sprintf("batch=%d", size), func(b *testing.B) {
			ctx := context.Background()
			s, pool := newPostgres(b, claim.Config{})
			l, err := lock.NewLease(pool, lock.LeaseConfig{TTL: time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			if err := l.Migrate(ctx); err != nil {
				b.Fatal(err)
			}
			h, err := l.Lock(ctx, "run")
			if err != nil {
				b.Fatal(err)
			}
			defer h.Unlock(ctx)
			fence := claimengine.Fence{Table: l.Table(), Token: h.(lock.Fenced).Token()}
			var took [2]time.Duration // unfenced, fenced
			run := 0
			for b.Loop() {
				for k, f := range []claimengine.Fence{{}, fence} {
					run++
					reqs := make([]claimengine.Request, size)
					for i := range reqs {
						reqs[i] = claimengine.Request{Customer: fmt.Sprintf("cus_%d", i), Period: fmt.Sprintf("run-%d", run),
							Key: fmt.Sprintf("key_%d_%d", run, i), Amount: 4200, Currency: "usd", Owner: "bench", Fence: f}
					}
					start := time.Now()
					res, err := s.ClaimBatch(ctx, reqs)
					took[k] += time.Since(start)
					if err != nil || len(res) != size || res[size-1].Outcome != claimengine.Won {
						b.Fatalf("ClaimBatch: %d results, %v", len(res), err)
					}
				}
			}
			n := float64(b.N)
			b.ReportMetric(float64(took[0].Microseconds())/n, "unfenced-µs/stmt")
			b.ReportMetric(float64(took[1].Microseconds())/n, "fenced-µs/stmt")
			b.ReportMetric(took[1].Seconds()/took[0].Seconds(), "fenced/unfenced")
		})
	}
}

// BenchmarkClaimBatchUsage measures batches of winning usage claims, each
// checked against the live windows of its customer and meter: a customer's
// windows of the runs before, one hour each, end to end.
func BenchmarkClaimBatchUsage(b *testing.B) {
	const size = 1000
	ctx := context.Background()
	s, _ := newPostgres(b, claim.Config{})
	base := time.Date(2026, 9, 1, 0, 0, 0, 0, time.UTC)
	run := 0
	for b.Loop() {
		run++
		start := base.Add(time.Duration(run) * time.Hour)
		reqs := make([]claimengine.Request, size)
		for i := range reqs {
			reqs[i] = claimengine.Request{Customer: fmt.Sprintf("cus_%d", i), Period: fmt.Sprintf("usage api_calls run-%d", run),
				Key: fmt.Sprintf("key_%d_%d", run, i), Amount: 42, Owner: "bench", Endpoint: "meter_events",
				Meter: "api_calls", WindowStart: start, WindowEnd: start.Add(time.Hour)}
		}
		res, err := s.ClaimBatch(ctx, reqs)
		if err != nil || len(res) != size || res[size-1].Outcome != claimengine.Won {
			b.Fatalf("ClaimBatch: %d results, %v", len(res), err)
		}
	}
	b.ReportMetric(float64(run*size)/b.Elapsed().Seconds(), "claims/s")
}

// BenchmarkPruneEvents prunes 200,000 old event records from a table
// that also holds 100,000 recent ones, while another goroutine applies
// new events to a claim, and reports how long those Applies waited at
// worst, and at worst during a second without pruning: pruning works a
// batch at a time, so they never wait for it all.
//
//	go test ./claim -run '^$' -bench PruneEvents -benchtime 1x
func BenchmarkPruneEvents(b *testing.B) {
	ctx := context.Background()
	s, pool := newPostgres(b, claim.Config{})
	if _, err := s.Claim(ctx, claimengine.Request{Customer: "cus_1", Period: "2025-01", Key: "k1", Amount: 4200, Currency: "usd", Owner: "bench"}); err != nil {
		b.Fatal(err)
	}
	const old, recent = 200_000, 100_000
	var worst, total time.Duration
	var applies int
	// The same Applies for a second without pruning: the baseline.
	var quiet time.Duration
	for n, end := 0, time.Now().Add(time.Second); time.Now().Before(end); n++ {
		start := time.Now()
		u := claimengine.Update{EventID: fmt.Sprintf("evt_quiet_%d", n), EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: int64(n), Created: time.Now()}
		if _, err := s.Apply(ctx, u); err != nil {
			b.Fatal(err)
		}
		quiet = max(quiet, time.Since(start))
	}
	pool.Exec(ctx, "TRUNCATE billonce_claims_events")
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		_, err := pool.Exec(ctx, `INSERT INTO billonce_claims_events (id, type, key, stripe_id, created, result, received_at)
			SELECT 'evt_'||$1::int||'_'||g, 'charge.succeeded', 'k1', 'py_1', now(), 'Unchanged: nothing new',
				CASE WHEN g <= $2 THEN now() - interval '100 days' ELSE now() END
			FROM generate_series(1, $3::int) g`, i, old, old+recent)
		if err != nil {
			b.Fatal(err)
		}
		pool.Exec(ctx, "ANALYZE billonce_claims_events")
		b.StartTimer()
		done := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-done:
					return
				default:
				}
				start := time.Now()
				u := claimengine.Update{EventID: fmt.Sprintf("evt_new_%d_%d", i, n), EventType: "charge.refunded", Key: "k1", StripeID: "py_1", Refunded: int64(n), Created: time.Now()}
				if _, err := s.Apply(ctx, u); err != nil {
					b.Error(err)
					return
				}
				d := time.Since(start)
				worst, total, applies = max(worst, d), total+d, applies+1
			}
		}()
		n, err := s.PruneEvents(ctx, 90*24*time.Hour)
		close(done)
		wg.Wait()
		if err != nil || n != old {
			b.Fatalf("PruneEvents = %d, %v; want %d", n, err, old)
		}
		b.StopTimer()
		pool.Exec(ctx, "TRUNCATE billonce_claims_events")
		b.StartTimer()
	}
	b.ReportMetric(float64(old*b.N)/b.Elapsed().Seconds(), "records/s")
	b.ReportMetric(float64(worst.Microseconds())/1000, "worst-apply-ms")
	b.ReportMetric(float64(quiet.Microseconds())/1000, "worst-apply-ms-without-prune")
	b.ReportMetric(float64(total.Microseconds())/1000/float64(max(applies, 1)), "mean-apply-ms")
}

// BenchmarkSucceedBatch measures a recorder round of successes of
// billing's batch size, timing only CheckSendSucceed.
func BenchmarkSucceedBatch(b *testing.B) {
	const size = 100
	ctx := context.Background()
	s, _ := newPostgres(b, claim.Config{})
	run := 0
	for b.Loop() {
		b.StopTimer()
		run++
		reqs := make([]claimengine.Request, size)
		done := make([]claimengine.Success, size)
		for i := range reqs {
			reqs[i] = claimengine.Request{Customer: fmt.Sprintf("cus_%d", i), Period: fmt.Sprintf("run-%d", run),
				Key: fmt.Sprintf("key_%d_%d", run, i), Amount: 4200, Currency: "usd", Owner: "bench"}
			done[i] = claimengine.Success{Key: reqs[i].Key, StripeID: fmt.Sprintf("ch_%d_%d", run, i)}
		}
		if _, err := s.ClaimBatch(ctx, reqs); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		_, errs := s.CheckSendSucceed(ctx, time.Hour, nil, done)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(run*size)/b.Elapsed().Seconds(), "successes/s")
}
