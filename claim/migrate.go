package claim

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// A Migration is one step of the claim table's schema. Migrations are
// applied in Version order, each once; a released migration never changes,
// and later versions of billonce only add new ones.
type Migration struct {
	Version int    // 1, 2, ...
	Name    string // what the step does, from its file name: "create", "identity"
	// SQL is the step for one configured table: several statements,
	// idempotent, to run in one transaction.
	SQL string
}

// ErrNewerSchema means the claim table was migrated by a newer billonce than
// this binary: its migrations record holds a version this build does not
// know. [Postgres.Migrate] changes nothing then; upgrade the binary.
var ErrNewerSchema = errors.New("claim: the claim table was migrated by a newer billonce; upgrade this binary")

// migrationFiles holds the migrations, one file each, named
// NNNN_name.sql with NNNN the version. {{table}}, {{live_index}} and
// {{pending_index}} stand for the configured, quoted names.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrationTemplates are the embedded migrations, placeholders unreplaced.
var migrationTemplates = mustLoadMigrations(migrationFiles)

var migrationFileRE = regexp.MustCompile(`^([0-9]{4})_([a-z0-9_]+)\.sql$`)

// mustLoadMigrations reads the migrations in fsys, in version order. The
// files are built into the package, so a misnamed or misnumbered one is a
// bug that every test catches.
func mustLoadMigrations(fsys fs.FS) []Migration {
	entries, err := fs.ReadDir(fsys, "migrations") // sorted by name, so by version
	if err != nil {
		panic(err)
	}
	var ms []Migration
	for _, e := range entries {
		m := migrationFileRE.FindStringSubmatch(e.Name())
		if m == nil {
			panic(fmt.Sprintf("claim: migration file %q is not named NNNN_name.sql", e.Name()))
		}
		v, _ := strconv.Atoi(m[1])
		if v != len(ms)+1 {
			panic(fmt.Sprintf("claim: migration file %q has version %d, want %d: versions start at 1 without gaps", e.Name(), v, len(ms)+1))
		}
		sql, err := fs.ReadFile(fsys, "migrations/"+e.Name())
		if err != nil {
			panic(err)
		}
		ms = append(ms, Migration{Version: v, Name: m[2], SQL: string(sql)})
	}
	return ms
}

// Migrations returns the claim table's migrations for cfg, in order, for
// teams that apply migrations with their own tool (goose, golang-migrate,
// atlas): put each in a migration of your own, once, in this order, and
// add the new ones that later versions of billonce bring. The first creates
// cfg.Schema if it is set.
//
// Each migration's SQL is idempotent, so calling [Postgres.Migrate]
// afterwards is safe: it finds the table as it should be, records the
// migrations as applied and changes nothing else. The SQL holds several
// statements, each ending a line with a semicolon and none dollar-quoted, so
// tools that split a file into statements take it as it is.
func Migrations(cfg Config) ([]Migration, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ms := migrationsFor(namesFor(cfg))
	if cfg.Schema != "" {
		ms[0].SQL = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{cfg.Schema}.Sanitize() + ";\n\n" + ms[0].SQL
	}
	return ms, nil
}

// migrationsFor returns the migrations with n's names in place.
func migrationsFor(n names) []Migration {
	ms := make([]Migration, len(migrationTemplates))
	for i, m := range migrationTemplates {
		m.SQL = n.replacer.Replace(m.SQL)
		ms[i] = m
	}
	return ms
}

// recordTable returns the quoted name of the table that records which
// migrations cfg's claim table has had: the claim table's name followed by
// _migrations, in the same schema.
func recordTable(cfg Config) string {
	name := cfg.Table + "_migrations" // at most 61 characters: Config limits Table to 50
	if cfg.Schema != "" {
		return pgx.Identifier{cfg.Schema, name}.Sanitize()
	}
	return pgx.Identifier{name}.Sanitize()
}

