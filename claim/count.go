package claim

import (
	"context"
	"fmt"
)

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
