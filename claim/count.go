package claim

import (
	"context"
	"fmt"
)

// List returns the claims of period, of customer only when customer is
// not "", ordered by customer, attempt and creation: a period's claims for
// an operator's view or an export, read in one query whatever their
// number.
func (p *Postgres) List(ctx context.Context, period, customer string) ([]Claim, error) {
	return (*pgEngine)(p).list(ctx, ` WHERE t.period = $1 AND ($2 = '' OR t.customer = $2) ORDER BY t.customer, t.attempt, t.created_at, t.key`, period, customer)
}

// ListPeriods returns the claims whose period is one of periods or starts
// with one of prefixes, of customer only when customer is not "", ordered
// as List: a billing period's claims with those made for it, whose
// periods name it (its refunds, its transfers and payouts), for an
// operator's view or an export, read in one query whatever their number.
// A prefix matches byte for byte, whatever the database's collation.
func (p *Postgres) ListPeriods(ctx context.Context, periods, prefixes []string, customer string) ([]Claim, error) {
	if periods == nil {
		periods = []string{}
	}
	if prefixes == nil {
		prefixes = []string{}
	}
	return (*pgEngine)(p).list(ctx, ` WHERE (t.period = ANY($1::text[]) OR EXISTS (SELECT 1 FROM unnest($2::text[]) AS x(prefix)
		WHERE left(t.period, length(x.prefix)) = x.prefix)) AND ($3 = '' OR t.customer = $3)
		ORDER BY t.customer, t.attempt, t.created_at, t.key`, periods, prefixes, customer)
}

// Count returns how many claims of period are in each state, for an
// operator's view of a billing run. Re-bills have claims of their own, so a
// customer re-billed after a decline counts once as failed and once more.
func (p *Postgres) Count(ctx context.Context, period string) (map[State]int, error) {
	rows, err := p.db.Query(ctx, "SELECT state, count(*) FROM "+p.names.table+" WHERE period = $1 GROUP BY state", period)
	if err != nil {
		return nil, fmt.Errorf("claim: counting claims of period %s: %w", period, err)
	}
	defer rows.Close()
	out := map[State]int{}
	for rows.Next() {
		var (
			s State
			n int
		)
		if err := rows.Scan(&s, &n); err != nil {
			return nil, fmt.Errorf("claim: counting claims of period %s: %w", period, err)
		}
		out[s] = n
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("claim: counting claims of period %s: %w", period, err)
	}
	return out, nil
}
