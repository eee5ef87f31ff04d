// Package retry retries an operation that carries one fixed idempotency key.
//
// A retry that makes a new key for each attempt defeats idempotency: if the
// first request was committed and only its response was lost, the second
// request, under an unknown key, is a second charge. [Do] takes the key as
// an argument and hands the very same key to every attempt; the operation
// has no way to make another.
//
// # Calling Do
//
// Derive the key from business identity once, before any retry, then pass
// it to [Do] with a [Policy] and the operation:
//
//	key, err := idemkey.For("invoice", customerID, period)
//	if err != nil {
//		return err
//	}
//	charge, err := retry.Do(ctx, key, retry.Policy{}, func(ctx context.Context, key idemkey.Key) (*Charge, error) {
//		return client.Charge(ctx, key.String(), amount)
//	})
//
// The zero [Policy] retries plain network errors ([DefaultClassify]) up to
// [DefaultMaxAttempts] times, with exponential backoff and jitter from
// [DefaultInitialInterval] to [DefaultMaxInterval], each attempt bounded by
// [DefaultAttemptTimeout] and the whole call by [DefaultMaxElapsed].
//
// # Classifying errors
//
// [Policy.Classify] looks at an attempt's error and returns a [Decision]:
// [Again] to retry after the backoff, [After] to retry no sooner than a
// wait the server asked for, or [Stop] to return the error as is. A
// classifier for an HTTP API usually handles the status codes it knows and
// falls back to [DefaultClassify] for transport errors:
//
//	classify := func(err error) retry.Decision {
//		var apiErr *APIError
//		if errors.As(err, &apiErr) {
//			switch {
//			case apiErr.Status == 429:
//				return retry.After(2 * time.Second)
//			case apiErr.Status >= 500:
//				return retry.After(0)
//			}
//			return retry.Stop()
//		}
//		return retry.DefaultClassify(err)
//	}
//
// # Time limits
//
// Each attempt gets its own context deadline, [Policy.AttemptTimeout], so a
// hung request is cancelled and the next attempt, with the same key, can
// go out. The operation must honour its context: Do never abandons a running
// attempt, so two attempts of one call never overlap.
//
// [Policy.MaxElapsed] bounds the whole call. Do validates that it is shorter
// than [KeyWindow], the time for which the server is guaranteed to remember
// a key: a resend after that is a new request. A deadline is checked before
// each wait, not after it: when the next attempt could not start in time,
// Do gives up at once instead of waiting first. A classifier can set a
// deadline of its own for the call with [Decision.Until], and the error to
// give up with when it would pass.
//
// # Results
//
// Do tells apart the ways it can fail:
//
//   - the classifier said stop: the operation's own error, unchanged;
//   - retries ran out while the outcome was still unknown: an
//     [*ExhaustedError] with the attempt count, wrapping the last error;
//   - the caller's context is done: an error wrapping ctx.Err() and the
//     last attempt's error;
//   - the key is zero, the operation nil or the policy invalid: an error
//     wrapping [ErrInvalid], before the operation runs.
//
// After an [*ExhaustedError] the operation may or may not have taken
// effect. Resending later with the same key is safe while the key window is
// open; making a new key is not.
//
// # Logging
//
// [Policy.Notify] is called once per retry with an [Event]: the key, the
// attempt number, its error and the wait before the next attempt.
package retry
