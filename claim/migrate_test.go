package claim_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// The configurations every migration test runs with: the default, and a
// schema with a mixed-case table that only survives correct quoting.
var migrateConfigs = []claim.Config{{}, {Schema: "billing", Table: "Claims_v2"}}

// names returns cfg's quoted claim table and migrations record.
func names(cfg claim.Config) (table, record string) {
	if cfg.Table == "" {
		cfg.Table = claim.DefaultTable
	}
	if cfg.Schema == "" {
		return pgx.Identifier{cfg.Table}.Sanitize(), pgx.Identifier{cfg.Table + "_migrations"}.Sanitize()
	}
	return pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), pgx.Identifier{cfg.Schema, cfg.Table + "_migrations"}.Sanitize()
}

// v1SQL returns testdata/claim_v1_schema.sql, the claim table as billonce created
// it before migrations were versioned, with cfg's names in place.
func v1SQL(tb testing.TB, cfg claim.Config) string {
	tb.Helper()
	b, err := os.ReadFile("../testdata/claim_v1_schema.sql")
	if err != nil {
		tb.Fatal(err)
	}
	if cfg.Table == "" {
		cfg.Table = claim.DefaultTable
	}
	table, _ := names(cfg)
	return strings.NewReplacer(
		"{{table}}", table,
		"{{live_index}}", pgx.Identifier{cfg.Table + "_live"}.Sanitize(),
		"{{pending_index}}", pgx.Identifier{cfg.Table + "_pending"}.Sanitize(),
	).Replace(string(b))
}

// createV1 creates cfg's claim table as a released v1 billonce did, with a
// pending claim whose lease has expired, a succeeded one and a failed one.
func createV1(tb testing.TB, db *pgxpool.Pool, cfg claim.Config) {
	tb.Helper()
	ctx := context.Background()
	if cfg.Schema != "" {
		if _, err := db.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{cfg.Schema}.Sanitize()); err != nil {
			tb.Fatal(err)
		}
	}
	if _, err := db.Exec(ctx, v1SQL(tb, cfg)); err != nil {
		tb.Fatal(err)
	}
	table, _ := names(cfg)
	_, err := db.Exec(ctx, "INSERT INTO "+table+` (key, customer, period, amount, currency, state, stripe_id, attempts, owner, lease_until, last_error, created_at, updated_at) VALUES
		('k_pending', 'cus_1', '2025-01', 4200, 'usd', 'pending',   '',     2, 'pod-a', '2025-01-01 10:02:00Z', 'timeout',       '2025-01-01 10:00:00Z', '2025-01-01 10:01:00Z'),
		('k_ok',      'cus_2', '2025-01', 1500, 'eur', 'succeeded', 'ch_1', 1, 'pod-a', '2025-01-01 10:02:00Z', '',              '2025-01-01 11:00:00Z', '2025-01-01 11:00:05Z'),
		('k_fail',    'cus_3', '2025-01',  900, 'usd', 'failed',    '',     1, 'pod-b', '2025-01-01 10:02:00Z', 'card_declined', '2025-01-02 09:00:00Z', '2025-01-02 09:00:01Z')`)
	if err != nil {
		tb.Fatal(err)
	}
}

// v1Columns are the claim table's columns as v1 created them.
const v1Columns = "key, customer, period, amount, currency, state, stripe_id, attempts, owner, lease_until, last_error, created_at, updated_at"

