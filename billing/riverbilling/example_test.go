package riverbilling_test

import (
	"context"
	"fmt"
	"iter"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/riverdriver/riverpgxv5"
	"github.com/riverqueue/river/rivermigrate"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/riverbilling"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// Bill a period through River: the fan-out inserts one job for the three
// customers (up to 100 go in one), which a worker bills in one Biller.Run;
// the declined customer gets a job of its own, cancelled with the reason.
// Fanning out again while the job waits inserts nothing new.
func Example() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	srv := billingtest.NewServer(billingtest.Config{Declines: map[string]string{"cus_3": "insufficient_funds"}})
	defer srv.Close()

	if err := migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	store, _ := claim.NewPostgres(pool, claim.Config{})
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL, // omit in production
		Claims:    store,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	charge, err := riverbilling.NewWorker(biller, riverbilling.WorkerConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, charge)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: 10}},
		Workers: workers,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	customers := func() iter.Seq2[billing.Item, error] { return billing.Customers("cus_1", "cus_2", "cus_3") }
	res, err := riverbilling.FanOut(ctx, client, pool, "2026-09", customers(), 0)
	fmt.Printf("fan-out: %d inserted, %d duplicates, %v\n", res.Inserted, res.Duplicates, err)
	res, err = riverbilling.FanOut(ctx, client, pool, "2026-09", customers(), 0)
	fmt.Printf("again: %d inserted, %d duplicates, %v\n", res.Inserted, res.Duplicates, err)

	done, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 { // the job of three completed, the decline's own job cancelled
		<-done
	}
	stopCtx, cancelStop := context.WithTimeout(ctx, 10*time.Second)
	defer cancelStop()
	_ = client.Stop(stopCtx)

	st, _ := riverbilling.State(ctx, pool, store, "2026-09")
	fmt.Println(st)
	for _, c := range []string{"cus_1", "cus_2", "cus_3"} {
		fmt.Println(c, "charges at Stripe:", srv.CountPeriod(c, "2026-09"))
	}
	// Output:
	// fan-out: 3 inserted, 0 duplicates, <nil>
	// again: 0 inserted, 3 duplicates, <nil>
	// period 2026-09: jobs cancelled=1 completed=1; claims failed=1 succeeded=2
	// cus_1 charges at Stripe: 1
	// cus_2 charges at Stripe: 1
	// cus_3 charges at Stripe: 0
}

// Report usage through River: a job per report, inserted twice (the
// second is a duplicate), worked once, counted once by the meter.
func ExampleUsageWorker() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	srv.CreateMeter("api_calls", "sum", "") // a summing meter, made in Stripe's dashboard

	if err := migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	store, _ := claim.NewPostgres(pool, claim.Config{})
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL, // omit in production
		Claims:    store,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	report, err := riverbilling.NewUsageWorker(biller, riverbilling.WorkerConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, report)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: 10}},
		Workers: workers,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	// The last whole hour's API calls of cus_1.
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	u := billing.Usage{Customer: "cus_1", Meter: "api_calls", Kind: billing.Increments,
		Start: start, End: start.Add(time.Hour), Value: 1200}
	for range 2 {
		res, err := client.Insert(ctx, riverbilling.UsageArgs{Usage: u}, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("inserted, duplicate:", res.UniqueSkippedAsDuplicate)
	}

	done, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	fmt.Println("job:", (<-done).Kind)
	stopCtx, cancelStop := context.WithTimeout(ctx, 10*time.Second)
	defer cancelStop()
	_ = client.Stop(stopCtx)

	fmt.Println("meter events:", srv.MeterEvents("api_calls", "cus_1"))
	fmt.Println("hour's total:", srv.MeterTotal("api_calls", "cus_1", u.Start, u.End))
	// Output:
	// inserted, duplicate: false
	// inserted, duplicate: true
	// job: job_completed
	// meter events: 1
	// hour's total: 1200
}

// Refund a payment and pay a connected account out through River: a job
// per movement, the refund inserted twice (the second is a duplicate),
// each made once at Stripe. The payout is on its way to the bank when its
// job completes; its webhook or Reconcile settles it.
func ExampleMoneyOutWorker() {
	ctx := context.Background()
	pool, stop, err := pgtest.StartPool(ctx) // a throwaway PostgreSQL; use your own pool
	if err != nil {
		fmt.Println(err)
		return
	}
	defer stop()
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	acct := srv.CreateAccount() // a connected account, with funds
	srv.SetBalance(acct, "usd", 10_000)

	if err := migrate(ctx, pool); err != nil {
		fmt.Println(err)
		return
	}
	store, _ := claim.NewPostgres(pool, claim.Config{})
	biller, err := billing.New(billing.Config{
		SecretKey: "sk_test_example",
		StripeURL: srv.URL, // omit in production
		Claims:    store,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil
		},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	if _, err := biller.Charge(ctx, "cus_1", "2026-09", nil); err != nil {
		fmt.Println(err)
		return
	}
	moneyOut, err := riverbilling.NewMoneyOutWorker(biller, riverbilling.WorkerConfig{})
	if err != nil {
		fmt.Println(err)
		return
	}
	workers := river.NewWorkers()
	river.AddWorker(workers, moneyOut)
	client, err := river.NewClient(riverpgxv5.New(pool), &river.Config{
		Queues:  map[string]river.QueueConfig{riverbilling.DefaultQueue: {MaxWorkers: 10}},
		Workers: workers,
		Logger:  slog.New(slog.DiscardHandler),
	})
	if err != nil {
		fmt.Println(err)
		return
	}

	refund := riverbilling.MoneyOutArgs{Period: "2026-09", Customer: "cus_1", Refund: "outage-2026-09", Amount: 500}
	payout := riverbilling.MoneyOutArgs{Period: "2026-09", Payout: true, Account: acct, Amount: 4000, Currency: "usd"}
	for _, a := range []riverbilling.MoneyOutArgs{refund, refund, payout} {
		res, err := client.Insert(ctx, a, nil)
		if err != nil {
			fmt.Println(err)
			return
		}
		fmt.Println("inserted, duplicate:", res.UniqueSkippedAsDuplicate)
	}

	done, cancel := client.Subscribe(river.EventKindJobCompleted, river.EventKindJobCancelled)
	defer cancel()
	if err := client.Start(ctx); err != nil {
		fmt.Println(err)
		return
	}
	for range 2 {
		fmt.Println("job:", (<-done).Kind)
	}
	stopCtx, cancelStop := context.WithTimeout(ctx, 10*time.Second)
	defer cancelStop()
	_ = client.Stop(stopCtx)

	for _, object := range []string{"refund", "payout"} {
		for _, m := range srv.Movements(object) {
			fmt.Println(m.Object, m.Amount, m.Currency, "on the connected account:", m.Account == acct)
		}
	}
	// Output:
	// inserted, duplicate: false
	// inserted, duplicate: true
	// inserted, duplicate: false
	// job: job_completed
	// job: job_completed
	// refund 500 usd on the connected account: false
	// payout 4000 usd on the connected account: true
}

// migrate applies River's migrations and the claim table's.
func migrate(ctx context.Context, pool *pgxpool.Pool) error {
	m, err := rivermigrate.New(riverpgxv5.New(pool), nil)
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, rivermigrate.DirectionUp, nil); err != nil {
		return err
	}
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		return err
	}
	return store.Migrate(ctx)
}
