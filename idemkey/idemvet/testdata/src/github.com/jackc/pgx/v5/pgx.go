package pgx

import "context"

type Row interface{ Scan(dest ...any) error }
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (any, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Commit(ctx context.Context) error
}

type Conn struct{}

func Connect(ctx context.Context, dsn string) (*Conn, error)                   { return nil, nil }
func (c *Conn) Exec(ctx context.Context, sql string, args ...any) (any, error) { return nil, nil }
func (c *Conn) QueryRow(ctx context.Context, sql string, args ...any) Row      { return nil }
