package retry

import (
	"errors"
	"fmt"
	"time"

	"github.com/billonce/billonce/idemkey"
)

// Defaults for the zero fields of a [Policy].
const (
	// DefaultInitialInterval is the backoff before the second attempt,
	// before jitter.
	DefaultInitialInterval = 500 * time.Millisecond
	// DefaultMaxInterval caps the backoff between two attempts.
	DefaultMaxInterval = 30 * time.Second
	// DefaultMaxAttempts is how many attempts Do makes at most, the first
	// one included.
	DefaultMaxAttempts = 8
	// DefaultAttemptTimeout bounds a single attempt.
	DefaultAttemptTimeout = 30 * time.Second
	// DefaultMaxElapsed is the total time budget of one Do call: attempts
	// and waits together.
	DefaultMaxElapsed = 2 * time.Minute
)

// KeyWindow is the shortest time an idempotency key is remembered by the
// server (Stripe keeps keys for at least 24 hours). Retrying with the same
// key after the window closes can create a second charge, so a
// [Policy.MaxElapsed] must be strictly shorter.
const KeyWindow = 24 * time.Hour

// The backoff grows by this factor per attempt and each wait is drawn at
// random within ±jitter of the current interval.
const (
	multiplier = 1.5
	jitter     = 0.5
)

// ErrInvalid is returned, wrapped, when [Do] is given a nil op or a policy
// that [Policy.Validate] refuses; the error says what to fix.
var ErrInvalid = errors.New("retry: invalid argument")

// Policy says when and how long [Do] retries. The zero Policy is valid: every
// zero field takes its Default* value.
type Policy struct {
	// Classify decides, from an attempt's error, whether to retry.
	// Defaults to DefaultClassify, which retries plain network errors only.
	// It is never called with nil, and never once the caller's context is
	// done.
	Classify func(error) Decision

	// InitialInterval is the backoff before the second attempt. The
	// interval grows by 1.5 per attempt, and each wait is drawn at random
	// within ±50% of it so that many callers do not retry in step.
	// Defaults to DefaultInitialInterval. Like MaxInterval and
	// AttemptTimeout, it must be shorter than KeyWindow.
	InitialInterval time.Duration

	// MaxInterval caps each backoff wait, jitter included. A wait asked
	// for with [After] is not capped by it. Defaults to DefaultMaxInterval.
	MaxInterval time.Duration

	// MaxAttempts is the maximum number of attempts, the first included;
	// 1 means no retry. Defaults to DefaultMaxAttempts.
	MaxAttempts int

	// AttemptTimeout bounds each attempt: the op receives a context whose
	// deadline is at most this far away. Defaults to DefaultAttemptTimeout.
	AttemptTimeout time.Duration

	// MaxElapsed is the total budget of one Do call, attempts and waits
	// together. No attempt runs past it and no wait is started that would
	// end after it: Do gives up before such a wait, not after it. A
	// classifier's [Decision.Until] sets a deadline of its own, checked
	// the same way. It must be shorter than KeyWindow. Defaults to
	// DefaultMaxElapsed.
	MaxElapsed time.Duration

	// Notify, if not nil, is called before each wait, once per retry, on
	// the goroutine that called Do. It is not called when Do gives up.
	Notify func(Event)
}

// Event describes one retry, for logging and metrics.
type Event struct {
	Key     idemkey.Key   // the key every attempt carries
	Attempt int           // the attempt that failed, counting from 1
	Err     error         // its error
	Wait    time.Duration // the wait before the next attempt
}

// Validate reports whether p can be used, with an error wrapping
// [ErrInvalid] that names the field to fix. Do validates the policy
// itself; Validate lets a caller check a policy once, when it is configured.
func (p Policy) Validate() error {
	_, err := p.withDefaults()
	return err
}

