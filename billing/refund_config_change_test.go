package billing_test

import (
	"context"
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/idemkey"
)

// A refund whose request is on its way under the old secret key when its
// lease runs out, and a replica on the rotated key (or the same one) is
// asked for the same refund id: Stripe keeps keys per API key, so the
// replica must not send before the old request can have landed. Stripe
// holds one refund.
func TestRefundRacingAKeyRotationIsMadeOnce(t *testing.T) {
	t.Parallel()
	for name, bKey := range map[string]string{"same key": secretKey, "rotated key": rotatedKey} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t)
			pay := paidFor(t, e, "cus_k")
			ctx := context.Background()
			key, err := idemkey.For(billing.DefaultScope, e.key("cus_k"), "refund", "rma-k")
			if err != nil {
				t.Fatal(err)
			}
			late := newLateTransport(key.String())
			a := e.biller(func(c *billing.Config) {
				c.HTTPClient = &http.Client{Transport: late}
				c.Retry.AttemptTimeout = 30 * time.Second
				c.Retry.MaxAttempts = 1
			})
			done := make(chan error, 1)
			go func() {
				_, err := a.Refund(ctx, "cus_k", period, "rma-k", 900)
				done <- err
			}()
			<-late.held
			// A's lease runs out while its request is on its way.
			e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second' WHERE key = $1", key.String())
			b := e.biller(func(c *billing.Config) { c.SecretKey = bKey })
			rb, errB := b.Refund(ctx, "cus_k", period, "rma-k", 900)
			close(late.release)
			errA := <-done
			if got := refundsOf(e, pay); len(got) != 1 {
				t.Fatalf("Stripe holds %d refunds %+v, want 1; A: %v; B: %+v, %v", len(got), got, errA, rb, errB)
			}
			if bKey == rotatedKey && !errors.Is(errB, billing.ErrSentElsewhere) {
				t.Fatalf("B on the rotated key: %+v, %v; want ErrSentElsewhere, nothing sent", rb, errB)
			}
		})
	}
}
