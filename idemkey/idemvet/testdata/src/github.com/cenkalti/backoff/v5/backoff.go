package backoff

import "context"

type Operation[T any] func() (T, error)
type RetryOption func()

func Retry[T any](ctx context.Context, o Operation[T], opts ...RetryOption) (T, error) { return o() }
