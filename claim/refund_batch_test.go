package claim_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// Two refunds of one payment in one batch, each within what is left but
// together more: the second is refused as if it came after the first,
// and never claimed.
func TestRefundsOfAPaymentInOneBatchNeverAddUpToMoreThanIt(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		paid(t, h.store, "pay", 1000)
		res, err := h.store.ClaimBatch(ctx, []claimengine.Request{refundReq("pay", "a", 600), refundReq("pay", "b", 600)})
		if len(res) != 2 || res[0].Outcome != claimengine.Won {
			t.Fatalf("batch of two refunds of 600 of a payment of 1000: %+v, %v; want the first won", res, err)
		}
		refused(t, res[1].Conflict, "400")
		if _, err := h.store.Get(ctx, "pay/refund/b"); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("refused refund's claim: %v, want ErrNotFound", err)
		}
	})
}
