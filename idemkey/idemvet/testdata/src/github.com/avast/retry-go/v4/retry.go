package retry

type Option func()

func Do(f func() error, opts ...Option) error                          { return f() }
func DoWithData[T any](f func() (T, error), opts ...Option) (T, error) { return f() }
func Attempts(n uint) Option                                           { return nil }