// rows returns the claim table's rows as text, cols of each, by key.
func rows(tb testing.TB, db *pgxpool.Pool, cfg claim.Config, cols string) []string {
	tb.Helper()
	table, _ := names(cfg)
	r, _ := db.Query(context.Background(), "SELECT ("+cols+")::text FROM "+table+" t ORDER BY key")
	out, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// record returns the migrations record as "version name", in order.
func record(tb testing.TB, db *pgxpool.Pool, cfg claim.Config) []string {
	tb.Helper()
	_, rec := names(cfg)
	r, _ := db.Query(context.Background(), "SELECT version || ' ' || name FROM "+rec+" ORDER BY version")
	out, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// wantRecord is the record of a table that has had every migration.
func wantRecord(tb testing.TB) []string {
	tb.Helper()
	ms, err := claim.Migrations(claim.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	var out []string
	for _, m := range ms {
		out = append(out, fmt.Sprintf("%d %s", m.Version, m.Name))
	}
	return out
}

// describe returns what the catalog says of cfg's claim table and its
// migrations record: columns with types, nullability and defaults,
// constraints, indexes, and every record row with its applied_at. Two
// tables with the same description have the same shape.
func describe(tb testing.TB, db *pgxpool.Pool, cfg claim.Config) string {
	tb.Helper()
	var b strings.Builder
	table, rec := names(cfg)
	events := strings.TrimSuffix(rec, `_migrations"`) + `_events"`
	for _, tbl := range []string{table, events, rec} {
		for _, q := range []string{
			`SELECT format('column %s %s%s%s', attname, format_type(atttypid, atttypmod),
				CASE WHEN attnotnull THEN ' NOT NULL' ELSE '' END,
				coalesce(' DEFAULT ' || pg_get_expr(adbin, adrelid), ''))
			FROM pg_attribute LEFT JOIN pg_attrdef ON adrelid = attrelid AND adnum = attnum
			WHERE attrelid = to_regclass($1) AND attnum > 0 AND NOT attisdropped ORDER BY attnum`,
			`SELECT format('constraint %s %s', conname, pg_get_constraintdef(oid))
			FROM pg_constraint WHERE conrelid = to_regclass($1) ORDER BY conname`,
			`SELECT 'index ' || pg_get_indexdef(indexrelid) FROM pg_index
			WHERE indrelid = to_regclass($1) ORDER BY indexrelid::regclass::text`,
		} {
			r, _ := db.Query(context.Background(), q, tbl)
			lines, err := pgx.CollectRows(r, pgx.RowTo[string])
			if err != nil {
				tb.Fatal(err)
			}
			for _, l := range lines {
				b.WriteString(tbl + " " + l + "\n")
			}
		}
	}
	if exists(tb, db, rec) {
		r, _ := db.Query(context.Background(), "SELECT (r.*)::text FROM "+rec+" r ORDER BY version")
		lines, err := pgx.CollectRows(r, pgx.RowTo[string])
		if err != nil {
			tb.Fatal(err)
		}
		b.WriteString("record " + strings.Join(lines, " ") + "\n")
	}
	return b.String()
}

func exists(tb testing.TB, db *pgxpool.Pool, table string) bool {
	tb.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		tb.Fatal(err)
	}
	return ok
}

func migrate(tb testing.TB, db *pgxpool.Pool, cfg claim.Config) *claim.Postgres {
	tb.Helper()
	s, err := claim.NewPostgres(db, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatalf("Migrate(%+v): %v", cfg, err)
	}
	return s
}

// freshShape returns the description of cfg's tables as Migrate creates
// them in an empty database, without the record's times.
func freshShape(tb testing.TB, cfg claim.Config) string {
	tb.Helper()
	pool := pgtest.Pool(tb)
	migrate(tb, pool, cfg)
	return shape(describe(tb, pool, cfg))
}

// shape drops the record line from a description.
func shape(desc string) string {
	i := strings.Index(desc, "record ")
	if i < 0 {
		return desc
	}
	return desc[:i]
}

// A table created by a released v1 billonce is upgraded in place: its rows
// are intact, the new columns hold their "unknown" values, each key's window
// starts when its claim was made, and a second Migrate changes nothing.
func TestMigrateUpgradesV1TableInPlace(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			createV1(t, pool, cfg)
			before := rows(t, pool, cfg, v1Columns)

			s := migrate(t, pool, cfg)
			if after := rows(t, pool, cfg, v1Columns); !slices.Equal(after, before) {
				t.Errorf("rows changed by the upgrade:\nbefore %q\nafter  %q", before, after)
			}
			got := rows(t, pool, cfg, "key, scope, attempt, endpoint, credential, first_sent_at = created_at, reconciled_at IS NULL")
			want := []string{`(k_fail,"",0,"","",t,t)`, `(k_ok,"",0,"","",t,t)`, `(k_pending,"",0,"","",t,t)`}
			if !slices.Equal(got, want) {
				t.Errorf("new columns = %q, want %q", got, want)
			}
			if got, want := record(t, pool, cfg), wantRecord(t); !slices.Equal(got, want) {
				t.Errorf("record = %q, want %q", got, want)
			}
			upgraded := describe(t, pool, cfg)
			if fresh := freshShape(t, cfg); shape(upgraded) != fresh {
				t.Errorf("the upgraded table differs from a new one:\nupgraded:\n%s\nnew:\n%s", shape(upgraded), fresh)
			}

			all := rows(t, pool, cfg, "xmin, t.*") // xmin changes if a row is rewritten
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("second Migrate: %v", err)
			}
			if again := describe(t, pool, cfg); again != upgraded {
				t.Errorf("second Migrate changed the tables:\nbefore:\n%s\nafter:\n%s", upgraded, again)
			}
			if again := rows(t, pool, cfg, "xmin, t.*"); !slices.Equal(again, all) {
				t.Errorf("second Migrate changed rows:\nbefore %q\nafter  %q", all, again)
			}

			// The store works on the upgraded table: the crashed claim is
			// resumed with its key, the others keep their outcomes.
			pending := claimengine.Request{Customer: "cus_1", Period: "2025-01", Key: "k_pending", Amount: 4200, Currency: "usd", Owner: "pod-c"}
			if res := mustClaim(t, engineOf(s), pending, claimengine.Resumed); res.Claim.Leases != 3 {
				t.Errorf("resumed claim has %d attempts, want 3", res.Claim.Leases)
			}
			ok := claimengine.Request{Customer: "cus_2", Period: "2025-01", Key: "k_ok", Amount: 1500, Currency: "eur", Owner: "pod-c"}
			if res := mustClaim(t, engineOf(s), ok, claimengine.Succeeded); res.Claim.StripeID != "ch_1" {
				t.Errorf("succeeded claim has Stripe id %q, want ch_1", res.Claim.StripeID)
			}
			mustClaim(t, engineOf(s), claimengine.Request{Customer: "cus_3", Period: "2025-01", Key: "k_fail", Amount: 900, Currency: "usd", Owner: "pod-c"}, claimengine.Failed)
			mustClaim(t, engineOf(s), req("cus_4", "k_new", "pod-c"), claimengine.Won)
		})
	}
}

