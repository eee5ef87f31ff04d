// Package gocronlock lets gocron v2 schedulers on several replicas run each
// job once at a time, using a [lock.Locker] ([lock.Advisory] or [lock.Lease]).
//
//	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billing"})
//	if err != nil {
//		return err
//	}
//	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(gocronlock.New(guard)))
//
// gocron passes the job's name as the lock name, so give every job a
// stable, distinct name with gocron.WithName.
//
// gocron runs the job with a context of its own, which this adapter cannot
// cancel: a lock lost while the job runs is only logged (by the Locker's
// logger). A job that must stop when the lock is lost should call
// [lock.Do] itself instead, which cancels the job's context with
// cause [lock.ErrLockLost].
package gocronlock

import (
	"context"
	"fmt"

	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/lock"
	"github.com/go-co-op/gocron/v2"
)

// Locker satisfies gocron.Locker.
type Locker struct {
	locker lock.Locker
}

var _ gocron.Locker = (*Locker)(nil)

// New returns a Locker that takes its locks from l: a [lock.Advisory], a
// [lock.Lease], or any [lock.Locker] of your own.
func New(l lock.Locker) *Locker { return &Locker{locker: l} }

// Lock takes the lock named key. It returns an error wrapping
// [lock.ErrNotAcquired] when another holder has it, which makes gocron skip
// this run. The returned lock is released by gocron after the job.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if l == nil || nilness.Is(l.locker) {
		return nil, fmt.Errorf("%w: gocronlock.New was given a nil Locker", lock.ErrInvalid)
	}
	h, err := l.locker.Lock(ctx, key)
	if err != nil {
		return nil, err
	}
	return h, nil
}
