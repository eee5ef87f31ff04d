package lock

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/billonce/billonce/internal/nilness"
)

// maxNameLen is the longest name or namespace, in bytes, that [Advisory]
// and [Lease] accept; the package docs state the rules for names.
const maxNameLen = 200

var (
	// ErrNotAcquired is returned by [Locker.Lock] when another holder has
	// the lock. [Do] reports the same condition as ran == false with a nil
	// error.
	ErrNotAcquired = errors.New("lock: another holder has the lock")

	// ErrLockLost is the cause of a guarded job's context, and is wrapped
	// by [Lock.Err], when the lock can no longer be confirmed: the
	// connection died, the lock is no longer held, or a lease could not be
	// renewed. Test for it with errors.Is(context.Cause(ctx), ErrLockLost).
	ErrLockLost = errors.New("lock: lock lost")

	// ErrInvalid is returned, wrapped, for bad input: an empty, oversized
	// or non-UTF-8 name or namespace, a nil database, job or guard, an
	// unusable setting. Nothing was locked.
	ErrInvalid = errors.New("lock: invalid input")
)

// A Locker takes named locks. [*Advisory] and [*Lease] are Lockers, and so
// is a lock of your own (Redis, etcd, a Kubernetes lease) with this one
// method: [Do], [Func], billing's RunOptions.Lock and package gocronlock take
// any Locker. The shape is gocron's Locker and Lock.
type Locker interface {
	// Lock takes the lock for name and returns it held, or an error
	// wrapping [ErrNotAcquired] when another holder has it. The caller must
	// Unlock it. Prefer [Do], which cancels the job when the lock is lost.
	Lock(ctx context.Context, name string) (Lock, error)
}

// A Lock is a lock this process holds, returned by [Locker.Lock].
type Lock interface {
	// Unlock releases the lock, even when ctx is cancelled. It returns an
	// error wrapping [ErrLockLost] if the lock had been lost or its release
	// could not be confirmed; either way this process no longer holds it.
	// Calls after the first return the first call's result.
	Unlock(ctx context.Context) error
	// Lost is closed when the lock is found lost while held: its
	// connection died, its lease could not be renewed. A Lock that cannot
	// tell returns nil.
	Lost() <-chan struct{}
	// Err returns nil until Lost is closed, and then an error wrapping
	// [ErrLockLost] that says why.
	Err() error
}

// A Fenced lock has a fencing token: a number that grows with every new
// holder of a name, so that a write can be refused when its holder has
// been replaced, even if that holder does not know it yet (a process that
// was paused past its lease). [Do] hands the token to the job, which reads
// it with [Token]. The Locks of [Advisory] and [Lease] are Fenced; a lock
// of your own may be too (an etcd revision, a counter incremented at each
// acquisition). The package documentation, under "Fencing tokens", says
// how a write checks a token.
type Fenced interface {
	Lock
	// Token returns the lock's fencing token. It does not change while
	// the lock is held; a later holder of the same name gets a greater
	// one.
	Token() int64
}

// tokenKey is the context key of the fencing token Do hands the job.
type tokenKey struct{}

// Token returns the fencing token of the lock held for the job that ctx
// belongs to: the context [Do] gives the job, or one derived from it. ok
// is false outside such a job, or when the job's lock is not [Fenced].
// When jobs nest, it is the token of the innermost one's lock.
func Token(ctx context.Context) (token int64, ok bool) {
	token, ok = ctx.Value(tokenKey{}).(int64)
	return token, ok
}

// Key returns the 64-bit advisory lock key for a name in a namespace: the
// first 8 bytes, read big-endian as a two's-complement int64, of
//
//	SHA-256( uint64be(len(namespace)) || namespace || uint64be(len(name)) || name )
//
// The length prefixes keep ("a:b", "c") and ("a", "b:c") apart. The function
// is part of the package's compatibility promise: the same namespace and
// name give the same key in every process and every version.
func Key(namespace, name string) int64 {
	h := sha256.New()
	var n [8]byte
	binary.BigEndian.PutUint64(n[:], uint64(len(namespace)))
	h.Write(n[:])
	h.Write([]byte(namespace))
	binary.BigEndian.PutUint64(n[:], uint64(len(name)))
	h.Write(n[:])
	h.Write([]byte(name))
	return int64(binary.BigEndian.Uint64(h.Sum(nil)[:8]))
}

