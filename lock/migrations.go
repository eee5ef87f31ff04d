package lock

import "github.com/billonce/billonce/internal/migrate"

// The billonce command prints the lease table's SQL (billonce migrate
// -dry-run) from here; users who apply migrations with their own tool take
// the files of the migrations directory.
func init() { migrate.Publish("lock", leaseMigrations) }
