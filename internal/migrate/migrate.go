// Package migrate applies the numbered SQL migrations of the tables
// billonce owns: the claim table and its events (package claim), the
// spend-cap budgets (package spendcap) and the lock's lease table (package
// lock). Each owner embeds its migrations/NNNN_name.sql files, loads them
// with [Load], names its tables with [Rename] and calls [Set.Run] from its
// Migrate.
//
// # The files
//
// The files are plain SQL for the default names (billonce_claims,
// spendcap_keys, billonce_lock_leases, in the connection's search_path):
// `psql -v ON_ERROR_STOP=1 -f` applies them unchanged, in order, and goose
// or golang-migrate take each file's text as a migration of theirs. Each
// statement is idempotent and ends its line with a semicolon, none is
// dollar-quoted, so tools that split a file on semicolons take it as it
// is. Every file records its own version in the
// owner's record table (the first creates the record), so a database
// migrated by a tool is one [Set.Run] finds up to date.
//
// Custom names are rendered from the files by [Rename]: each identifier
// that starts with the owner's default name is replaced by the configured
// name with the same suffix, quoted, and schema-qualified if it names a
// table. An identifier with a suffix the owner did not declare makes
// Rename panic, so a file cannot slip a name past the renaming.
//
// # The run
//
// [Set.Run] works in one transaction at READ COMMITTED, under a
// transaction advisory lock, so every replica may call it at start-up at
// once: the first applies what is missing, the others wait for it and
// find nothing to do. With no schema set it migrates the schema where the
// search_path finds the owner's table (or its record), never an empty
// twin created in front of it. It reads the record table (version, name,
// applied_at) and applies, in order, each migration the record lacks,
// recording it. A record that lists a version newer than the set knows
// is refused with [ErrNewerSchema], and nothing changes. Once the tables
// are up to date Run only reads: a role without CREATE privileges (or
// INSERT on the record) can call it.
//
// A migration that needs an extension says so on a line of its own,
// "CREATE EXTENSION IF NOT EXISTS name;". Run creates each such extension
// on its own before the migration's other statements: an extension the
// database has asks for no privilege, and one that cannot be created
// (the role may not, the server does not have it) stops the run with an
// error that names it and says what to do, PostgreSQL's hint included,
// and nothing changes.
package migrate

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// A Migration is one step of an owner's schema. Migrations are applied in
// Version order, each once; a released migration never changes, and later
// versions of billonce only add new ones.
type Migration struct {
	Version int    // 1, 2, ...
	Name    string // what the step does, from its file name: "create", "identity"
	// SQL is the step: several idempotent statements, run in one
	// transaction.
	SQL string
}

// ErrNewerSchema is returned when the record lists a version this binary
// does not know: a newer billonce migrated the tables. Nothing was changed.
var ErrNewerSchema = errors.New("the tables were migrated by a newer billonce; upgrade this binary")