// On an empty database Migrate creates the schema, the claim table with
// every column, its indexes and checks, and the record; twice is the same
// as once.
func TestMigrateEmptyDatabaseAndTwice(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			s := migrate(t, pool, cfg)
			table, _ := names(cfg)
			once := describe(t, pool, cfg)
			for _, want := range []string{
				"column key text NOT NULL\n",
				"column scope text NOT NULL DEFAULT ''::text\n",
				"column attempt integer NOT NULL DEFAULT 0\n",
				"column endpoint text NOT NULL DEFAULT ''::text\n",
				"column credential text NOT NULL DEFAULT ''::text\n",
				"column first_sent_at timestamp with time zone NOT NULL DEFAULT now()\n",
				"column reconciled_at timestamp with time zone\n",
				"constraint scope_length CHECK ((length(scope) <= 255))\n",
				"constraint attempt_not_negative CHECK ((attempt >= 0))\n",
				"constraint endpoint_length CHECK ((length(endpoint) <= 255))\n",
				"constraint credential_length CHECK ((length(credential) <= 255))\n",
				"USING btree (customer, period) WHERE (state <> 'failed'::text)\n",
				"USING btree (key) WHERE (state = 'pending'::text)\n",
				"column version integer NOT NULL\n",
				"column applied_at timestamp with time zone NOT NULL DEFAULT now()\n",
			} {
				if !strings.Contains(once, want) {
					t.Errorf("tables lack %q:\n%s", want, once)
				}
			}
			if !strings.HasPrefix(once, table+" column key text") {
				t.Errorf("the claim table %s is not described first:\n%s", table, once)
			}
			if got, want := record(t, pool, cfg), wantRecord(t); !slices.Equal(got, want) {
				t.Errorf("record = %q, want %q", got, want)
			}
			if err := s.Migrate(context.Background()); err != nil {
				t.Fatalf("second Migrate: %v", err)
			}
			if twice := describe(t, pool, cfg); twice != once {
				t.Errorf("second Migrate changed the tables:\nonce:\n%s\ntwice:\n%s", once, twice)
			}
			mustClaim(t, engineOf(s), req("cus_1", "k1", "a"), claimengine.Won)
		})
	}
}

