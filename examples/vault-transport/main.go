// Command vault-transport sends an existing stripe-go client and a plain
// net/http client through a spend-cap proxy (billing/spendcap, on
// loopback) with a vault key, against an in-process fake Stripe. A billing
// loop that makes a fresh idempotency key on every pass is stopped at the
// cap.
//
//	go run ./examples/vault-transport
package main

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/url"
	"strings"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

const (
	appSecret = "sk_live_the_app_never_sends_this" // what the service was configured with
	vaultKey  = "vault_key_for_run_2026_09"        // issued by the proxy for this run
)

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	// Stand-ins for Stripe and for the proxy that holds the real secret.
	stripeAPI := billingtest.NewServer(billingtest.Config{APIKeys: []string{"sk_test_held_by_the_proxy"}})
	defer stripeAPI.Close()
	proxy := spendcaptest.NewProxy(spendcaptest.Config{
		Upstream: stripeAPI.URL, StripeKey: "sk_test_held_by_the_proxy", Clock: stripeAPI,
	})
	defer proxy.Close()
	proxy.IssueKey(vaultKey, spendcap.Key{
		CapAmount: 10000, Per: spendcap.PerDay,
		AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges", "GET /v1/charges/*"},
	})

	// 1. An existing stripe-go client: only its HTTP client changes. Keep
	// your own *http.Client (timeouts, tracing) as the last argument.
	hc, err := spendcap.Client(proxy.URL, vaultKey, &http.Client{})
	if err != nil {
		return err
	}
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0), // stripe-go would retry a refusal
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	sc := &client.API{}
	sc.Init(appSecret, &stripe.Backends{API: backend, Connect: backend, Uploads: backend})

	// A runaway loop: a new key every pass, so Stripe sees new charges.
	for i := 1; i <= 100; i++ {
		p := &stripe.ChargeParams{Amount: stripe.Int64(3000), Currency: stripe.String("usd"), Customer: stripe.String("cus_42")}
		p.SetIdempotencyKey(fmt.Sprintf("random-%d", i))
		_, err := sc.Charges.New(p)
		if errors.Is(err, spendcap.ErrSpendCapReached) {
			fmt.Printf("pass %d stopped by the proxy: %v\n", i, err)
			break
		}
		if err != nil {
			return fmt.Errorf("pass %d: %w", i, err)
		}
		fmt.Printf("pass %d charged $30\n", i)
	}
	if n := stripeAPI.Count("cus_42"); n != 3 {
		return fmt.Errorf("cus_42 was charged %d times; want 3 under a $100 cap", n)
	}

	// 2. Plain net/http: the same client works for any request.
	resp, err := hc.Get("https://api.stripe.com/v1/charges?customer=cus_42")
	if err != nil {
		return err
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	fmt.Printf("GET /v1/charges through the proxy: %d, %d charges listed\n", resp.StatusCode, strings.Count(string(body), `"object":"charge"`))

	// 3. An endpoint outside the vault key's allowlist.
	_, err = hc.PostForm("https://api.stripe.com/v1/payment_intents", url.Values{"amount": {"100"}, "currency": {"usd"}})
	if !errors.Is(err, spendcap.ErrEndpointNotAllowed) {
		return fmt.Errorf("payment intent: %v; want ErrEndpointNotAllowed", err)
	}
	fmt.Println("payment intent refused:", errors.Is(err, spendcap.ErrEndpointNotAllowed))
	fmt.Println("the transport prints as", hc.Transport)
	return nil
}
