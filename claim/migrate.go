package claim

import (
	"context"
	"embed"

	"github.com/billonce/billonce/internal/migrate"
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

// ErrNewerSchema is returned by [Postgres.Migrate] when the claim table was
// migrated by a newer billonce than this binary: its migrations record
// holds a version this build does not know. Migrate changes nothing then;
// upgrade the binary.
var ErrNewerSchema = migrate.ErrNewerSchema

// migrationFiles holds the migrations, one file each, named NNNN_name.sql
// with NNNN the version, written for the default names.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

var migrations = migrate.Load(migrationFiles, "migrations")

// migrationNames are the claim table's identifiers in migrationFiles.
func migrationNames(cfg Config) migrate.Names {
	return migrate.Names{
		Default: DefaultTable,
		Tables:  []string{"", "_events", "_migrations"},
		// The indexes, the exclusion constraints (whose indexes share
		// the schema's names), and PostgreSQL's name for the first
		// migration's check on state.
		Others: []string{"_live", "_failed", "_pending", "_pending_keys", "_processing", "_events_received", "_windows_start", "_windows_end", "_refunds", "_state_check", "_currency_check"},
		Name:   cfg.Table,
		Schema: cfg.Schema,
	}
}

// Migrations returns the claim table's migrations for cfg, in order, for
// teams that apply migrations with their own tool (goose, golang-migrate,
// atlas): put each in a migration of your own, once, in this order, and
// add the new ones that later versions of billonce bring. For the default
// Config they are the files of the package's migrations directory, byte
// for byte; otherwise the files with cfg's names in place, and the first
// also creates cfg.Schema if it is set.
//
// Each migration's SQL is idempotent and records its own version in the
// migrations record, so calling [Postgres.Migrate] afterwards finds
// nothing to do. The SQL holds several statements, each ending a line with
// a semicolon and none dollar-quoted, so tools that split a file into
// statements take it as it is.
func Migrations(cfg Config) ([]Migration, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	ms := make([]Migration, len(migrations))
	for i, m := range migrate.Rename(migrations, migrationNames(cfg)) {
		ms[i] = Migration(m)
	}
	if cfg.Schema != "" {
		ms[0].SQL = "CREATE SCHEMA IF NOT EXISTS " + pgx.Identifier{cfg.Schema}.Sanitize() + ";\n\n" + ms[0].SQL
	}
	return ms, nil
}

// Migrate brings the claim table up to date: it applies, in order, each
// migration in [Migrations] that the table's migrations record (a table
// named after the claim table with _migrations appended, in the same
// schema) does not list, and lists it. It creates the schema and the record
// if they do not exist. A table created by an earlier billonce, whose
// Migrate only created it, is upgraded in place, its rows intact; a table
// made by applying the migration files with psql or a migration tool is
// found up to date.
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
	return migrate.Set{
		Owner:      "claim",
		Schema:     p.cfg.Schema,
		Record:     p.cfg.Table + "_migrations", // at most 61 characters: Config limits Table to 50
		Table:      p.cfg.Table,
		Lock:       p.lockKey,
		Migrations: migrate.Rename(migrations, migrationNames(p.cfg)),
	}.Run(ctx, p.db)
}
