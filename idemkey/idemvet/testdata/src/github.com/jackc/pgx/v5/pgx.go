package pgx

import "context"

type Row interface{ Scan(dest ...any) error }
type Tx interface {
	Exec(ctx context.Context, sql string, args ...any) (any, error)
	QueryRow(ctx context.Context, sql string, args ...any) Row
	Commit(ctx context.Context) error
}
