package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/fstest"

	"github.com/billonce/billonce/internal/migrate"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// steps are migrations that fail if applied twice (no IF NOT EXISTS), so
// a test that runs them sees any double application as an error.
var steps = []migrate.Migration{
	{Version: 1, Name: "create", SQL: "CREATE TABLE {{t}} (id integer PRIMARY KEY);\nINSERT INTO {{t}} VALUES (1);"},
	{Version: 2, Name: "note", SQL: "ALTER TABLE {{t}} ADD COLUMN note text NOT NULL DEFAULT 'two';\nUPDATE {{t}} SET id = id + 1;"},
}

// set returns a Set of steps on table "things" (and record
// "things_migrations") in schema, with the first n steps.
func set(schema string, n int) migrate.Set {
	table := migrate.Names{Default: "things", Schema: schema}.Table("")
	ms := slices.Clone(steps[:n])
	for i := range ms {
		ms[i].SQL = strings.ReplaceAll(ms[i].SQL, "{{t}}", table)
	}
	return migrate.Set{Owner: "things", Schema: schema, Record: "things_migrations", Lock: 42, Migrations: ms}
}

func run(tb testing.TB, db migrate.Beginner, s migrate.Set) {
	tb.Helper()
	if err := s.Run(context.Background(), db); err != nil {
		tb.Fatalf("Run: %v", err)
	}
}

func query(tb testing.TB, db *pgxpool.Pool, sql string) []string {
	tb.Helper()
	r, _ := db.Query(context.Background(), sql)
	out, err := pgx.CollectRows(r, pgx.RowTo[string])
	if err != nil {
		tb.Fatal(err)
	}
	return out
}

// state returns the table's rows and the record's, times and xmin
// included: it changes if anything is written.
func state(tb testing.TB, db *pgxpool.Pool, s migrate.Set) []string {
	tb.Helper()
	n := migrate.Names{Default: "things", Schema: s.Schema}
	var out []string
	for _, t := range []string{n.Table(""), n.Table("_migrations")} {
		if exists(tb, db, t) {
			out = append(out, query(tb, db, "SELECT xmin::text || ' ' || (r.*)::text FROM "+t+" r ORDER BY 1")...)
		}
	}
	return out
}

func exists(tb testing.TB, db *pgxpool.Pool, table string) bool {
	tb.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), "SELECT to_regclass($1) IS NOT NULL", table).Scan(&ok); err != nil {
		tb.Fatal(err)
	}
	return ok
}

func record(tb testing.TB, db *pgxpool.Pool, s migrate.Set) []string {
	tb.Helper()
	return query(tb, db, "SELECT version || ' ' || name FROM "+migrate.Names{Default: s.Record, Schema: s.Schema}.Table("")+" ORDER BY version")
}

// The schemas every run test takes: the search_path, and a named one
// that only survives correct quoting.
var schemas = []string{"", "Billing"}

