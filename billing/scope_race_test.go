package billing_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/billonce/billonce/billing"
)

// Two Billers of different scopes sharing the claim table, running the
// same customers and periods at once while every card is declined, send
// each period at most one payment between them: the period's first claim,
// declined, holds it against the other scope even when it fails while the
// other scope's claim waits on it. Every customer then completes its
// declined PaymentIntent, and each period is paid exactly once. Counted at
// the fake.
func TestTwoScopesRunningDeclinedPeriodsAtOnceSendOnePaymentPerPeriod(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	renamed := h.biller(func(c *billing.Config) { c.API = billing.PaymentIntents; c.Scope = "renamed" })
	var customers []string
	for i := range 16 {
		c := fmt.Sprintf("cus_%02d", i)
		customers = append(customers, c)
		h.srv.Decline(c, "authentication_required")
	}
	periods := []string{"2026-01", "2026-02", "2026-03", "2026-04", "2026-05", "2026-06"}
	for _, p := range periods {
		var wg sync.WaitGroup
		for _, b := range []*billing.Biller{h.b, renamed} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Declines and refusals on scope are the expected answers;
				// what counts is what reached the fake.
				b.Run(ctx, p, billing.Customers(customers...), nil)
			}()
		}
		wg.Wait()
	}
	sent := map[[2]string][]string{}
	for _, pay := range h.srv.Payments() {
		k := [2]string{pay.Customer, pay.Period}
		sent[k] = append(sent[k], pay.ID)
	}
	for _, p := range periods {
		for _, c := range customers {
			ids := sent[[2]string{c, p}]
			if len(ids) != 1 {
				t.Errorf("%s %s: %d payments sent (%v), want one, declined", c, p, len(ids), ids)
				continue
			}
			h.completeOnSession(ids[0])
			if n := h.srv.CountPeriod(c, p); n != 1 {
				t.Errorf("%s %s paid %d times once its customer completed its payment, want once", c, p, n)
			}
		}
	}
}
