package billing_test

import (
	"context"
	"fmt"
	"net/http/httptest"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A bank debit is processing when the run ends; three days later it fails,
// Stripe delivers the event (twice) to the webhook, and the next run
// reports the failure apart from card declines and charges nobody again.
func ExampleBiller_Webhook() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{Async: map[string]billingtest.Async{
		"cus_bank": {After: 72 * time.Hour, FailureCode: "insufficient_funds"},
	}})
	defer srv.Close()
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,
		Claims:    claim.NewMemory(claim.Config{}), // claim.NewPostgres in production
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 4900, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	handler, err := biller.Webhook(billing.WebhookConfig{Secret: "whsec_example"})
	if err != nil {
		fmt.Println(err)
		return
	}
	endpoint := httptest.NewServer(handler) // mount it where Stripe's endpoint points
	defer endpoint.Close()

	customers := billing.Customers("cus_card", "cus_bank")
	one := &billing.RunOptions{Concurrency: 1} // one at a time, so that the ids printed below are the same each run
	sum, _ := biller.Run(ctx, "2026-09", customers, one)
	fmt.Printf("run: created %d, processing %d, complete %v\n", sum.Created, sum.Processing, sum.Complete())

	srv.Advance(72 * time.Hour)
	sender, _ := billingtest.NewSender(billingtest.SenderConfig{URL: endpoint.URL, Secret: "whsec_example", Duplicate: 1})
	rep := sender.Send(ctx, srv.Events())
	fmt.Printf("webhook: %d events in %d deliveries\n", rep.Events, rep.Deliveries)

	sum, _ = biller.Run(ctx, "2026-09", customers, one)
	fmt.Printf("next run: already billed %d, failed after settlement %d\n", sum.AlreadyDone, sum.FailedAfterProcessing)
	fmt.Println(sum.Failures[0])
	fmt.Println("payments at Stripe:", len(srv.Payments()))
	// Output:
	// run: created 1, processing 1, complete true
	// webhook: 3 events in 6 deliveries
	// next run: already billed 1, failed after settlement 1
	// billing: charge for customer cus_bank, period 2026-09 failed: payment ch_00000000000002 failed after processing: insufficient_funds; to bill again, call Rebill with attempt 2
	// payments at Stripe: 2
}