var fileRE = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.sql$`)

// Load reads the migrations in dir of fsys, files named NNNN_name.sql with
// NNNN the version, in version order. The files are built into the
// binary, so a misnamed or misnumbered one is a bug that every test
// catches: Load panics then.
func Load(fsys fs.FS, dir string) []Migration {
	entries, err := fs.ReadDir(fsys, dir) // sorted by name, so by version
	if err != nil {
		panic(err)
	}
	var ms []Migration
	for _, e := range entries {
		m := fileRE.FindStringSubmatch(e.Name())
		if m == nil {
			panic(fmt.Sprintf("migrate: migration file %q is not named NNNN_name.sql", e.Name()))
		}
		v, _ := strconv.Atoi(m[1])
		if v != len(ms)+1 {
			panic(fmt.Sprintf("migrate: migration file %q has version %d, want %d: versions start at 1 without gaps", e.Name(), v, len(ms)+1))
		}
		sql, err := fs.ReadFile(fsys, path.Join(dir, e.Name()))
		if err != nil {
			panic(err)
		}
		ms = append(ms, Migration{Version: v, Name: m[2], SQL: string(sql)})
	}
	return ms
}

// Names says how an owner's files name things and how this use of them
// does.
type Names struct {
	// Default is the prefix every identifier of the files starts with:
	// "billonce_claims".
	Default string
	// Tables are the suffixes that name tables, "" for Default itself:
	// they are schema-qualified when Schema is set.
	Tables []string
	// Others are the suffixes that name indexes and constraints, which
	// PostgreSQL keeps in their table's schema.
	Others []string

	// Name replaces Default. Empty means Default.
	Name string
	// Schema holds the tables. Empty means the connection's search_path.
	Schema string
}

// Rename returns ms with n's names in place of the defaults, quoted. With
// the default name and no schema it returns ms unchanged. An index that a
// DROP INDEX names is schema-qualified, as the statement needs to find
// the index of this table and not one of another schema's table of the
// same name. It panics on an identifier that starts with n.Default and
// has a suffix n does not list.
func Rename(ms []Migration, n Names) []Migration {
	if n.Name == "" {
		n.Name = n.Default
	}
	out := slices.Clone(ms)
	if n.Name == n.Default && n.Schema == "" {
		return out
	}
	re := regexp.MustCompile(`(?i:(\bDROP\s+INDEX\s+(?:IF\s+EXISTS\s+)?))?\b` + regexp.QuoteMeta(n.Default) + `\w*`)
	for i := range out {
		out[i].SQL = re.ReplaceAllStringFunc(out[i].SQL, func(m string) string {
			loc := re.FindStringSubmatchIndex(m)
			drop, id := m[:max(loc[3], 0)], m[max(loc[3], 0):]
			suffix := id[len(n.Default):]
			switch {
			case slices.Contains(n.Tables, suffix):
				return drop + n.Table(suffix)
			case slices.Contains(n.Others, suffix) && drop != "":
				return drop + n.Table(suffix)
			case slices.Contains(n.Others, suffix):
				return pgx.Identifier{n.Name + suffix}.Sanitize()
			}
			panic(fmt.Sprintf("migrate: migration %d (%s) names %s, which is neither a table nor an index or constraint of %s",
				out[i].Version, out[i].Name, id, n.Default))
		})
	}
	return out
}

// Table returns the quoted, schema-qualified if Schema is set, name of
// the table n.Name+suffix.
func (n Names) Table(suffix string) string {
	if n.Name == "" {
		n.Name = n.Default
	}
	if n.Schema != "" {
		return pgx.Identifier{n.Schema, n.Name + suffix}.Sanitize()
	}
	return pgx.Identifier{n.Name + suffix}.Sanitize()
}

// Beginner starts a transaction: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx
// (which makes a savepoint).
type Beginner interface {
	Begin(ctx context.Context) (pgx.Tx, error)
}

// A Set is the migrations of one owner's tables, ready to run.
type Set struct {
	// Owner begins every error message: "claim", "spendcap", "lock".
	Owner string
	// Schema holds the record table; Run creates it if it is missing.
	// Empty means the connection's search_path.
	Schema string
	// Record is the record table's name, unquoted, in Schema.
	Record string
	// Table is the owner's main table, unquoted, in Schema: with Schema
	// empty, the schema where the search_path finds it (or the record) is
	// the one Run migrates.
	Table string
	// Lock is the key of the transaction advisory lock Run holds. Each
	// owner keeps its key from release to release, so that binaries of
	// two releases migrating at once still wait for each other.
	Lock int64
	// Migrations are the steps, names in place, versions 1 to
	// len(Migrations).
	Migrations []Migration
}

// Run brings the tables up to date, as the package documentation says.
func (s Set) Run(ctx context.Context, db Beginner) error {
	record := Names{Default: s.Record, Schema: s.Schema}.Table("")
	tx, err := db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("%s: migrate: %w", s.Owner, err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// A transaction's snapshot may be taken when it asks for the lock,
	// before it waits; only READ COMMITTED reads the record as the run it
	// waited for left it.
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"); err != nil {
		return fmt.Errorf("%s: migrate: %w", s.Owner, err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", s.Lock); err != nil {
		return fmt.Errorf("%s: migrate: taking the migration lock: %w", s.Owner, err)
	}
	if s.Schema == "" {
		if err := s.pinSchema(ctx, tx, record); err != nil {
			return fmt.Errorf("%s: migrate: %w", s.Owner, err)
		}
	}
	if err := s.createRecord(ctx, tx, record); err != nil {
		return fmt.Errorf("%s: migrate: creating %s: %w", s.Owner, record, err)
	}
	rows, _ := tx.Query(ctx, "SELECT version FROM "+record)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("%s: migrate: reading %s: %w", s.Owner, record, err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		if int(v) > len(s.Migrations) {
			return fmt.Errorf("%s: migrate: %s lists version %d, and this binary knows versions 1 to %d (nothing was changed): %w",
				s.Owner, record, v, len(s.Migrations), ErrNewerSchema)
		}
		applied[int(v)] = true
	}
	for _, m := range s.Migrations {
		if applied[m.Version] {
			continue
		}
		for _, ext := range extensions(m.SQL) {
			if err := createExtension(ctx, tx, ext); err != nil {
				return fmt.Errorf("%s: migrate: migration %d (%s) needs the PostgreSQL extension %s, which this database does not have, and it could not be created: %w; "+
					"have the database's owner or an administrator run CREATE EXTENSION %s; in this database (a managed PostgreSQL may need the extension allowed first), then migrate again; nothing was changed",
					s.Owner, m.Version, m.Name, ext, err, ext)
			}
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("%s: migrate: applying migration %d (%s): %w", s.Owner, m.Version, m.Name, err)
		}
		// The files record themselves; a step that does not is recorded here.
		if _, err := tx.Exec(ctx, "INSERT INTO "+record+" (version, name) VALUES ($1, $2) ON CONFLICT (version) DO NOTHING", m.Version, m.Name); err != nil {
			return fmt.Errorf("%s: migrate: recording migration %d (%s) in %s: %w", s.Owner, m.Version, m.Name, record, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("%s: migrate: %w", s.Owner, err)
	}
	return nil
}

// pinSchema sets the transaction's search_path to the one schema that
// holds the tables, when Set.Schema is empty: the schema where the
// search_path finds the main table or the record, or else the schema
// CREATE would use. The store's statements name the tables without a
// schema and reach the first match on the search_path; CREATE TABLE IF NOT
// EXISTS looks only in the first schema. Without the pin, a table in a
// later schema (public, behind a "$user" schema created after it) would
// get an empty twin in the first schema, which every statement would
// reach from then on: every claim and lease in the old table lost.
func (s Set) pinSchema(ctx context.Context, tx pgx.Tx, record string) error {
	const nsOf = `(SELECT n.nspname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.oid = to_regclass($%d))`
	var main *string // NULL when the set names no main table
	if s.Table != "" {
		t := Names{Default: s.Table}.Table("")
		main = &t
	}
	var table, rec, current *string
	if err := tx.QueryRow(ctx, "SELECT "+fmt.Sprintf(nsOf, 1)+", "+fmt.Sprintf(nsOf, 2)+", current_schema()",
		main, record).Scan(&table, &rec, &current); err != nil {
		return err
	}
	schema := current
	switch {
	case table != nil && rec != nil && *table != *rec:
		return fmt.Errorf("the search_path finds %s in schema %q and its record %s in schema %q; set the schema explicitly",
			s.Table, *table, s.Record, *rec)
	case table != nil:
		schema = table
	case rec != nil:
		schema = rec
	}
	if schema == nil {
		return nil // no schema on the search_path exists: CREATE fails with PostgreSQL's own message
	}
	_, err := tx.Exec(ctx, "SELECT set_config('search_path', $1, true)", pgx.Identifier{*schema}.Sanitize())
	return err
}

// createRecord creates the record table, and the schema that holds it,
// unless they exist. Existence is checked first so that a role without
// CREATE privileges can run a set that is up to date.
func (s Set) createRecord(ctx context.Context, tx pgx.Tx, record string) error {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", record).Scan(&exists); err != nil || exists {
		return err
	}
	if s.Schema != "" {
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", s.Schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{s.Schema}.Sanitize()); err != nil {
				return err
			}
		}
	}
	_, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+record+" ("+RecordColumns+")")
	return err
}

// extensionRE finds the extensions a migration creates: each is created
// on its own before the migration's other statements, so that a database
// without it, and a role that may not create it, get an error that names
// it.
var extensionRE = regexp.MustCompile(`(?m)^CREATE EXTENSION IF NOT EXISTS ([a-z0-9_]+);`)

// extensions returns the extensions sql creates, in order.
func extensions(sql string) []string {
	var out []string
	for _, m := range extensionRE.FindAllStringSubmatch(sql, -1) {
		out = append(out, m[1])
	}
	return out
}

// createExtension creates ext unless the database has it, which needs no
// privilege. PostgreSQL's hint (which privilege is missing, or that the
// extension is not installed on the server) is part of the error.
func createExtension(ctx context.Context, tx pgx.Tx, ext string) error {
	_, err := tx.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS "+pgx.Identifier{ext}.Sanitize())
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Hint != "" {
		return fmt.Errorf("%w (%s)", err, strings.TrimSuffix(pe.Hint, "."))
	}
	return err
}

// RecordColumns are the record table's columns, as every owner's first
// migration file creates them too.
const RecordColumns = `
    version    integer     PRIMARY KEY,
    name       text        NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now()
`

// published holds migrations their owner offers to billonce's own
// programs without exporting them (the lease table's: package lock has no
// Migrations function of its own).
var published = map[string][]Migration{}

// Publish makes owner's migrations readable with [Published]. Owners call
// it from an init function.
func Publish(owner string, ms []Migration) { published[owner] = ms }

// Published returns the migrations owner published, for its default
// names, or nil.
func Published(owner string) []Migration { return published[owner] }
