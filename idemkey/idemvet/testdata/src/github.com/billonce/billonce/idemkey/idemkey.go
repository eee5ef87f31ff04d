package idemkey

type Key struct{ s string }

func For(scope string, parts ...string) (Key, error) { return Key{}, nil }
func (k Key) String() string                         { return k.s }
