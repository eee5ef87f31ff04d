package idemkey

import "context"

type ctxKey struct{}

// WithKey returns a copy of ctx carrying key, for the [Transport] to send.
// Compute the key once, before any retry loop, and pass the same context to
// every attempt. The zero Key hides any key ctx already carries, so requests
// under it are refused rather than sent with an outer operation's key.
func WithKey(ctx context.Context, key Key) context.Context {
	return context.WithValue(ctx, ctxKey{}, key)
}

// FromContext returns the key ctx carries. ok is false when there is none
// or it is the zero Key.
func FromContext(ctx context.Context) (key Key, ok bool) {
	key, _ = ctx.Value(ctxKey{}).(Key)
	return key, !key.IsZero()
}
