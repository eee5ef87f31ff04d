package spendcap

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/billonce/billonce/internal/migrate"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// PostgresStore is a [Store] in PostgreSQL, shared by every replica of a
// proxy: admit checks and reserves in one transaction that locks the
// vault key's row, so replicas never reserve past a cap together. Its
// tables are spendcap_keys, spendcap_reservations, spendcap_idempotency
// and spendcap_audit; call [PostgresStore.Migrate] at start-up.
type PostgresStore struct {
	db *pgxpool.Pool
}

// NewPostgresStore returns a store on db.
func NewPostgresStore(db *pgxpool.Pool) (*PostgresStore, error) {
	if db == nil {
		return nil, invalid("NewPostgresStore: the pool is nil")
	}
	return &PostgresStore{db: db}, nil
}

// A Migration is one step of the store's schema, applied once, in
// Version order; a released migration never changes.
type Migration struct {
	Version int
	Name    string
	SQL     string
}

// ErrNewerSchema is returned by [PostgresStore.Migrate] when the tables
// were migrated by a newer billonce than this binary. Migrate changes
// nothing then; upgrade the binary.
var ErrNewerSchema = migrate.ErrNewerSchema

// migrationFiles holds the migrations, one file each, named NNNN_name.sql
// with NNNN the version.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

var migrations = migrate.Load(migrationFiles, "migrations")

// Migrations returns the store's migrations in order, for teams that apply
// migrations with their own tool: they are the files of the package's
// migrations directory, byte for byte. Each is idempotent and records its
// own version in spendcap_migrations, so calling [PostgresStore.Migrate]
// afterwards finds nothing to do.
func Migrations() []Migration {
	ms := make([]Migration, len(migrations))
	for i, m := range migrations {
		ms[i] = Migration(m)
	}
	return ms
}

// Migrate brings the tables up to date: it applies each migration that the
// record table spendcap_migrations does not list, and lists it, in one
// transaction under an advisory lock, so every replica may call it at
// start-up at once. Once the tables are up to date it only reads the
// record, so a role without CREATE privileges can call it. If the record
// holds a version newer than this binary knows, it changes nothing and
// returns an error wrapping [ErrNewerSchema].
func (s *PostgresStore) Migrate(ctx context.Context) error {
	return migrate.Set{
		Owner:      "spendcap",
		Record:     "spendcap_migrations",
		Table:      "spendcap_keys",
		Lock:       0x7370656e64636170, // "spendcap" in ASCII
		Migrations: migrations,
	}.Run(ctx, s.db)
}

// IssueKey makes vaultKey valid with k, replacing any key of that name
// and its spend. label is a note for people (who the key is for); it is
// stored in clear.
func (s *PostgresStore) IssueKey(ctx context.Context, vaultKey string, k Key, label string) error {
	if err := k.check(); err != nil {
		return err
	}
	var expires *time.Time
	if !k.ExpiresAt.IsZero() {
		expires = &k.ExpiresAt
	}
	_, err := s.db.Exec(ctx, `INSERT INTO spendcap_keys (key_id, cap_amount, per, allowed_endpoints, expires_at, label)
VALUES ($1, $2, $3, $4, $5, $6)
ON CONFLICT (key_id) DO UPDATE SET cap_amount = $2, per = $3, allowed_endpoints = $4, expires_at = $5, label = $6,
    revoked_at = NULL, window_start = '0001-01-01 00:00:00+00', spent = 0`,
		KeyID(vaultKey), k.CapAmount, k.Per.String(), k.AllowedEndpoints, expires, label)
	if err != nil {
		return fmt.Errorf("spendcap: issuing key %s: %w", KeyID(vaultKey), err)
	}
	return nil
}

