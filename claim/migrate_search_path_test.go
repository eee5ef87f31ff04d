package claim_test

import (
	"context"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5"
)

// A claim table that an earlier billonce created through the default
// search_path ("$user", public) lives in public. Once a schema named after
// the role exists (as PostgreSQL's documentation advises for every role),
// the first schema on the search_path is that one, but the claim table is
// still public's: Migrate must upgrade public's table and keep every
// claim, not create an empty claim table in front of it.
func TestMigrateUpgradesTheTableTheSearchPathFindsNotANewOne(t *testing.T) {
	ctx := context.Background()
	pool := pgtest.Pool(t)
	createV1(t, pool, claim.Config{})
	var user string
	if err := pool.QueryRow(ctx, "SELECT current_user").Scan(&user); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{user}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	var before string
	if err := pool.QueryRow(ctx, "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass('billonce_claims')").Scan(&before); err != nil {
		t.Fatal(err)
	}

	s := migrate(t, pool, claim.Config{})

	var after string
	if err := pool.QueryRow(ctx, "SELECT relnamespace::regnamespace::text FROM pg_class WHERE oid = to_regclass('billonce_claims')").Scan(&after); err != nil {
		t.Fatal(err)
	}
	if after != before {
		t.Errorf("before Migrate the store's queries reached the table in schema %s, after it the one in %s", before, after)
	}
	for _, key := range []string{"k_pending", "k_ok", "k_fail"} {
		if c, err := s.Get(ctx, key); err != nil {
			t.Errorf("Get(%s) after the upgrade: %v; want the v1 claim", key, err)
		} else if c.Key != key {
			t.Errorf("Get(%s) = %+v", key, c)
		}
	}
}
