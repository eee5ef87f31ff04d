package sqlx

import (
	"context"
	"database/sql"
)

type DB struct{ *sql.DB }
type Conn struct{ *sql.Conn }

func (db *DB) Get(dest any, query string, args ...any) error { return nil }
func (db *DB) Connx(ctx context.Context) (*Conn, error)      { return nil, nil }
