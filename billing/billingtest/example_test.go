package billingtest_test

import (
	"fmt"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

// A lost response after Stripe committed: retrying with the same key gets
// the original charge back; retrying with a new key charges twice.
func Example() {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()

	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	charges := charge.Client{B: backend, Key: "sk_test_example"}

	charge := func(customer, key string) error {
		p := &stripe.ChargeParams{Amount: stripe.Int64(2999), Currency: stripe.String("usd"), Customer: stripe.String(customer)}
		p.AddMetadata("billonce_period", "2026-09")
		p.SetIdempotencyKey(key)
		_, err := charges.New(p)
		return err
	}

	for _, c := range []struct{ customer, retryKey string }{
		{"cus_same_key", "cus_same_key/2026-09"},
		{"cus_new_key", "a-fresh-uuid"},
	} {
		// The first attempt commits, then the connection is cut.
		srv.FailNext(billingtest.Match{Customer: c.customer}, billingtest.Fault{Kind: billingtest.FaultCut})
		fmt.Println("first attempt failed:", charge(c.customer, c.customer+"/2026-09") != nil)
		fmt.Println("retry failed:", charge(c.customer, c.retryKey) != nil)
		fmt.Printf("%s charged %d time(s)\n", c.customer, srv.CountPeriod(c.customer, "2026-09"))
	}
	// Output:
	// first attempt failed: true
	// retry failed: false
	// cus_same_key charged 1 time(s)
	// first attempt failed: true
	// retry failed: false
	// cus_new_key charged 2 time(s)
}