// A record listing a version this binary does not know means a newer
// billonce migrated the table: Migrate refuses and changes nothing, not
// even the migrations this binary knows and the record lacks.
func TestMigrateRefusesNewerSchema(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			createV1(t, pool, cfg)
			_, rec := names(cfg)
			if _, err := pool.Exec(ctx, "CREATE TABLE "+rec+" (version integer PRIMARY KEY, name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now());"+
				"INSERT INTO "+rec+" (version, name) VALUES (1, 'create'), (99, 'from_the_future')"); err != nil {
				t.Fatal(err)
			}
			before := describe(t, pool, cfg)
			s, err := claim.NewPostgres(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			err = s.Migrate(ctx)
			if !errors.Is(err, claim.ErrNewerSchema) {
				t.Fatalf("Migrate = %v, want ErrNewerSchema", err)
			}
			if msg := err.Error(); !strings.Contains(msg, "version 99") || !strings.Contains(msg, "upgrade this binary") || !strings.Contains(msg, rec) {
				t.Errorf("error %q does not name the table, the version and the fix", msg)
			}
			if after := describe(t, pool, cfg); after != before {
				t.Errorf("refused Migrate changed the tables:\nbefore:\n%s\nafter:\n%s", before, after)
			}
		})
	}
}

// Teams with their own migration tool apply Migrations' SQL with a plain
// Exec each, as goose or golang-migrate would (twice: it is idempotent);
// each lists itself in the record, so Migrate afterwards finds nothing to
// do and changes nothing, not even the record.
func TestMigrationsAppliedByToolThenMigrate(t *testing.T) {
	t.Parallel()
	for _, cfg := range append(migrateConfigs, claim.Config{Schema: "ops", Table: "charges_claimed"}) {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			ms, err := claim.Migrations(cfg)
			if err != nil {
				t.Fatal(err)
			}
			for i, m := range ms {
				if m.Version != i+1 || m.Name == "" {
					t.Errorf("migration %d is %d %q, want version %d and a name", i, m.Version, m.Name, i+1)
				}
				if strings.Contains(m.SQL, "{{") {
					t.Errorf("migration %d keeps a placeholder:\n%s", m.Version, m.SQL)
				}
				if hasSchema := strings.Contains(m.SQL, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{cfg.Schema}.Sanitize()+";"); hasSchema != (i == 0 && cfg.Schema != "") {
					t.Errorf("migration %d creates the schema: %v, want %v", m.Version, hasSchema, !hasSchema)
				}
			}
			table, _ := names(cfg)
			if cfg == (claim.Config{}) { // the files name the defaults unquoted
				table = claim.DefaultTable
			}
			if !strings.Contains(ms[0].SQL, "CREATE TABLE IF NOT EXISTS "+table+" (") {
				t.Errorf("migration 1 does not create %s:\n%s", table, ms[0].SQL)
			}

			pool := pgtest.Pool(t)
			for range 2 {
				for _, m := range ms {
					if _, err := pool.Exec(ctx, m.SQL); err != nil {
						t.Fatalf("applying migration %d (%s): %v", m.Version, m.Name, err)
					}
				}
			}
			if got, want := record(t, pool, cfg), wantRecord(t); !slices.Equal(got, want) {
				t.Errorf("record after the tool = %q, want %q", got, want)
			}
			byTool := describe(t, pool, cfg)
			s := migrate(t, pool, cfg)
			if after := describe(t, pool, cfg); after != byTool {
				t.Errorf("Migrate after the tool changed the tables:\nbefore:\n%s\nafter:\n%s", byTool, after)
			}
			if after, fresh := shape(byTool), freshShape(t, cfg); after != fresh {
				t.Errorf("the tool's table differs from Migrate's:\ntool:\n%s\nMigrate:\n%s", after, fresh)
			}
			mustClaim(t, engineOf(s), req("cus_1", "k1", "a"), claimengine.Won)
		})
	}
	if _, err := claim.Migrations(claim.Config{Table: "x y"}); !errors.Is(err, claim.ErrInvalid) {
		t.Errorf("Migrations with a bad table = %v, want ErrInvalid", err)
	}
}

