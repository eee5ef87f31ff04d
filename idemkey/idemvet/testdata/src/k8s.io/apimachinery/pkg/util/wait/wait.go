package wait

type Backoff struct{ Steps int }
type ConditionFunc func() (done bool, err error)

func ExponentialBackoff(b Backoff, c ConditionFunc) error { _, err := c(); return err }