// Migrate brings the claim table up to date: it applies, in order, each
// migration in [Migrations] that the table's migrations record (a table
// named after the claim table with _migrations appended, in the same
// schema) does not list, and lists it. It creates the schema and the record
// if they do not exist. A table created by an earlier billonce, whose
// Migrate only created it, is upgraded in place, its rows intact.
//
// Everything runs in one transaction under a transaction advisory lock, so
// Migrate is idempotent and safe to call at start-up from every replica at
// once: the first applies what is missing, the others wait for it and find
// nothing to do. Once the table is up to date, Migrate only reads the
// record: a role without CREATE privileges can call it.
//
// If the record holds a version newer than this binary knows, Migrate
// changes nothing and returns an error wrapping [ErrNewerSchema].
//
// Migrate runs at READ COMMITTED, whatever the database's default.
func (p *Postgres) Migrate(ctx context.Context) error {
	record := recordTable(p.cfg)
	tx, err := p.db.Begin(ctx)
	if err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	// A transaction's snapshot may be taken when it asks for the lock,
	// before it waits; only READ COMMITTED reads the record as the Migrate
	// it waited for left it.
	if _, err := tx.Exec(ctx, "SET TRANSACTION ISOLATION LEVEL READ COMMITTED"); err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	if _, err := tx.Exec(ctx, "SELECT pg_advisory_xact_lock($1)", p.lockKey); err != nil {
		return fmt.Errorf("claim: migrate: taking the migration lock: %w", err)
	}
	if err := p.createRecord(ctx, tx, record); err != nil {
		return fmt.Errorf("claim: migrate: creating %s: %w", record, err)
	}
	rows, _ := tx.Query(ctx, "SELECT version FROM "+record)
	versions, err := pgx.CollectRows(rows, pgx.RowTo[int32])
	if err != nil {
		return fmt.Errorf("claim: migrate: reading %s: %w", record, err)
	}
	applied := make(map[int]bool, len(versions))
	for _, v := range versions {
		if int(v) > len(migrationTemplates) {
			return fmt.Errorf("%w: %s lists version %d, and this binary knows versions 1 to %d (nothing was changed)",
				ErrNewerSchema, record, v, len(migrationTemplates))
		}
		applied[int(v)] = true
	}
	for _, m := range migrationsFor(p.names) {
		if applied[m.Version] {
			continue
		}
		if _, err := tx.Exec(ctx, m.SQL); err != nil {
			return fmt.Errorf("claim: migrate: applying migration %d (%s) to %s: %w", m.Version, m.Name, p.names.table, err)
		}
		if _, err := tx.Exec(ctx, "INSERT INTO "+record+" (version, name) VALUES ($1, $2)", m.Version, m.Name); err != nil {
			return fmt.Errorf("claim: migrate: recording migration %d (%s) in %s: %w", m.Version, m.Name, record, err)
		}
	}
	if err := tx.Commit(ctx); err != nil {
		return fmt.Errorf("claim: migrate: %w", err)
	}
	return nil
}

// createRecord creates the migrations record, and the schema that holds it,
// unless they exist. Existence is checked first so that a role without
// CREATE privileges can run Migrate on a table that is up to date.
func (p *Postgres) createRecord(ctx context.Context, tx pgx.Tx, record string) error {
	var exists bool
	if err := tx.QueryRow(ctx, "SELECT to_regclass($1) IS NOT NULL", record).Scan(&exists); err != nil || exists {
		return err
	}
	if p.cfg.Schema != "" {
		if err := tx.QueryRow(ctx, "SELECT EXISTS (SELECT FROM pg_namespace WHERE nspname = $1)", p.cfg.Schema).Scan(&exists); err != nil {
			return err
		}
		if !exists {
			if _, err := tx.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{p.cfg.Schema}.Sanitize()); err != nil {
				return err
			}
		}
	}
	_, err := tx.Exec(ctx, "CREATE TABLE IF NOT EXISTS "+record+` (
	version    integer     PRIMARY KEY,
	name       text        NOT NULL,
	applied_at timestamptz NOT NULL DEFAULT now()
)`)
	return err
}