// Revoke makes the key named by id invalid at once, on every replica:
// later requests with it are refused. Requests already forwarded finish.
func (s *PostgresStore) Revoke(ctx context.Context, id string) error {
	tag, err := s.db.Exec(ctx, "UPDATE spendcap_keys SET revoked_at = coalesce(revoked_at, now()) WHERE key_id = $1", id)
	if err != nil {
		return fmt.Errorf("spendcap: revoking %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrUnknownKey
	}
	return nil
}

// SetCap changes the cap of the key named by id; what it spent is kept.
func (s *PostgresStore) SetCap(ctx context.Context, id string, capAmount int64) error {
	if capAmount <= 0 {
		return fmt.Errorf("spendcap: cap %d: want a positive amount", capAmount)
	}
	tag, err := s.db.Exec(ctx, "UPDATE spendcap_keys SET cap_amount = $2 WHERE key_id = $1", id, capAmount)
	if err != nil {
		return fmt.Errorf("spendcap: changing the cap of %s: %w", id, err)
	}
	if tag.RowsAffected() == 0 {
		return ErrUnknownKey
	}
	return nil
}

// Usage returns what the key named by id has spent and holds reserved in
// the window of now.
func (s *PostgresStore) Usage(ctx context.Context, id string, now time.Time) (Usage, error) {
	var (
		per      string
		start    time.Time
		u        Usage
		capValue int64
	)
	err := s.db.QueryRow(ctx, "SELECT per, window_start, spent, reserved, cap_amount FROM spendcap_keys WHERE key_id = $1", id).
		Scan(&per, &start, &u.Spent, &u.Reserved, &capValue)
	if errors.Is(err, pgx.ErrNoRows) {
		return Usage{}, ErrUnknownKey
	}
	if err != nil {
		return Usage{}, fmt.Errorf("spendcap: usage of %s: %w", id, err)
	}
	if window(parsePer(per), now).After(start) {
		u.Spent = 0
	}
	return u, nil
}

func parsePer(s string) Per {
	if s == "day" {
		return PerDay
	}
	return PerRun
}

// admit implements [Store] in one transaction that locks the key's row.
func (s *PostgresStore) admit(ctx context.Context, r admitRequest) (a admission, err error) {
	err = pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			k                        Key
			per                      string
			expires                  *time.Time
			revoked                  bool
			start                    time.Time
			spent, reserved          int64
			st                       idemState
			allowed                  []string
			allowedNull              bool
			newSpent, newWindowStart = int64(0), time.Time{}
		)
		err := tx.QueryRow(ctx, `SELECT cap_amount, per, allowed_endpoints, allowed_endpoints IS NULL, expires_at, revoked_at IS NOT NULL, window_start, spent, reserved
FROM spendcap_keys WHERE key_id = $1 FOR UPDATE`, r.KeyID).
			Scan(&k.CapAmount, &per, &allowed, &allowedNull, &expires, &revoked, &start, &spent, &reserved)
		if errors.Is(err, pgx.ErrNoRows) {
			a = admission{Refusal: refusedUnknownKey}
			return nil
		}
		if err != nil {
			return err
		}
		k.Per = parsePer(per)
		if !allowedNull {
			k.AllowedEndpoints = allowed
			if k.AllowedEndpoints == nil {
				k.AllowedEndpoints = []string{}
			}
		}
		if expires != nil {
			k.ExpiresAt = *expires
		}
		newSpent, newWindowStart = spent, start
		if w := window(k.Per, r.Now); w.After(start) {
			newSpent, newWindowStart = 0, w
		}
		if r.IdempotencyKey != "" {
			if _, err := tx.Exec(ctx, "INSERT INTO spendcap_idempotency (idempotency_key) VALUES ($1) ON CONFLICT DO NOTHING", r.IdempotencyKey); err != nil {
				return err
			}
			if err := tx.QueryRow(ctx, "SELECT chain_start, last_forward, counted_until FROM spendcap_idempotency WHERE idempotency_key = $1 FOR UPDATE", r.IdempotencyKey).
				Scan(&st.ChainStart, &st.LastForward, &st.CountedUntil); err != nil {
				return err
			}
			st = st.utc()
		}
		a = decide(k, revoked, newSpent, reserved, r.IdempotencyKey != "" && st.counted(r.Now), r)
		a, st = admitted(a, r, st)
		if a.Refusal != notRefused {
			return nil
		}
		if r.IdempotencyKey != "" {
			if _, err := tx.Exec(ctx, "UPDATE spendcap_idempotency SET chain_start = $2, last_forward = $3 WHERE idempotency_key = $1",
				r.IdempotencyKey, st.ChainStart, st.LastForward); err != nil {
				return err
			}
		}
		res := &a.Reservation
		if res.Amount > 0 {
			if err := tx.QueryRow(ctx, `INSERT INTO spendcap_reservations (key_id, idempotency_key, amount, reserved_at, since, count_for_us)
VALUES ($1, $2, $3, $4, $5, $6) RETURNING id`, r.KeyID, r.IdempotencyKey, res.Amount, res.At, res.Since, res.CountFor.Microseconds()).Scan(&res.ID); err != nil {
				return err
			}
			reserved += res.Amount
		}
		if newSpent != spent || !newWindowStart.Equal(start) || res.Amount > 0 {
			_, err := tx.Exec(ctx, "UPDATE spendcap_keys SET spent = $2, reserved = $3, window_start = $4 WHERE key_id = $1",
				r.KeyID, newSpent, reserved, newWindowStart)
			return err
		}
		return nil
	})
	if err != nil {
		return admission{}, fmt.Errorf("spendcap: admitting a request for %s: %w", r.KeyID, err)
	}
	return a, nil
}

