// Command quickstart bills one period in the shape of a production job: a
// pgx pool from DATABASE_URL, the claim table, a Biller, a lock so that one
// replica runs, Run, and an exit status from the summary.
//
//	DATABASE_URL=postgres://… STRIPE_SECRET_KEY=sk_… go run ./examples/quickstart 2026-09 < customers.txt
//
// Customers are read from standard input, one ID per line; each owes $25.00.
// STRIPE_URL points it at another Stripe (the fake, in its test). With no
// Logger in the Config, warnings and errors (a stopped run, a claim that
// needs reconciliation) go to the process's slog default. A Stripe that
// gives no answer at all (a refused port, DNS, timeouts) stops the run
// within seconds, with billing.ErrStripeUnreachable.
//
// Its exit status follows the table every billonce program shares
// (billing/cmd/billonce/README.md#exit-status). After a 4, customers not
// billed (declined, pending, invalid), run it again: nobody is charged
// twice.
package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"os/signal"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/lock"
)

// Exit statuses, as every billonce program has them; log.Fatal exits
// with 1, stopped.
const (
	exitUsage      = 2
	exitLockHeld   = 3
	exitIncomplete = 4
)

const usage = `usage: quickstart PERIOD < customers.txt

Bills PERIOD (2026-09, or a day: 2026-09-15) for the customer IDs on
standard input, one per line, $25.00 each. Environment: DATABASE_URL,
STRIPE_SECRET_KEY, STRIPE_URL (default https://api.stripe.com).
Exit status: 0 billed, 1 stopped, 2 usage, 3 lock held elsewhere,
4 customers not billed.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if len(os.Args) == 2 {
		switch os.Args[1] {
		case "-h", "-help", "--help":
			fmt.Print(usage)
			return
		}
	}
	if len(os.Args) != 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(exitUsage)
	}
	period := os.Args[1]
	if err := billing.ValidatePeriod(period); err != nil {
		fmt.Fprintf(os.Stderr, "quickstart: %v\n%s", err, usage)
		os.Exit(exitUsage)
	}
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	check(err)
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	check(err)
	check(store.Migrate(ctx)) // or apply claim.Migrations with your migration tool
	biller, err := billing.New(billing.Config{
		SecretKey: os.Getenv("STRIPE_SECRET_KEY"),
		StripeURL: os.Getenv("STRIPE_URL"), // empty: api.stripe.com
		Claims:    store,
		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
			return billing.Price{Amount: 2500, Currency: "usd"}, nil // from your plans table
		},
	})
	check(err)
	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	check(err)

	sum, err := biller.Run(ctx, period, customers(), &billing.RunOptions{Lock: guard})
	log.Printf("%s: %d created, %d already billed, %d declined, %d pending, %d invalid",
		period, sum.Created, sum.AlreadyBilled, sum.Declined, sum.Pending, sum.Invalid)
	for _, f := range sum.Failures {
		log.Print(f)
	}
	switch {
	case errors.Is(err, billing.ErrRunHeldElsewhere):
		log.Print(err)
		os.Exit(exitLockHeld)
	case err != nil:
		log.Fatal(err)
	case !sum.Complete():
		os.Exit(exitIncomplete)
	}
}

// customers reads customer IDs from standard input, one per line.
func customers() func(yield func(billing.Item, error) bool) {
	return func(yield func(billing.Item, error) bool) {
		lines := bufio.NewScanner(os.Stdin)
		for lines.Scan() {
			if id := lines.Text(); id != "" && !yield(billing.Item{Customer: id}, nil) {
				return
			}
		}
		if err := lines.Err(); err != nil {
			yield(billing.Item{}, err)
		}
	}
}

func check(err error) {
	if err != nil {
		log.Fatal(err)
	}
}
