package billing

import (
	"cmp"
	"fmt"
	"sync"
	"time"

	"github.com/billonce/billonce/retry"
)

// Defaults of Config.UnreachableAttempts and Config.UnreachableAfter.
const (
	// defaultUnreachableAttempts is four rounds of a default Run's eight
	// workers: against a refused port a Run stops in about two seconds,
	// and a blip of a second or two is ridden out.
	defaultUnreachableAttempts = 32
	// defaultUnreachableAfter bounds the calls with few workers (a single
	// Charge, a Run with Concurrency 1): against a refused port a Charge
	// makes its last attempt within ten seconds of its first, instead of
	// retrying for its whole policy, and against an address that never
	// answers gives up after two attempt timeouts.
	defaultUnreachableAfter = 10 * time.Second
)

// reachability tells whether Stripe answers at all. It counts the attempts that
// got no HTTP answer in a row, across every call of a Biller (every worker
// of every Run); any answer starts the count again. See
// [ErrStripeUnreachable].
type reachability struct {
	attempts int           // misses in a row that make Stripe unreachable; 0: never
	after    time.Duration // time over which misses make it unreachable; 0: never
	gap      time.Duration // a pause longer than this between misses ends a streak

	mu     sync.Mutex
	misses int
	first  time.Time // when the first miss of the streak started
	last   time.Time // when the last miss ended
}

func newReachability(cfg *Config) *reachability {
	r := &reachability{attempts: cfg.UnreachableAttempts, after: cfg.UnreachableAfter}
	switch {
	case r.attempts == 0:
		r.attempts = defaultUnreachableAttempts
	case r.attempts < 0:
		r.attempts = 0
	}
	switch {
	case r.after == 0:
		r.after = defaultUnreachableAfter
	case r.after < 0:
		r.after = 0
	}
	// A retrying call comes back within the policy's longest wait; a
	// longer silence means nobody was trying, and the next miss starts a
	// streak of its own.
	r.gap = 2 * cmp.Or(cfg.Retry.MaxInterval, retry.DefaultMaxInterval)
	return r
}

// answered records an HTTP answer, whatever its status.
func (r *reachability) answered() {
	r.mu.Lock()
	r.misses = 0
	r.mu.Unlock()
}

// missed records an attempt, started at start, that got no HTTP answer.
// It returns the error that stops the call when Stripe is unreachable,
// wrapping cause, and when: with a zero by, Stripe is unreachable now;
// otherwise it will be by the time rule at by, if no answer comes first,
// and a retry that cannot start before by stops with err instead of
// waiting for it (see retry.Decision.Until). It returns nil when no rule
// applies yet.
func (r *reachability) missed(start time.Time, cause error) (by time.Time, err error) {
	now := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.misses == 0 || start.Sub(r.last) > r.gap {
		r.misses, r.first = 0, start
	}
	r.first = minTime(r.first, start)
	r.misses++
	r.last = now
	over := now.Sub(r.first)
	if r.attempts > 0 && r.misses >= r.attempts || r.after > 0 && r.misses >= 2 && over >= r.after {
		return time.Time{}, &unreachableError{misses: r.misses, over: over, cause: cause}
	}
	if r.after > 0 && r.misses >= 2 {
		return r.first.Add(r.after), &unreachableError{misses: r.misses, over: over, cause: cause}
	}
	return time.Time{}, nil
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

// unreachableError is [ErrStripeUnreachable] with what led to it; errors.As
// finds the last transport error.
type unreachableError struct {
	misses int
	over   time.Duration
	cause  error
}

func (e *unreachableError) Error() string {
	return fmt.Sprintf("%v: %d attempts in a row over %s got no HTTP answer (the last: %v): check the network, Config.StripeURL and any proxy; nothing more is sent, and the next run resumes the pending claims with their keys",
		ErrStripeUnreachable, e.misses, e.over.Round(time.Millisecond), e.cause)
}

func (e *unreachableError) Unwrap() []error { return []error{ErrStripeUnreachable, e.cause} }
