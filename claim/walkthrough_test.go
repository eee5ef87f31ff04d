package claim_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// A billing run claims each customer before it charges, records the
// outcome, and a second run (or a second replica) charges nobody twice.
func TestEngineWalkthrough(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var out strings.Builder
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		t.Fatal(err)
	}
	defer stop()

	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}

	req := claimengine.Request{Customer: "cus_42", Period: "2025-01", Key: "bill-cus_42-2025-01-1",
		Amount: 4200, Currency: "usd", Owner: "pod-a/run-1"}
	res, _ := engineOf(store).Claim(ctx, req)
	fmt.Fprintln(&out, "pod a:", res.Outcome, res.Claim.State, "attempt", res.Claim.Leases)

	other := req
	other.Owner = "pod-b/run-1"
	res, _ = engineOf(store).Claim(ctx, other)
	fmt.Fprintln(&out, "pod b:", res.Outcome, "held by", res.Claim.Owner)

	// Pod a sends the charge with req.Key, then records the answer.
	_ = engineOf(store).Succeed(ctx, req.Key, "ch_123")
	res, _ = engineOf(store).Claim(ctx, other)
	fmt.Fprintln(&out, "pod b:", res.Outcome, res.Claim.StripeID)

	// A different amount under the same key is refused, not charged.
	other.Amount = 9900
	_, err = engineOf(store).Claim(ctx, other)
	var mm *claim.MismatchError
	if errors.As(err, &mm) {
		fmt.Fprintln(&out, "pod b: mismatch on", mm.Field, mm.Have, "!=", mm.Want)
	}

	// A declined charge is terminal for its key; billing again takes a new one.
	decl := claimengine.Request{Customer: "cus_7", Period: "2025-01", Key: "bill-cus_7-2025-01-1",
		Amount: 1500, Currency: "usd", Owner: "pod-a/run-1"}
	_, _ = engineOf(store).Claim(ctx, decl)
	_ = engineOf(store).Fail(ctx, decl.Key, "", "card_declined")
	res, _ = engineOf(store).Claim(ctx, decl)
	fmt.Fprintln(&out, "cus_7:", res.Outcome, res.Claim.LastError)
	decl.Key = "bill-cus_7-2025-01-2"
	res, _ = engineOf(store).Claim(ctx, decl)
	fmt.Fprintln(&out, "cus_7 attempt 2:", res.Outcome)
	const want = `pod a: Won pending attempt 1
pod b: InProgress held by pod-a/run-1
pod b: Succeeded ch_123
pod b: mismatch on amount 4200 != 9900
cus_7: Failed card_declined
cus_7 attempt 2: Won
`
	if out.String() != want {
		t.Errorf("got:\n%s\nwant:\n%s", out.String(), want)
	}
}
