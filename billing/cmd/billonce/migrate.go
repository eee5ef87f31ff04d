package main

import (
	"context"
	"fmt"

	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/migrate"
	"github.com/billonce/billonce/lock"
)

// cmdMigrate creates or updates every table billonce owns: the claim table
// and its events (package claim), the spend-cap budgets (package
// spendcap) and the lease table (package lock). Each owner's migrations
// run in their own transaction under their own advisory lock, so replicas
// may run it at once; once the tables are up to date it only reads.
func cmdMigrate(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "migrate", "migrate [-dry-run] [-database-url URL]")
	var c conn
	c.register(f)
	dry := f.Bool("dry-run", false, "print the SQL, for the default table names, and change nothing (needs no database)")
	if err := f.parse(args); err != nil {
		return err
	}
	if *dry {
		return printMigrations(a)
	}
	pool, err := c.open(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		return err
	}
	lease, err := lock.NewLease(pool, lock.LeaseConfig{})
	if err != nil {
		return err
	}
	caps, err := spendcap.NewPostgresStore(pool)
	if err != nil {
		return err
	}
	for _, m := range []struct {
		what string
		run  func(context.Context) error
	}{
		{"claims and events (" + claim.DefaultTable + ")", store.Migrate},
		{"spend-cap budgets (spendcap_keys)", caps.Migrate},
		{"lease table (" + lock.DefaultLeaseTable + ")", lease.Migrate},
	} {
		if err := c.bounded(ctx, m.run); err != nil {
			return fmt.Errorf("%s: %w", m.what, err)
		}
		fmt.Fprintf(a.stdout, "up to date: %s\n", m.what)
	}
	return nil
}

// printMigrations prints every migration billonce has, in the order
// migrate applies them.
func printMigrations(a *app) error {
	cms, err := claim.Migrations(claim.Config{})
	if err != nil {
		return err
	}
	for _, m := range cms {
		fmt.Fprintf(a.stdout, "-- claim %04d_%s\n%s\n", m.Version, m.Name, m.SQL)
	}
	for _, m := range spendcap.Migrations() {
		fmt.Fprintf(a.stdout, "-- spendcap %04d_%s\n%s\n", m.Version, m.Name, m.SQL)
	}
	for _, m := range migrate.Published("lock") {
		fmt.Fprintf(a.stdout, "-- lock %04d_%s\n%s\n", m.Version, m.Name, m.SQL)
	}
	return nil
}
