package spendcap_test

import (
	"errors"
	"fmt"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"
)

// A billing loop that makes a fresh idempotency key on every pass charges
// again and again. Sent through a spend-cap proxy with a vault key, it stops
// at the cap, with an error that says so.
func ExampleClient() {
	stripeAPI := billingtest.NewServer(billingtest.Config{APIKeys: []string{"sk_test_held_by_proxy"}})
	defer stripeAPI.Close()
	proxy := spendcaptest.NewProxy(spendcaptest.Config{Upstream: stripeAPI.URL, StripeKey: "sk_test_held_by_proxy", Clock: stripeAPI})
	defer proxy.Close()
	proxy.IssueKey("vault_run_2026_09", spendcap.Key{CapAmount: 5000, Per: spendcap.PerDay})

	// The only change to an existing stripe-go setup: the HTTP client.
	hc, err := spendcap.Client(proxy.URL, "vault_run_2026_09", nil)
	if err != nil {
		fmt.Println(err)
		return
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	charges := charge.Client{B: backend, Key: "sk_live_never_sent"}

	for i := 1; ; i++ {
		p := &stripe.ChargeParams{Amount: stripe.Int64(2000), Currency: stripe.String("usd"), Customer: stripe.String("cus_1")}
		p.SetIdempotencyKey(fmt.Sprintf("fresh-key-%d", i)) // the bug
		_, err := charges.New(p)
		if errors.Is(err, spendcap.ErrSpendCapReached) {
			var pe *spendcap.ProxyError
			errors.As(err, &pe)
			fmt.Printf("charge %d refused by the proxy: %d %s\n", i, pe.Status, pe.Message)
			break
		}
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Printf("charge %d made\n", i)
	}
	fmt.Println("customer charged", stripeAPI.Count("cus_1"), "times")
	// Output:
	// charge 1 made
	// charge 2 made
	// charge 3 refused by the proxy: 429 Daily spend cap of $50 reached
	// customer charged 2 times
}
