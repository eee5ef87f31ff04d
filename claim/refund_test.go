package claim_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// paid claims and succeeds payment claim key of amount for cus_1, 2025-01.
func paid(t *testing.T, s engine, key string, amount int64) {
	t.Helper()
	r := req("cus_1", key, "payer")
	r.Amount = amount
	mustClaim(t, s, r, claimengine.Won)
	if err := s.Succeed(context.Background(), key, "ch_"+key); err != nil {
		t.Fatal(err)
	}
}

// refundReq is a refund of amount of payment claim of, with its own id.
func refundReq(of, id string, amount int64) claimengine.Request {
	return claimengine.Request{Customer: "cus_1", Period: "2025-01 refund " + id, Key: of + "/refund/" + id,
		Amount: amount, Currency: "usd", Owner: "refunder-" + id, Endpoint: "refunds", RefundOf: of}
}

// refused checks that err is the refusal of a refund with left to refund.
func refused(t *testing.T, err error, left string) {
	t.Helper()
	var m *claim.MismatchError
	if !errors.As(err, &m) || m.Field != "refund" || m.Have != left {
		t.Fatalf("refund claim: err = %v, want a mismatch on refund with %s left", err, left)
	}
}

func TestRefundsOfAPaymentNeverAddUpToMoreThanIt(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		paid(t, h.store, "pay", 1000)
		mustClaim(t, h.store, refundReq("pay", "a", 600), claimengine.Won)
		_, err := h.store.Claim(ctx, refundReq("pay", "b", 600))
		refused(t, err, "400")
		if _, err := h.store.Get(ctx, "pay/refund/b"); !errors.Is(err, claim.ErrNotFound) {
			t.Fatalf("refused refund's claim: %v, want ErrNotFound", err)
		}
		// Two refunds of the same amount are two refunds.
		mustClaim(t, h.store, refundReq("pay", "c", 200), claimengine.Won)
		mustClaim(t, h.store, refundReq("pay", "d", 200), claimengine.Won)
		_, err = h.store.Claim(ctx, refundReq("pay", "e", 1))
		refused(t, err, "0")
		// The same refund again is its claim, not a new refund.
		mustClaim(t, h.store, refundReq("pay", "a", 600), claimengine.Resumed)
		// A failed refund gives its amount back.
		if err := h.store.Fail(ctx, "pay/refund/a", "re_a", "refund failed"); err != nil {
			t.Fatal(err)
		}
		mustClaim(t, h.store, refundReq("pay", "f", 600), claimengine.Won)
		c, err := h.store.Get(ctx, "pay/refund/f")
		if err != nil || c.RefundOf != "pay" {
			t.Fatalf("refund claim = %+v, %v; want RefundOf pay", c, err)
		}
	})
}

func TestRefundOfAPaymentNotSucceededOrInAnotherCurrencyIsRefused(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		mustClaim(t, h.store, req("cus_2", "pending", "payer"), claimengine.Won)
		_, err := h.store.Claim(ctx, refundReq("pending", "a", 100))
		var m *claim.MismatchError
		if !errors.As(err, &m) || m.Field != "refund" || m.Existing.State != claim.StatePending {
			t.Fatalf("refund of a pending payment: %v, want a mismatch on refund naming the pending claim", err)
		}
		paid(t, h.store, "pay", 1000)
		r := refundReq("pay", "eur", 100)
		r.Currency = "eur"
		_, err = h.store.Claim(ctx, r)
		refused(t, err, "1000")
		_, err = h.store.Claim(ctx, refundReq("nobody", "a", 100))
		if !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("refund of a payment without a claim: %v, want ErrInvalid", err)
		}
		r = refundReq("pay", "self", 100)
		r.Key = "pay"
		if _, err := h.store.Claim(ctx, r); !errors.Is(err, claim.ErrInvalid) {
			t.Fatalf("refund keyed as its payment: %v, want ErrInvalid", err)
		}
	})
}

// Refunds of one payment claimed at once, each from a session of its own:
// they never add up to more than the payment.
func TestConcurrentRefundsOfAPaymentNeverAddUpToMoreThanIt(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		paid(t, h.store, "pay", 1000)
		var mu sync.Mutex
		var refusals int
		counts := race(t, 24, func(i int) (result, error) {
			r, err := h.store.Claim(ctx, refundReq("pay", fmt.Sprint(i), 100))
			var m *claim.MismatchError
			if errors.As(err, &m) && m.Field == "refund" {
				mu.Lock()
				refusals++
				mu.Unlock()
				return result{Outcome: claimengine.Mismatch}, nil
			}
			return r, err
		})
		if counts[claimengine.Won] != 10 || refusals != 14 {
			t.Errorf("outcomes = %v, %d refused; want 10 Won and 14 refused", counts, refusals)
		}
		var sum int64
		for i := range 24 {
			if c, err := h.store.Get(ctx, fmt.Sprintf("pay/refund/%d", i)); err == nil {
				sum += c.Amount
			}
		}
		if sum != 1000 {
			t.Errorf("refund claims add up to %d, want 1000", sum)
		}
	})
}

// A refund's claim is never sent elsewhere: a build that does not know
// refunds, reopening the claim's key for charges, is refused by the table.
func TestRefundClaimCannotBeReopenedForAnotherEndpoint(t *testing.T) {
	t.Parallel()
	p, _ := newPostgres(t, claim.Config{Lease: lease})
	paid(t, p, "pay", 1000)
	r := refundReq("pay", "a", 100)
	mustClaim(t, p, r, claimengine.Won)
	if err := p.Reopen(context.Background(), r.Key, r.Owner, "charges", "cred"); err == nil {
		t.Fatal("a refund's claim was reopened for charges")
	}
	if err := p.Reopen(context.Background(), r.Key, r.Owner, "refunds", "cred"); err != nil {
		t.Fatalf("reopening for refunds: %v", err)
	}
}