// A released migration never changes: the first creates the table v1
// created, statement for statement, and then only the migrations record
// that lists it.
func TestFirstMigrationIsTheV1Table(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		ms, err := claim.Migrations(cfg)
		if err != nil {
			t.Fatal(err)
		}
		want := statements(v1SQL(t, cfg))
		_, rec := names(cfg)
		if cfg == (claim.Config{}) { // the files name the defaults unquoted
			want, rec = strings.ReplaceAll(want, `"`, ""), strings.ReplaceAll(rec, `"`, "")
		}
		if cfg.Schema != "" {
			want = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{cfg.Schema}.Sanitize() + ";\n" + want
		}
		got := statements(ms[0].SQL)
		rest, ok := strings.CutPrefix(got, want)
		if !ok {
			t.Errorf("migration 1 for %+v differs from testdata/claim_v1_schema.sql:\n%s", cfg, ms[0].SQL)
			continue
		}
		for stmt := range strings.SplitSeq(strings.TrimSpace(rest), ";\n") {
			if !strings.Contains(stmt, " "+rec+" (") {
				t.Errorf("migration 1 for %+v does more than v1 and its record: %s", cfg, stmt)
			}
		}
	}
}

// statements returns sql without its comment lines and blank lines.
func statements(sql string) string {
	var b strings.Builder
	for l := range strings.Lines(sql) {
		if t := strings.TrimSpace(l); t != "" && !strings.HasPrefix(t, "--") {
			b.WriteString(l)
		}
	}
	return b.String()
}

// Migration 3 on a table with rows: they keep their states and get the
// "nothing known" settlement values; the state check now takes processing
// (with a payment) and still refuses anything else.
func TestMigrationSettlementUpgradesRows(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			createV1(t, pool, cfg)
			s := migrate(t, pool, cfg)
			got := rows(t, pool, cfg, "key, state, processing_at IS NULL, settled_at IS NULL, failure_code, refunded, dispute, event_at IS NULL")
			want := []string{`(k_fail,failed,t,t,"",0,"",t)`, `(k_ok,succeeded,t,t,"",0,"",t)`, `(k_pending,pending,t,t,"",0,"",t)`}
			if !slices.Equal(got, want) {
				t.Errorf("settlement columns = %q, want %q", got, want)
			}
			table, _ := names(cfg)
			if _, err := pool.Exec(ctx, "UPDATE "+table+" SET state = 'settled' WHERE key = 'k_pending'"); err == nil {
				t.Error("an unknown state was accepted")
			}
			if _, err := pool.Exec(ctx, "UPDATE "+table+" SET state = 'processing' WHERE key = 'k_pending'"); err == nil {
				t.Error("a processing claim without a payment was accepted")
			}
			if err := engineOf(s).Process(ctx, "k_pending", "py_1"); err != nil {
				t.Fatalf("Process on the upgraded table: %v", err)
			}
			mustClaim(t, engineOf(s), claimengine.Request{Customer: "cus_1", Period: "2025-01", Key: "k_pending", Amount: 4200, Currency: "usd", Owner: "pod-c"}, claimengine.Processing)
		})
	}
}
