package claim

import (
	"context"
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

// PruneEvents deletes the records of old events; see [Postgres.PruneEvents].
func (p *pgEngine) PruneEvents(ctx context.Context, olderThan time.Duration) (int, error) {
	return (*Postgres)(p).PruneEvents(ctx, olderThan)
}
