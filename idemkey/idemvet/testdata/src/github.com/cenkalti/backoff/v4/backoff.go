package backoff

type BackOff interface{ NextBackOff() int }
type Operation func() error
type Notify func(error, int)

func NewExponentialBackOff() BackOff                                 { return nil }
func Retry(o Operation, b BackOff) error                             { return o() }
func RetryNotify(o Operation, b BackOff, n Notify) error             { return o() }
func RetryWithData[T any](o func() (T, error), b BackOff) (T, error) { return o() }
func Permanent(err error) error                                      { return err }
