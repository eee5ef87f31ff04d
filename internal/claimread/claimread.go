// Package claimread holds the reads of the claim table that billonce's
// operators' command needs and the library does not offer: the events
// applied to claims and the customers of a list that have no claim.
// Claims themselves are read with package claim (Get, List, ListPeriods),
// which owns the row's shape.
package claimread

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// Querier is what the reads need: a *pgxpool.Pool, a *pgx.Conn or a pgx.Tx.
type Querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// Unclaimed returns those of customers that have no claim for period in
// table, in their order: the customers a run stopped or killed before
// reaching, for whom no claim says anything. It is one query, however
// many customers there are.
func Unclaimed(ctx context.Context, db Querier, table, period string, customers []string) ([]string, error) {
	q := "SELECT u.customer FROM unnest($2::text[]) WITH ORDINALITY AS u(customer, n) WHERE NOT EXISTS (SELECT 1 FROM " +
		pgx.Identifier{table}.Sanitize() + " c WHERE c.period = $1 AND c.customer = u.customer) ORDER BY u.n"
	rows, err := db.Query(ctx, q, period, customers)
	if err != nil {
		return nil, fmt.Errorf("listing the customers without a claim for period %s: %w", period, err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("listing the customers without a claim for period %s: %w", period, err)
	}
	if out == nil {
		out = []string{}
	}
	return out, nil
}

// An Event is a Stripe event recorded as applied to a claim.
type Event struct {
	ID         string    `json:"id"`
	Type       string    `json:"type"`
	StripeID   string    `json:"stripe_id"`
	Created    time.Time `json:"created"`
	Result     string    `json:"result"`
	ReceivedAt time.Time `json:"received_at"`
}

// Events returns the events recorded for each of keys in table's events
// table, oldest first, by key: the events of several claims in one query.
func Events(ctx context.Context, db Querier, table string, keys []string) (map[string][]Event, error) {
	q := "SELECT key, id, type, stripe_id, created, result, received_at FROM " + pgx.Identifier{table + "_events"}.Sanitize() +
		" WHERE key = ANY($1::text[]) ORDER BY key, created, received_at, id"
	rows, err := db.Query(ctx, q, keys)
	if err != nil {
		return nil, fmt.Errorf("listing the events of %d claims: %w", len(keys), err)
	}
	out := map[string][]Event{}
	var key string
	var e Event
	_, err = pgx.ForEachRow(rows, []any{&key, &e.ID, &e.Type, &e.StripeID, &e.Created, &e.Result, &e.ReceivedAt}, func() error {
		out[key] = append(out[key], e)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing the events of %d claims: %w", len(keys), err)
	}
	return out, nil
}