// withDefaults returns p with zero fields set to their defaults, or an error
// if a field is out of range.
func (p Policy) withDefaults() (Policy, error) {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{
		{"InitialInterval", p.InitialInterval},
		{"MaxInterval", p.MaxInterval},
		{"AttemptTimeout", p.AttemptTimeout},
		{"MaxElapsed", p.MaxElapsed},
	} {
		if f.d < 0 {
			return p, fmt.Errorf("%w: %s is %v; use a positive duration, or 0 for the default", ErrInvalid, f.name, f.d)
		}
		if f.d >= KeyWindow && f.name != "MaxElapsed" {
			// No wait or attempt may outlast the budget, which is below
			// the window; and backoff's jitter overflows on intervals of
			// decades, into waits of 0.
			return p, fmt.Errorf("%w: %s is %v, not shorter than the %v idempotency key window; use a duration well below MaxElapsed", ErrInvalid, f.name, f.d, KeyWindow)
		}
	}
	if p.MaxAttempts < 0 {
		return p, fmt.Errorf("%w: MaxAttempts is %d; use a positive count, or 0 for the default (%d)", ErrInvalid, p.MaxAttempts, DefaultMaxAttempts)
	}
	if p.MaxElapsed >= KeyWindow {
		return p, fmt.Errorf("%w: MaxElapsed is %v, not shorter than the %v idempotency key window; a retry after the window could charge twice, so use a budget well below it", ErrInvalid, p.MaxElapsed, KeyWindow)
	}
	if p.Classify == nil {
		p.Classify = DefaultClassify
	}
	if p.InitialInterval == 0 {
		p.InitialInterval = DefaultInitialInterval
	}
	if p.MaxInterval == 0 {
		p.MaxInterval = DefaultMaxInterval
	}
	if p.MaxAttempts == 0 {
		p.MaxAttempts = DefaultMaxAttempts
	}
	if p.AttemptTimeout == 0 {
		p.AttemptTimeout = DefaultAttemptTimeout
	}
	if p.MaxElapsed == 0 {
		p.MaxElapsed = DefaultMaxElapsed
	}
	if p.InitialInterval > p.MaxInterval {
		return p, fmt.Errorf("%w: InitialInterval %v is longer than MaxInterval %v; lower InitialInterval or raise MaxInterval", ErrInvalid, p.InitialInterval, p.MaxInterval)
	}
	return p, nil
}

// Decision is what a classifier tells [Do] to do after a failed attempt. The
// zero Decision is [Stop].
type Decision struct {
	retry bool
	after time.Duration
	until time.Time
	past  error
}

// Stop returns the decision to give up and return the attempt's error as is.
func Stop() Decision { return Decision{} }

// After returns the decision to retry, waiting at least d: the wait is the
// longer of d and the policy's backoff, so After(0) retries after the
// policy's backoff. d is not capped by
// [Policy.MaxInterval], but Do gives up rather than wait past
// [Policy.MaxElapsed]. Use it when the server says when to come back.
func After(d time.Duration) Decision { return Decision{retry: true, after: max(d, 0)} }

// Until returns d with a deadline of its own: Do makes the next attempt
// only if its wait ends before t, as for the end of [Policy.MaxElapsed],
// and otherwise gives up at once, without waiting, and returns err (an
// [*ExhaustedError] if err is nil). Use it for a limit the caller keeps
// beside the policy's, such as how long a server may go without
// answering. The zero t sets no deadline; Until does not make a Stop
// retry.
func (d Decision) Until(t time.Time, err error) Decision {
	if d.retry {
		d.until, d.past = t, err
	}
	return d
}

// Retry reports whether d asks for another attempt.
func (d Decision) Retry() bool { return d.retry }

// Wait returns the minimum wait d asks for; 0 means the policy's backoff.
func (d Decision) Wait() time.Duration { return d.after }

// String returns "stop", "again" or "after <wait>", followed by " until
// <deadline>" when d has one.
func (d Decision) String() string {
	s := "stop"
	switch {
	case !d.retry:
	case d.after == 0:
		s = "again"
	default:
		s = "after " + d.after.String()
	}
	if !d.until.IsZero() {
		s += " until " + d.until.Format(time.RFC3339Nano)
	}
	return s
}