func checkName(what, s string, mayBeEmpty bool) error {
	switch {
	case s == "" && !mayBeEmpty:
		return fmt.Errorf("%w: %s is empty; name the job, e.g. \"monthly-billing\"", ErrInvalid, what)
	case len(s) > maxNameLen:
		return fmt.Errorf("%w: %s is %d bytes; the limit is %d", ErrInvalid, what, len(s), maxNameLen)
	case !utf8.ValidString(s):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalid, what)
	case strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte, which PostgreSQL text cannot hold; check how it is built", ErrInvalid, what)
	}
	return nil
}

// errNilGuard is what a nil *Advisory or *Lease, or a nil Locker, returns.
func errNilGuard(what string) error {
	return fmt.Errorf("%w: a nil %s; check the error its constructor returned", ErrInvalid, what)
}

func loggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// loggerOf is the logger of an Advisory or a Lease, and slog.Default's for
// any other Locker.
func loggerOf(l Locker) *slog.Logger {
	if lg, ok := l.(interface{ log() *slog.Logger }); ok {
		return lg.log()
	}
	return slog.Default()
}

// held is the Lock of an Advisory or a Lease. While it is held, a
// background check confirms it periodically (advisory lock still granted,
// lease still renewed); when a check fails, Lost is closed and Err reports
// why.
type held struct {
	name   string
	token  int64         // the fencing token
	lost   chan struct{} // closed when a check fails
	err    error         // written before lost is closed
	stop   chan struct{} // closed by Unlock to end the checker
	done   chan struct{} // closed when the checker has returned
	logger *slog.Logger

	release    func(ctx context.Context, lost bool) error
	unlockOnce sync.Once
	unlockErr  error
}

// newHeld starts the checker: every interval, check runs with a timeout and
// must return nil for the lock to count as still held.
func newHeld(name string, token int64, interval, timeout time.Duration, logger *slog.Logger,
	check func(ctx context.Context) error, release func(ctx context.Context, lost bool) error) *held {
	h := &held{
		name:    name,
		token:   token,
		lost:    make(chan struct{}),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
		logger:  logger,
		release: release,
	}
	go h.watch(interval, timeout, check)
	return h
}

func (h *held) watch(interval, timeout time.Duration, check func(ctx context.Context) error) {
	defer close(h.done)
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-h.stop:
			return
		case <-t.C:
		}
		// The check is never interrupted by Unlock: Unlock waits for it, so
		// the connection is never used by two goroutines at once.
		ctx, cancel := context.WithTimeout(context.Background(), timeout)
		err := check(ctx)
		cancel()
		if err != nil {
			h.err = fmt.Errorf("%w: %q: %w", ErrLockLost, h.name, err)
			h.logger.Error("lock lost", "name", h.name, "err", err)
			close(h.lost)
			return
		}
	}
}

var _ Fenced = (*held)(nil)

// Lost is closed when the lock is found lost.
func (h *held) Lost() <-chan struct{} { return h.lost }

// Token returns the lock's fencing token.
func (h *held) Token() int64 { return h.token }

// Err returns nil while the lock is held, and an error wrapping
// [ErrLockLost] that says why once Lost is closed.
func (h *held) Err() error {
	select {
	case <-h.lost:
		return h.err
	default:
		return nil
	}
}

// Unlock stops the checks and releases the lock. It ignores the
// cancellation of ctx (release must happen even when the job was cancelled)
// but keeps its values. It returns an error wrapping [ErrLockLost] if the
// lock had been lost or its release could not be confirmed; either way the
// lock is no longer held by this process afterwards. Calls after the first
// return the first call's result.
func (h *held) Unlock(ctx context.Context) error {
	h.unlockOnce.Do(func() {
		close(h.stop)
		<-h.done
		ctx := context.WithoutCancel(ctx)
		lostErr := h.Err()
		err := h.release(ctx, lostErr != nil)
		switch {
		case lostErr != nil:
			h.unlockErr = lostErr
		case err != nil:
			h.unlockErr = fmt.Errorf("%w: %q: release not confirmed: %w", ErrLockLost, h.name, err)
			h.logger.Warn("lock release not confirmed", "name", h.name, "err", err)
		}
	})
	return h.unlockErr
}