func (s idemState) utc() idemState {
	return idemState{ChainStart: s.ChainStart.UTC(), LastForward: s.LastForward.UTC(), CountedUntil: s.CountedUntil.UTC()}
}

// settle implements [Store] in one transaction.
func (s *PostgresStore) settle(ctx context.Context, r reservation, o outcome, now time.Time) error {
	err := pgx.BeginFunc(ctx, s.db, func(tx pgx.Tx) error {
		var (
			held       reservation
			countForUS int64
		)
		err := tx.QueryRow(ctx, `DELETE FROM spendcap_reservations WHERE id = $1
RETURNING key_id, idempotency_key, amount, reserved_at, since, count_for_us`, r.ID).
			Scan(&held.KeyID, &held.IdempotencyKey, &held.Amount, &held.At, &held.Since, &countForUS)
		if errors.Is(err, pgx.ErrNoRows) {
			return nil // settled already
		}
		if err != nil {
			return err
		}
		held.CountFor = time.Duration(countForUS) * time.Microsecond
		var (
			per   string
			start time.Time
			spent int64
		)
		if err := tx.QueryRow(ctx, "SELECT per, window_start, spent FROM spendcap_keys WHERE key_id = $1 FOR UPDATE", held.KeyID).
			Scan(&per, &start, &spent); err != nil {
			return err
		}
		if o != outcomeReleased {
			if w := window(parsePer(per), now); w.After(start) {
				start, spent = w, 0
			}
			spent += held.Amount
		}
		if _, err := tx.Exec(ctx, "UPDATE spendcap_keys SET reserved = reserved - $2, spent = $3, window_start = $4 WHERE key_id = $1",
			held.KeyID, held.Amount, spent, start); err != nil {
			return err
		}
		if held.IdempotencyKey != "" && o != outcomeReleased {
			until := idemState{}.settled(held, o).CountedUntil
			if _, err := tx.Exec(ctx, "UPDATE spendcap_idempotency SET counted_until = greatest(counted_until, $2) WHERE idempotency_key = $1",
				held.IdempotencyKey, until); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("spendcap: settling reservation %d: %w", r.ID, err)
	}
	return nil
}

// record implements [Store].
func (s *PostgresStore) record(ctx context.Context, e Entry) error {
	_, err := s.db.Exec(ctx, `INSERT INTO spendcap_audit (at, key_id, method, path, idempotency_key, amount, status, refused, replayed, kept)
VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`,
		e.Time, e.KeyID, e.Method, e.Path, e.IdempotencyKey, e.Amount, e.Status, string(e.Refused), e.Replayed, e.Kept)
	if err != nil {
		return fmt.Errorf("spendcap: recording an audit row: %w", err)
	}
	return nil
}

// Entries returns the audit rows of the key named by id ("" for all), in
// the order they were recorded.
func (s *PostgresStore) Entries(ctx context.Context, id string) ([]Entry, error) {
	rows, _ := s.db.Query(ctx, `SELECT at, key_id, method, path, idempotency_key, amount, status, refused, replayed, kept
FROM spendcap_audit WHERE $1 = '' OR key_id = $1 ORDER BY id`, id)
	es, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (Entry, error) {
		var e Entry
		var refused string
		err := row.Scan(&e.Time, &e.KeyID, &e.Method, &e.Path, &e.IdempotencyKey, &e.Amount, &e.Status, &refused, &e.Replayed, &e.Kept)
		e.Refused = refused
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("spendcap: reading audit rows: %w", err)
	}
	return slices.Clip(es), nil
}
