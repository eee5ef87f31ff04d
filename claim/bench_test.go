package claim_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/billonce/billonce/claim"
)

// BenchmarkClaim measures one winning claim: one round trip to a local
// database.
func BenchmarkClaim(b *testing.B) {
	ctx := context.Background()
	s, _ := newPostgres(b, claim.Config{})
	i := 0
	for b.Loop() {
		i++
		r := claim.Request{Customer: fmt.Sprintf("cus_%d", i), Period: "2025-01", Key: fmt.Sprintf("key_%d", i), Amount: 4200, Currency: "usd", Owner: "bench"}
		if res, err := s.Claim(ctx, r); err != nil || res.Outcome != claim.Won {
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
				reqs := make([]claim.Request, size)
				for i := range reqs {
					reqs[i] = claim.Request{Customer: fmt.Sprintf("cus_%d", i), Period: fmt.Sprintf("run-%d", run),
						Key: fmt.Sprintf("key_%d_%d", run, i), Amount: 4200, Currency: "usd", Owner: "bench"}
				}
				res, err := s.ClaimBatch(ctx, reqs)
				if err != nil || len(res) != size || res[size-1].Outcome != claim.Won {
					b.Fatalf("ClaimBatch: %d results, %v", len(res), err)
				}
			}
			b.ReportMetric(float64(run*size)/b.Elapsed().Seconds(), "claims/s")
		})
	}
}
