package retry

import (
	"context"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v4"

	"github.com/billonce/billonce/idemkey"
)

// ExhaustedError is returned by [Do] when it gave up on an operation the
// classifier still wanted to retry: the attempt limit was reached, or the
// next attempt could not start within the time budget (or before the
// deadline of a [Decision.Until] that names no error). The last attempt's outcome is unknown to Do; resending
// later with the same key is safe while the key window is open.
type ExhaustedError struct {
	Attempts int   // attempts made
	Err      error // the last attempt's error
	why      string
}

func (e *ExhaustedError) Error() string {
	if e.why == "" {
		return fmt.Sprintf("retry: gave up after %s: %v", attempts(e.Attempts), e.Err)
	}
	return fmt.Sprintf("retry: gave up after %s (%s): %v", attempts(e.Attempts), e.why, e.Err)
}

func attempts(n int) string {
	if n == 1 {
		return "1 attempt"
	}
	return fmt.Sprintf("%d attempts", n)
}

// Unwrap returns the last attempt's error.
func (e *ExhaustedError) Unwrap() error { return e.Err }

// Do calls op until it succeeds, the policy's classifier says stop, the
// attempts or the time budget run out, or ctx is done. Every attempt receives
// the same key: op must send it and must not make another.
//
// Each attempt runs with a context derived from ctx whose deadline is the
// earlier of [Policy.AttemptTimeout] from now and the end of
// [Policy.MaxElapsed]. op must return when that context is done; Do does
// not abandon a running attempt.
//
// Do returns:
//   - op's value and nil on success;
//   - op's error as is when the classifier says [Stop];
//   - the error a [Decision.Until] names, when the next attempt could
//     not start before its deadline;
//   - an [*ExhaustedError] wrapping the last error when it gives up;
//   - an error wrapping ctx.Err() and the last error, if any, when ctx is
//     done (the classifier is not consulted then);
//   - an error wrapping [ErrInvalid], without calling op, when the key
//     is zero, op is nil or the policy is unusable.
//
// Do is safe for concurrent use; each call has its own backoff state.
func Do[T any](ctx context.Context, key idemkey.Key, p Policy, op func(ctx context.Context, key idemkey.Key) (T, error)) (T, error) {
	var zero T
	if key.IsZero() {
		return zero, fmt.Errorf("%w: zero idempotency key; derive the key with idemkey.For before calling Do", ErrInvalid)
	}
	if op == nil {
		return zero, fmt.Errorf("%w: nil op", ErrInvalid)
	}
	p, err := p.withDefaults()
	if err != nil {
		return zero, err
	}
	if err := ctx.Err(); err != nil {
		return zero, fmt.Errorf("retry: not started: %w", err)
	}

	end := time.Now().Add(p.MaxElapsed)
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(p.InitialInterval),
		backoff.WithMaxInterval(p.MaxInterval),
		backoff.WithMultiplier(multiplier),
		backoff.WithRandomizationFactor(jitter),
		backoff.WithMaxElapsedTime(0), // the budget is enforced below
	)
	for attempt := 1; ; attempt++ {
		deadline := time.Now().Add(p.AttemptTimeout)
		if end.Before(deadline) {
			deadline = end
		}
		v, err := run(ctx, key, op, deadline)
		if err == nil {
			return v, nil
		}
		if ctx.Err() != nil {
			return zero, fmt.Errorf("retry: stopped after %s: %w; last error: %w", attempts(attempt), ctx.Err(), err)
		}
		d := p.Classify(err)
		if !d.retry {
			return zero, err
		}
		if attempt >= p.MaxAttempts {
			return zero, &ExhaustedError{Attempts: attempt, Err: err, why: fmt.Sprintf("attempt limit %d reached", p.MaxAttempts)}
		}
		// A wait that would end past a deadline is not started: giving up
		// after it would overshoot the deadline by the wait.
		wait := max(min(b.NextBackOff(), p.MaxInterval), d.after)
		next := time.Now().Add(wait)
		switch {
		case !d.until.IsZero() && !d.until.After(end) && !next.Before(d.until):
			if d.past != nil {
				return zero, d.past
			}
			return zero, &ExhaustedError{Attempts: attempt, Err: err, why: "the classifier's deadline would pass"}
		case !next.Before(end):
			return zero, &ExhaustedError{Attempts: attempt, Err: err, why: fmt.Sprintf("time budget %v spent", p.MaxElapsed)}
		}
		if p.Notify != nil {
			p.Notify(Event{Key: key, Attempt: attempt, Err: err, Wait: wait})
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return zero, fmt.Errorf("retry: stopped after %s: %w; last error: %w", attempts(attempt), ctx.Err(), err)
		case <-t.C:
		}
	}
}

// run makes one attempt under its own deadline.
func run[T any](ctx context.Context, key idemkey.Key, op func(context.Context, idemkey.Key) (T, error), deadline time.Time) (T, error) {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	return op(ctx, key)
}