// Do runs fn if this caller wins l's lock for name, and releases the lock
// when fn returns (or panics). If another holder has the lock, Do returns
// ran == false and a nil error without calling fn: that is not a failure.
// fn's context is cancelled with a cause wrapping [ErrLockLost] if the lock
// is lost while fn runs, and Do then returns an error wrapping ErrLockLost
// even if fn returned nil, so the loss is never silent. When the lock is
// [Fenced], fn's context carries its token: see [Token].
func Do(ctx context.Context, l Locker, name string, fn func(ctx context.Context) error) (ran bool, err error) {
	if nilness.Is(l) {
		return false, errNilGuard(fmt.Sprintf("%T", l))
	}
	if fn == nil {
		return false, fmt.Errorf("%w: nil job function for %q", ErrInvalid, name)
	}
	logger := loggerOf(l)
	h, err := l.Lock(ctx, name)
	if errors.Is(err, ErrNotAcquired) {
		logger.Debug("lock held elsewhere; job skipped", "name", name)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if nilness.Is(h) {
		return false, fmt.Errorf("lock: %T.Lock(%q) returned neither a lock nor an error", l, name)
	}
	jobCtx, cancel := context.WithCancelCause(ctx)
	if f, ok := h.(Fenced); ok {
		jobCtx = context.WithValue(jobCtx, tokenKey{}, f.Token())
	}
	finished := make(chan struct{})
	go func() {
		select {
		case <-h.Lost():
			cancel(lockLostErr(h, name))
		case <-finished:
		}
	}()
	defer func() {
		// Runs on return and on panic: stop the watcher, then release.
		close(finished)
		h.Unlock(ctx) // outcome logged by the lock; a lost lock is reported below
		cancel(nil)
		select {
		case <-h.Lost():
			if !errors.Is(err, ErrLockLost) {
				err = errors.Join(err, lockLostErr(h, name))
			}
		default:
		}
	}()
	logger.Debug("lock acquired; job running", "name", name)
	return true, fn(jobCtx)
}

// lockLostErr says why h was lost, wrapping ErrLockLost.
func lockLostErr(h Lock, name string) error {
	if err := h.Err(); errors.Is(err, ErrLockLost) {
		return err
	} else if err != nil {
		return fmt.Errorf("%w: %q: %w", ErrLockLost, name, err)
	}
	return fmt.Errorf("%w: %q", ErrLockLost, name)
}

// Func wraps fn as the func() job that robfig/cron (cron.FuncJob) and
// similar schedulers call: each call runs fn under [Do] with a context
// derived from ctx (cancel ctx to stop the job on shutdown), logs whether it
// ran, was skipped, failed or panicked (to the logger of an Advisory or a
// Lease, slog.Default for other Lockers), and recovers a panic so that the
// scheduler keeps running.
func Func(ctx context.Context, l Locker, name string, fn func(ctx context.Context) error) func() {
	if nilness.Is(l) {
		err := errNilGuard(fmt.Sprintf("%T", l))
		return func() { slog.Default().Error("scheduled job not run", "name", name, "err", err) }
	}
	logger := loggerOf(l)
	return func() {
		start := time.Now()
		defer func() {
			if p := recover(); p != nil {
				logger.Error("scheduled job panicked", "name", name, "panic", p, "stack", string(debug.Stack()))
			}
		}()
		ran, err := Do(ctx, l, name, fn)
		switch {
		case err != nil:
			logger.Error("scheduled job failed", "name", name, "ran", ran, "err", err, "duration", time.Since(start))
		case !ran:
			logger.Info("scheduled job skipped: another holder has the lock", "name", name)
		default:
			logger.Info("scheduled job done", "name", name, "duration", time.Since(start))
		}
	}
}

// pollUntil calls try until it reports success, fails, or wait has passed
// since the first try. wait == 0 means one try.
func pollUntil(ctx context.Context, wait time.Duration, try func() (bool, error)) (bool, error) {
	deadline := time.Now().Add(wait)
	for {
		ok, err := try()
		if ok || err != nil {
			return ok, err
		}
		left := time.Until(deadline)
		if left <= 0 {
			return false, nil
		}
		t := time.NewTimer(min(left, waitPoll))
		select {
		case <-ctx.Done():
			t.Stop()
			return false, context.Cause(ctx)
		case <-t.C:
		}
	}
}

// waitPoll is how often a Lock that waits (a Wait setting above zero)
// tries again.
const waitPoll = 100 * time.Millisecond
