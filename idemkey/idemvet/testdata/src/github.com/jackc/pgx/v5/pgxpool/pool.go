package pgxpool

import (
	"context"

	"github.com/jackc/pgx/v5"
)

type Pool struct{}
type Conn struct{}

func (p *Pool) Exec(ctx context.Context, sql string, args ...any) (any, error) { return nil, nil }
func (p *Pool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row  { return nil }
func (p *Pool) Acquire(ctx context.Context) (*Conn, error)                     { return nil, nil }
func (p *Pool) Begin(ctx context.Context) (pgx.Tx, error)                      { return nil, nil }
func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (any, error) { return nil, nil }
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row  { return nil }
func (c *Conn) Release()                                                       {}
