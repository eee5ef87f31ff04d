package billing_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/billonce/billonce/billing"
)

// Replicas refunding one payment at once, by Refund and by Runs of refund
// items, on a database whose default isolation is repeatable read: Stripe
// is asked for no more than the payment, and every refund past it is
// refused before anything is sent, as at the default isolation.
func TestConcurrentRefundsNeverAskStripeForMoreThanThePaymentUnderRepeatableRead(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	pay := paidFor(t, e, "cus_x")
	e.exec("ALTER DATABASE " + pgx.Identifier{e.pool.Config().ConnConfig.Database}.Sanitize() +
		" SET default_transaction_isolation = 'repeatable read'")
	e.pool.Reset() // new connections take the setting
	const n = 12   // refunds of 1000 of a payment of 2500: two fit
	var wg sync.WaitGroup
	var mu sync.Mutex
	var created, invalid int
	count := func(i int, err error) {
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil:
			created++
		case errors.Is(err, billing.ErrInvalid):
			invalid++
		default:
			t.Errorf("refund %d: %v", i, err)
		}
	}
	start := make(chan struct{})
	for i := range n {
		b := e.biller()
		wg.Go(func() {
			<-start
			id := fmt.Sprintf("r%d", i)
			if i%2 == 0 {
				_, err := b.Refund(ctx, "cus_x", period, id, 1000)
				count(i, err)
				return
			}
			sum, err := b.Run(ctx, period, refundItems([]string{"cus_x"}, billing.Refund{ID: id, Amount: 1000}), nil)
			if err == nil && len(sum.Failures) > 0 {
				err = sum.Failures[0]
			}
			count(i, err)
		})
	}
	close(start)
	wg.Wait()
	if created != 2 || invalid != n-2 || refundPosts(e) != 2 || refunded(e, pay) != 2000 {
		t.Fatalf("%d refunded, %d refused, %d refund requests, Stripe holds %d refunded; want 2, %d, 2 and 2000",
			created, invalid, refundPosts(e), refunded(e, pay), n-2)
	}
}
