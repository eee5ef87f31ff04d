package claim

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/billonce/billonce/internal/claimengine"
)

// The engine's types, as this package names them.
type (
	request   = claimengine.Request
	result    = claimengine.Result[Claim]
	update    = claimengine.Update
	applied   = claimengine.Applied[Claim]
	sendCheck = claimengine.SendCheck
	success   = claimengine.Success
)

// pgEngine and memEngine are the engines of Postgres and the memory store: the same
// stores, with the methods billing calls.
type (
	pgEngine  Postgres
	memEngine memory
)

var (
	_ claimengine.Engine[Claim] = (*pgEngine)(nil)
	_ claimengine.Batcher       = (*pgEngine)(nil)
	_ claimengine.Engine[Claim] = (*memEngine)(nil)
	_ Store                     = (*Postgres)(nil)
	_ Store                     = (*memory)(nil)
)

func init() {
	claimengine.Register(func(store any) any {
		if s, ok := store.(Store); ok {
			return s.engine()
		}
		return nil
	})
}

func (p *Postgres) engine() any { return (*pgEngine)(p) }

func (m *memory) engine() any { return (*memEngine)(m) }

// Get returns the claim for key.
func (p *pgEngine) Get(ctx context.Context, key string) (Claim, error) {
	return (*Postgres)(p).Get(ctx, key)
}

// Get returns the claim for key.
func (m *memEngine) Get(ctx context.Context, key string) (Claim, error) {
	return (*memory)(m).Get(ctx, key)
}

// Period returns the claims of customer's period, ordered by attempt and
// creation. Each state reads one of the two partial indexes on (customer,
// period): the live claims' and the failed claims'.
func (p *pgEngine) Period(ctx context.Context, customer, period string) ([]Claim, error) {
	return p.list(ctx, ` WHERE t.customer = $1 AND t.period = $2 AND (t.state <> 'failed' OR t.state = 'failed')
		ORDER BY t.attempt, t.created_at, t.key`, customer, period)
}

// Period returns the claims of customer's period, ordered by attempt and
// creation.
func (m *memEngine) Period(ctx context.Context, customer, period string) ([]Claim, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []Claim
	for _, k := range m.periods[[2]string{customer, period}] {
		out = append(out, m.snapshot(m.byKey[k], now))
	}
	slices.SortStableFunc(out, func(a, b Claim) int {
		return cmp.Or(cmp.Compare(a.Attempt, b.Attempt), a.CreatedAt.Compare(b.CreatedAt), cmp.Compare(a.Key, b.Key))
	})
	return out, nil
}

// PruneEvents deletes the records of old events; see [Postgres.PruneEvents].
func (p *pgEngine) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	return (*Postgres)(p).PruneEvents(ctx, olderThan)
}
