// Command failure-modes shows, side by side, how common Go billing code
// charges a Stripe customer twice (or not at all) and how billonce charges
// exactly once. Each failure mode runs twice against a fresh fake Stripe:
// once as the unsafe code, once with billonce. The counts in the table are
// read from the fake's ledger after each run.
//
//	go run ./examples/failure-modes                 # throwaway PostgreSQL
//	go run ./examples/failure-modes -v              # and what each side saw
//	go run ./examples/failure-modes -database-url postgres://...
//
// It exits 0 only if billonce charged every customer exactly once in every
// row.
package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"text/tabwriter"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/internal/pgtest"
)

func main() {
	dbURL := flag.String("database-url", "", "PostgreSQL connection string; the gallery creates and drops schemas named failure_modes_* in it (default: start a throwaway cluster)")
	verbose := flag.Bool("v", false, "print what each side did")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	logf := func(string, ...any) {}
	if *verbose {
		logf = func(format string, args ...any) { fmt.Fprintf(os.Stderr, "  "+format+"\n", args...) }
	}
	ok, err := run(ctx, os.Stdout, *dbURL, logf)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "failure-modes:", err)
		os.Exit(2)
	}
	if !ok {
		fmt.Fprintln(os.Stderr, "failure-modes: billonce did not charge every customer exactly once; run with -v to see what happened")
		os.Exit(1)
	}
}

// run measures every scenario and prints the table. ok reports whether
// billonce matched the expected count in every row.
func run(ctx context.Context, w io.Writer, dbURL string, logf func(string, ...any)) (ok bool, err error) {
	if dbURL == "" {
		cluster, err := pgtest.Start(ctx)
		if err != nil {
			return false, err
		}
		defer cluster.Stop()
		if dbURL, err = cluster.NewDatabase(ctx); err != nil {
			return false, err
		}
	}
	pool, err := pgxpool.New(ctx, dbURL)
	if err != nil {
		return false, err
	}
	defer pool.Close()
	rows, err := gallery(ctx, pool, dbURL, logf)
	if err != nil {
		return false, err
	}
	printTable(w, rows)
	return allExact(rows), nil
}

// gallery measures every scenario in turn.
func gallery(ctx context.Context, pool *pgxpool.Pool, dbURL string, logf func(string, ...any)) ([]row, error) {
	var rows []row
	for i, s := range scenarios {
		logf("%s", s.name)
		r, err := measure(ctx, pool, dbURL, i+1, s, logf)
		if err != nil {
			return rows, err
		}
		rows = append(rows, r)
	}
	return rows, nil
}

func allExact(rows []row) bool {
	for _, r := range rows {
		if r.billonce != r.expected {
			return false
		}
	}
	return len(rows) > 0
}

func printTable(w io.Writer, rows []row) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "failure mode\tnaive\tbillonce\texpected")
	fmt.Fprintln(tw, "------------\t-----\t--------\t--------")
	wrong, exact := 0, 0
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", r.name, r.naive, r.billonce, r.expected)
		if r.naive != r.expected {
			wrong++
		}
		if r.billonce == r.expected {
			exact++
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "\nunsafe code wrong in %d of %d rows; billonce exactly once in %d of %d.\n", wrong, len(rows), exact, len(rows))
}
