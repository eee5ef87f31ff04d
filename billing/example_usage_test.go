package billing_test

import (
	"context"
	"fmt"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Report an hour of API calls while Stripe's answer is lost on the way
// back: the retry carries the same identifier and key, Stripe replays the
// event it made, and reporting the hour again sends nothing. The meter
// counts the hour once.
func ExampleBiller_ReportUsage() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	srv.CreateMeter("api_calls", "sum", "") // made once, in the Stripe dashboard or API

	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL,                         // omit in production
		Claims:    claim.NewMemory(claim.Config{}), // claim.NewPostgres in production
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	hour := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour) // the last hour that is over
	u := billing.Usage{Customer: "cus_1", Meter: "api_calls", Kind: billing.Increments,
		Start: hour, End: hour.Add(time.Hour), Value: 1200}

	srv.FailNext(billingtest.Match{Path: "/v1/billing/meter_events"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := biller.ReportUsage(ctx, u)
	fmt.Println(r.Outcome, r.Amount, err)
	r, err = biller.ReportUsage(ctx, u)
	fmt.Println(r.Outcome, err)
	fmt.Println("events at Stripe:", srv.MeterEvents("api_calls", "cus_1"), "total:", srv.MeterTotal("api_calls", "cus_1", u.Start, u.End))

	// Totals sent to a summing meter would add up: refused before sending.
	u.Kind = billing.WindowTotals
	_, err = biller.ReportUsage(ctx, u)
	fmt.Println(err != nil)
	// Output:
	// replayed 1200 <nil>
	// already billed <nil>
	// events at Stripe: 1 total: 1200
	// true
}

// Report many windows at once, with Run's batching, concurrency and rate
// limit; running again sends nothing.
func ExampleBiller_RunUsage() {
	ctx := context.Background()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	srv.CreateMeter("seats", "sum", "day") // keeps the newest total of each day

	biller, err := billing.New(billing.Config{SecretKey: "sk_test_example", StripeURL: srv.URL, Claims: claim.NewMemory(claim.Config{})})
	if err != nil {
		fmt.Println(err)
		return
	}
	yesterday := time.Now().UTC().Truncate(24 * time.Hour).Add(-24 * time.Hour)
	reports := func(yield func(billing.Usage, error) bool) {
		for i, c := range []string{"cus_1", "cus_2", "cus_3"} {
			u := billing.Usage{Customer: c, Meter: "seats", Kind: billing.WindowTotals,
				Start: yesterday, End: yesterday.Add(24 * time.Hour), Value: int64(10 * (i + 1))}
			if !yield(u, nil) {
				return
			}
		}
	}
	sum, err := biller.RunUsage(ctx, reports, nil)
	fmt.Printf("sent %d, complete %v, err %v\n", sum.Created, sum.Complete(), err)
	sum, _ = biller.RunUsage(ctx, reports, nil)
	fmt.Printf("again: sent %d, already reported %d\n", sum.Created, sum.AlreadyBilled)
	fmt.Println("cus_3's seats:", srv.MeterTotal("seats", "cus_3", yesterday, yesterday.Add(24*time.Hour)))
	// Output:
	// sent 3, complete true, err <nil>
	// again: sent 0, already reported 3
	// cus_3's seats: 30
}
