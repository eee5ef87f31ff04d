package retry

import "context"

type Backoff interface{ Next() (int, bool) }
type RetryFunc func(ctx context.Context) error

func Do(ctx context.Context, b Backoff, f RetryFunc) error { return f(ctx) }
func RetryableError(err error) error                       { return err }