// On an empty database Run creates the schema and the record and applies
// every step once; a later release's steps are applied on their own; a run
// with nothing to do writes nothing.
func TestRunAppliesEachStepOnce(t *testing.T) {
	for _, schema := range schemas {
		t.Run(fmt.Sprintf("schema %q", schema), func(t *testing.T) {
			t.Parallel()
			pool := pgtest.Pool(t)
			run(t, pool, set(schema, 1))
			if got, want := record(t, pool, set(schema, 1)), []string{"1 create"}; !slices.Equal(got, want) {
				t.Errorf("record = %q, want %q", got, want)
			}
			run(t, pool, set(schema, 2)) // step 1 again would fail: the table exists
			if got, want := record(t, pool, set(schema, 2)), []string{"1 create", "2 note"}; !slices.Equal(got, want) {
				t.Errorf("record = %q, want %q", got, want)
			}
			table := migrate.Names{Default: "things", Schema: schema}.Table("")
			if got, want := query(t, pool, "SELECT (t.*)::text FROM "+table+" t"), []string{"(2,two)"}; !slices.Equal(got, want) {
				t.Errorf("rows = %q, want %q", got, want)
			}
			before := state(t, pool, set(schema, 2))
			run(t, pool, set(schema, 2))
			if after := state(t, pool, set(schema, 2)); !slices.Equal(after, before) {
				t.Errorf("a run with nothing to do wrote:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// A step that fails leaves nothing behind: not the steps before it, not
// the record, not the schema.
func TestRunIsOneTransaction(t *testing.T) {
	pool := pgtest.Pool(t)
	s := set("ops", 2)
	s.Migrations[1].SQL = "ALTER TABLE nowhere ADD COLUMN x int;"
	err := s.Run(context.Background(), pool)
	if err == nil || !strings.Contains(err.Error(), "things: migrate: applying migration 2 (note)") {
		t.Fatalf("Run = %v, want the failure of migration 2", err)
	}
	if got := query(t, pool, "SELECT nspname::text FROM pg_namespace WHERE nspname = 'ops'"); len(got) != 0 {
		t.Errorf("the schema outlived the failed run")
	}
	if exists(t, pool, `"ops"."things"`) {
		t.Errorf("migration 1 outlived the failed run")
	}
	run(t, pool, set("ops", 2))
}

// Every replica runs at start-up, at once, each with its own pool: no
// error, each step applied and recorded once, whatever the database's
// default isolation level.
func TestRunConcurrentReplicas(t *testing.T) {
	for _, isolation := range []string{"", "serializable", "repeatable read"} {
		for _, schema := range schemas {
			t.Run(fmt.Sprintf("%q schema %q", isolation, schema), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				url := pgtest.URL(t)
				admin := newPool(t, url)
				if isolation != "" {
					if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{admin.Config().ConnConfig.Database}.Sanitize()+
						" SET default_transaction_isolation = '"+isolation+"'"); err != nil {
						t.Fatal(err)
					}
					admin.Reset() // new connections take the setting
				}
				const replicas = 8
				pools := make([]*pgxpool.Pool, replicas)
				for i := range pools {
					pools[i] = newPool(t, url)
					if err := pools[i].Ping(ctx); err != nil { // connect before the start line
						t.Fatal(err)
					}
				}
				start := make(chan struct{})
				errs := make([]error, replicas)
				var wg sync.WaitGroup
				for i, p := range pools {
					wg.Go(func() {
						<-start
						errs[i] = set(schema, 2).Run(ctx, p)
					})
				}
				close(start)
				wg.Wait()
				for i, err := range errs {
					if err != nil {
						t.Errorf("replica %d: Run: %v", i, err)
					}
				}
				if got, want := record(t, admin, set(schema, 2)), []string{"1 create", "2 note"}; !slices.Equal(got, want) {
					t.Errorf("record = %q, want %q", got, want)
				}
			})
		}
	}
}

// A record listing a version the set does not know means a newer billonce
// migrated the tables: Run refuses and changes nothing, not even the steps
// it knows and the record lacks.
func TestRunRefusesNewerRecord(t *testing.T) {
	for _, schema := range schemas {
		t.Run(fmt.Sprintf("schema %q", schema), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			run(t, pool, set(schema, 1))
			rec := migrate.Names{Default: "things_migrations", Schema: schema}.Table("")
			if _, err := pool.Exec(ctx, "INSERT INTO "+rec+" (version, name) VALUES (99, 'from_the_future')"); err != nil {
				t.Fatal(err)
			}
			before := state(t, pool, set(schema, 2))
			err := set(schema, 2).Run(ctx, pool)
			if !errors.Is(err, migrate.ErrNewerSchema) {
				t.Fatalf("Run = %v, want ErrNewerSchema", err)
			}
			if msg := err.Error(); !strings.HasPrefix(msg, "things: ") || !strings.Contains(msg, "version 99") ||
				!strings.Contains(msg, "upgrade this binary") || !strings.Contains(msg, rec) {
				t.Errorf("error %q does not name the owner, the table, the version and the fix", msg)
			}
			if after := state(t, pool, set(schema, 2)); !slices.Equal(after, before) {
				t.Errorf("refused run changed the tables:\nbefore %q\nafter  %q", before, after)
			}
		})
	}
}

// Once the tables are up to date, Run only reads the record: the
// application's role, which may neither create anything nor write the
// record, can run it at start-up after the tables' owner has.
func TestRunUpToDateNeedsNoCreatePrivilege(t *testing.T) {
	for _, schema := range schemas {
		t.Run(fmt.Sprintf("schema %q", schema), func(t *testing.T) {
			t.Parallel()
			url := pgtest.URL(t)
			admin := newPool(t, url)
			run(t, admin, set(schema, 2))
			rec := migrate.Names{Default: "things_migrations", Schema: schema}.Table("")
			app := readOnlyRole(t, admin, url, schema, rec)
			run(t, app, set(schema, 2))
			if err := set(schema, 1).Run(context.Background(), app); !errors.Is(err, migrate.ErrNewerSchema) {
				t.Errorf("Run of an older set as the application = %v, want ErrNewerSchema", err)
			}
		})
	}
}

// Rename puts the configured names in place of the defaults: tables
// quoted and schema-qualified, indexes and constraints quoted only, and
// nothing else touched.
func TestRename(t *testing.T) {
	ms := []migrate.Migration{{Version: 1, Name: "create", SQL: `-- billonce_x holds things
CREATE TABLE IF NOT EXISTS billonce_x (id int CONSTRAINT billonce_x_id CHECK (id > 0));
CREATE INDEX IF NOT EXISTS billonce_x_by_id ON billonce_x (id);
DROP INDEX IF EXISTS billonce_x_by_id;
drop index billonce_x_by_id;
INSERT INTO billonce_x_migrations VALUES (1, 'create'); -- not_billonce_x, 'billonce_xylophone_is_not_here'
`}}
	names := migrate.Names{Default: "billonce_x", Tables: []string{"", "_migrations"}, Others: []string{"_id", "_by_id"}}
	if got := migrate.Rename(ms, names); !slices.Equal(got, ms) {
		t.Errorf("default names: Rename changed the SQL:\n%s", got[0].SQL)
	}
	names.Name, names.Schema = "Things", "Ops"
	ms[0].SQL = strings.Replace(ms[0].SQL, ", 'billonce_xylophone_is_not_here'", "", 1)
	want := `-- "Ops"."Things" holds things
CREATE TABLE IF NOT EXISTS "Ops"."Things" (id int CONSTRAINT "Things_id" CHECK (id > 0));
CREATE INDEX IF NOT EXISTS "Things_by_id" ON "Ops"."Things" (id);
DROP INDEX IF EXISTS "Ops"."Things_by_id";
drop index "Ops"."Things_by_id";
INSERT INTO "Ops"."Things_migrations" VALUES (1, 'create'); -- not_billonce_x
`
	got := migrate.Rename(ms, names)
	if got[0].SQL != want {
		t.Errorf("Rename =\n%s\nwant\n%s", got[0].SQL, want)
	}
	if ms[0].SQL == want {
		t.Error("Rename changed its argument")
	}
	names.Others = names.Others[1:]
	if !panics(func() { migrate.Rename(ms, names) }) {
		t.Error("Rename of an undeclared suffix (_id) did not panic")
	}
}

// Load reads NNNN_name.sql files in version order and refuses anything
// else.
func TestLoad(t *testing.T) {
	fsys := fstest.MapFS{
		"m/0002_two.sql": {Data: []byte("SELECT 2;")},
		"m/0001_one.sql": {Data: []byte("SELECT 1;")},
	}
	got := migrate.Load(fsys, "m")
	want := []migrate.Migration{{Version: 1, Name: "one", SQL: "SELECT 1;"}, {Version: 2, Name: "two", SQL: "SELECT 2;"}}
	if !slices.Equal(got, want) {
		t.Errorf("Load = %+v, want %+v", got, want)
	}
	for name, fsys := range map[string]fstest.MapFS{
		"misnamed": {"m/0001_One.sql": {}},
		"gap":      {"m/0001_one.sql": {}, "m/0003_three.sql": {}},
		"from 0":   {"m/0000_zero.sql": {}},
		"no dir":   {},
	} {
		if !panics(func() { migrate.Load(fsys, "m") }) {
			t.Errorf("%s: Load did not panic", name)
		}
	}
}

func panics(f func()) (p bool) {
	defer func() { p = recover() != nil }()
	f()
	return false
}

func newPool(tb testing.TB, url string) *pgxpool.Pool {
	tb.Helper()
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(pool.Close)
	return pool
}

// readOnlyRole makes a role that may use schema ("" for public) and read
// the record rec and nothing else, and returns a pool that logs in as it.
// grants are further GRANT statements' "privileges ON table" parts.
func readOnlyRole(tb testing.TB, admin *pgxpool.Pool, url, schema, rec string, grants ...string) *pgxpool.Pool {
	tb.Helper()
	ctx := context.Background()
	name := admin.Config().ConnConfig.Database + "_app"
	role := pgx.Identifier{name}.Sanitize()
	nsp := "public"
	if schema != "" {
		nsp = pgx.Identifier{schema}.Sanitize()
	}
	sql := "CREATE ROLE " + role + " LOGIN PASSWORD 'app';" +
		"REVOKE CREATE ON SCHEMA public FROM PUBLIC;" +
		"GRANT USAGE ON SCHEMA " + nsp + " TO " + role + ";" +
		"GRANT SELECT ON " + rec + " TO " + role + ";"
	for _, g := range grants {
		sql += "GRANT " + g + " TO " + role + ";"
	}
	if _, err := admin.Exec(ctx, sql); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role); err != nil {
			tb.Error(err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		tb.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, "app"
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(app.Close)
	if _, err := app.Exec(ctx, "CREATE TABLE "+nsp+".probe (i int)"); err == nil {
		tb.Fatal("the application's role may create tables; the test proves nothing")
	}
	if _, err := app.Exec(ctx, "INSERT INTO "+rec+" (version, name) VALUES (1000, 'probe')"); err == nil {
		tb.Fatal("the application's role may write the record; the test proves nothing")
	}
	return app
}
