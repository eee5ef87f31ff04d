package billingtest_test

import (
	"fmt"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"
)

// A usage reporter that sends an hour's usage twice: with a fixed
// identifier Stripe refuses the second event; with none it is counted
// twice.
func ExampleServer_MeterTotal() {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	events := meterevent.Client{B: backend, Key: "sk_test_example"}
	srv.CreateMeter("api_calls", "sum", "")
	hour := srv.Now().Truncate(time.Hour)

	report := func(customer, identifier string) error {
		p := &stripe.BillingMeterEventParams{EventName: stripe.String("api_calls"),
			Payload:   map[string]string{"stripe_customer_id": customer, "value": "120"},
			Timestamp: stripe.Int64(hour.Unix())}
		if identifier != "" {
			p.Identifier = stripe.String(identifier)
		}
		//idemvet:ignore a state rule of the fake is tested, not a retry
		_, err := events.New(p)
		return err
	}
	for range 2 {
		fmt.Println("with identifier, refused:", report("cus_a", "cus_a/"+hour.Format(time.RFC3339)) != nil)
		fmt.Println("without, refused:", report("cus_b", "") != nil)
	}
	fmt.Println("cus_a:", srv.MeterTotal("api_calls", "cus_a", hour, hour.Add(time.Hour)))
	fmt.Println("cus_b:", srv.MeterTotal("api_calls", "cus_b", hour, hour.Add(time.Hour)))
	// Output:
	// with identifier, refused: false
	// without, refused: false
	// with identifier, refused: true
	// without, refused: false
	// cus_a: 120
	// cus_b: 240
}

// An invoice takes lines only while it is a draft, and is paid once.
func ExampleServer_Invoices() {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	invoices := invoice.Client{B: backend, Key: "sk_test_example"}
	items := invoiceitem.Client{B: backend, Key: "sk_test_example"}

	// Every write carries a key of its own, as billing's do.
	keyed := func(key string) stripe.Params { return stripe.Params{IdempotencyKey: stripe.String(key)} }
	//idemvet:ignore a state rule of the fake is tested, not a retry
	inv, _ := invoices.New(&stripe.InvoiceParams{Params: keyed("draft"), Customer: stripe.String("cus_1"), AutoAdvance: stripe.Bool(false)})
	line := func(key string) *stripe.InvoiceItemParams {
		return &stripe.InvoiceItemParams{Params: keyed(key), Customer: stripe.String("cus_1"), Invoice: stripe.String(inv.ID),
			Amount: stripe.Int64(4200), Currency: stripe.String("usd")}
	}
	_, err := items.New(line("line-1"))
	fmt.Println("line on the draft refused:", err != nil)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	invoices.FinalizeInvoice(inv.ID, &stripe.InvoiceFinalizeInvoiceParams{Params: keyed("finalize")})
	_, err = items.New(line("line-2"))
	fmt.Println("line on the open invoice refused:", err != nil)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = invoices.Pay(inv.ID, &stripe.InvoicePayParams{Params: keyed("pay")})
	fmt.Println("first payment refused:", err != nil)
	//idemvet:ignore a state rule of the fake is tested, not a retry
	_, err = invoices.Pay(inv.ID, &stripe.InvoicePayParams{Params: keyed("pay-again")})
	fmt.Println("second payment refused:", err != nil)

	got := srv.Invoices("cus_1")[0]
	fmt.Println(got.Status, len(got.Lines), "line(s), paid", got.Payments, "time(s)")
	// Output:
	// line on the draft refused: false
	// line on the open invoice refused: true
	// first payment refused: false
	// second payment refused: true
	// paid 1 line(s), paid 1 time(s)
}
