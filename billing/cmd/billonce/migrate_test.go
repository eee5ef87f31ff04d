package main

import (
	"context"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

func TestMigrateCreatesEveryTableOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	r := e.billonce("", "migrate", "-dry-run").want(t, exitOK)
	for _, table := range []string{"billonce_claims", "billonce_claims_events", "spendcap_keys", "billonce_lock_leases"} {
		if !strings.Contains(r.stdout, "CREATE TABLE IF NOT EXISTS "+table+" ") {
			t.Errorf("migrate -dry-run does not create %s:\n%s", table, r.stdout)
		}
	}
	if got := e.tables(); got != "" {
		t.Fatalf("-dry-run created tables: %s", got)
	}
	for range 2 {
		r = e.billonce("", "migrate").want(t, exitOK)
		if n := strings.Count(r.stdout, "up to date"); n != 3 {
			t.Errorf("migrate reported %d owners, want 3:\n%s", n, r.stdout)
		}
	}
	want := "billonce_claims billonce_claims_events billonce_claims_migrations billonce_lock_leases billonce_lock_leases_migrations " +
		"spendcap_audit spendcap_idempotency spendcap_keys spendcap_migrations spendcap_reservations"
	if got := e.tables(); got != want {
		t.Errorf("tables after migrate: %s\nwant %s", got, want)
	}
}

// tables lists the tables of the public schema, sorted.
func (e *env) tables() string {
	e.t.Helper()
	var s string
	if err := e.pool.QueryRow(context.Background(),
		"SELECT coalesce(string_agg(tablename, ' ' ORDER BY tablename), '') FROM pg_tables WHERE schemaname = 'public'").Scan(&s); err != nil {
		e.t.Fatal(err)
	}
	return s
}
