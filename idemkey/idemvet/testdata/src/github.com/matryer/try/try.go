package try

func Do(fn func(attempt int) (retry bool, err error)) error { _, err := fn(1); return err }
