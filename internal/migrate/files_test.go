package migrate_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/migrate"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

// psql returns the path of the psql binary: on PATH, or beside initdb.
func psql(tb testing.TB) string {
	tb.Helper()
	if p, err := exec.LookPath("psql"); err == nil {
		return p
	}
	var dirs []string
	if p, err := exec.LookPath("initdb"); err == nil {
		dirs = append(dirs, filepath.Dir(p))
		if r, err := filepath.EvalSymlinks(p); err == nil {
			dirs = append(dirs, filepath.Dir(r))
		}
	}
	more, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for _, d := range append(dirs, more...) {
		if _, err := os.Stat(filepath.Join(d, "psql")); err == nil {
			return filepath.Join(d, "psql")
		}
	}
	tb.Fatal("psql not found on PATH or beside initdb: install the PostgreSQL client")
	return ""
}

// The tables billonce owns, each with its migration files, its record
// and its Migrate.
var owners = []struct {
	name   string
	dir    string   // the migration files, from this package
	record string   // the record table
	embed  []string // the SQL the package serves for the default names, if it serves any
	// migrate runs the owner's Migrate on db.
	migrate func(ctx context.Context, db *pgxpool.Pool) error
	// use exercises the tables as the application's role, with grants,
	// after Migrate.
	grants []string
	use    func(ctx context.Context, db *pgxpool.Pool) error
}{
	{
		name:   "claim",
		dir:    "../../claim/migrations",
		record: "billonce_claims_migrations",
		embed:  sqlOf(must(claim.Migrations(claim.Config{}))),
		migrate: func(ctx context.Context, db *pgxpool.Pool) error {
			return must(claim.NewPostgres(db, claim.Config{})).Migrate(ctx)
		},
		grants: []string{"SELECT, INSERT, UPDATE ON billonce_claims"},
		use: func(ctx context.Context, db *pgxpool.Pool) error {
			_, err := claimengine.Of[claim.Claim](must(claim.NewPostgres(db, claim.Config{}))).Claim(ctx, claimengine.Request{
				Customer: "cus_1", Period: "2025-01", Key: "k1", Amount: 100, Currency: "usd", Owner: "a"})
			return err
		},
	},
	{
		name:   "spendcap",
		dir:    "../../billing/spendcap/migrations",
		record: "spendcap_migrations",
		embed:  sqlOf(spendcap.Migrations()),
		migrate: func(ctx context.Context, db *pgxpool.Pool) error {
			return must(spendcap.NewPostgresStore(db)).Migrate(ctx)
		},
	},
	{
		name:   "lock",
		dir:    "../../lock/migrations",
		record: "billonce_lock_leases_migrations",
		migrate: func(ctx context.Context, db *pgxpool.Pool) error {
			return must(lock.NewLease(db, lock.LeaseConfig{})).Migrate(ctx)
		},
		grants: []string{"SELECT, INSERT, UPDATE, DELETE ON billonce_lock_leases"},
		use: func(ctx context.Context, db *pgxpool.Pool) error {
			ran, err := lock.Do(ctx, must(lock.NewLease(db, lock.LeaseConfig{})), "job", func(context.Context) error { return nil })
			if err == nil && !ran {
				err = errors.New("the job did not run")
			}
			return err
		},
	},
}

// The migration files apply unchanged, in order, with psql (twice: they
// are idempotent), and list themselves in the record. Migrate then finds
// nothing to do: it succeeds as a role that can neither create anything
// nor write the record, and the record is as psql left it.
func TestFilesApplyWithPsqlThenMigrateFindsNothingToDo(t *testing.T) {
	bin := psql(t)
	for _, o := range owners {
		t.Run(o.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			files, err := filepath.Glob(filepath.Join(o.dir, "*.sql"))
			if err != nil || len(files) == 0 {
				t.Fatalf("no migration files in %s: %v", o.dir, err)
			}
			var want []string // the record psql should leave: "version name"
			for i, f := range files {
				b, err := os.ReadFile(f)
				if err != nil {
					t.Fatal(err)
				}
				if strings.Contains(string(b), "{{") || strings.Contains(string(b), "%s") {
					t.Errorf("%s holds template text", f)
				}
				if o.embed != nil && (i >= len(o.embed) || o.embed[i] != string(b)) {
					t.Errorf("%s is not what the package serves for the default names", f)
				}
				m := migrate.Load(os.DirFS(o.dir), ".")[i]
				want = append(want, fmt.Sprintf("%d %s", m.Version, m.Name))
			}
			if first, _ := os.ReadFile(files[0]); !strings.Contains(string(first), "CREATE TABLE IF NOT EXISTS "+o.record+" ("+migrate.RecordColumns+");\n") {
				t.Errorf("%s does not create %s as Run does", files[0], o.record)
			}

			url := pgtest.URL(t)
			for range 2 {
				for _, f := range files {
					out, err := exec.CommandContext(ctx, bin, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-d", url, "-f", f).CombinedOutput()
					if err != nil {
						t.Fatalf("psql -f %s: %v\n%s", f, err, out)
					}
				}
			}
			admin := newPool(t, url)
			byPsql := query(t, admin, "SELECT xmin::text || ' ' || (r.*)::text FROM "+o.record+" r ORDER BY version")
			if got := query(t, admin, "SELECT version || ' ' || name FROM "+o.record+" ORDER BY version"); !slices.Equal(got, want) {
				t.Errorf("record after psql = %q, want %q", got, want)
			}

			app := readOnlyRole(t, admin, url, "", o.record, o.grants...)
			if err := o.migrate(ctx, app); err != nil {
				t.Fatalf("Migrate after psql: %v", err)
			}
			if err := o.migrate(ctx, admin); err != nil {
				t.Fatalf("Migrate after psql, as the tables' owner: %v", err)
			}
			if after := query(t, admin, "SELECT xmin::text || ' ' || (r.*)::text FROM "+o.record+" r ORDER BY version"); !slices.Equal(after, byPsql) {
				t.Errorf("Migrate after psql changed the record:\nbefore %q\nafter  %q", byPsql, after)
			}
			if o.use != nil {
				if err := o.use(ctx, app); err != nil {
					t.Errorf("the application's role cannot use the tables psql made: %v", err)
				}
			}
		})
	}
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func sqlOf[M ~struct {
	Version int
	Name    string
	SQL     string
}](ms []M) []string {
	var out []string
	for _, m := range ms {
		out = append(out, migrate.Migration(m).SQL)
	}
	return out
}
