package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A send that outlasts the claim's lease keeps renewing it: another runner
// meanwhile finds the claim in progress, not free to resume.
func TestChargeRenewsLeaseWhileSending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	short, err := claim.NewPostgres(e.pool, claim.Config{Lease: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	e.srv.FailNext(billingtest.Match{Customer: "cus_slow"}, billingtest.Fault{Kind: billingtest.FaultSlow, Delay: 7500 * time.Millisecond})
	slow := e.biller(func(c *billing.Config) { c.Claims = short })
	done := make(chan error, 1)
	go func() {
		_, err := slow.Charge(context.Background(), "cus_slow", period, nil)
		done <- err
	}()
	for range 3 {
		time.Sleep(2200 * time.Millisecond) // more than the lease each time
		_, err := e.biller(func(c *billing.Config) { c.Claims = short }).Charge(context.Background(), "cus_slow", period, nil)
		var inProgress *billing.ChargeError
		if !errors.As(err, &inProgress) || !errors.Is(err, billing.ErrInProgress) {
			t.Fatalf("another runner during the send: %v; want ErrInProgress", err)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	wantCount(t, e, "cus_slow", 1)
}
