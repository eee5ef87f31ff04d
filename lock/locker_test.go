package lock_test

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/billonce/billonce/lock"
)

// memLocker is a Locker of the test's own, as a Redis or etcd lock would
// be: lock.Do and lock.Func need nothing else from it.
type memLocker struct {
	mu   sync.Mutex
	held map[string]*memLock
}

type memLock struct {
	l    *memLocker
	name string
	lost chan struct{}
	once sync.Once
}

func (m *memLocker) Lock(ctx context.Context, name string) (lock.Lock, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.held[name] != nil {
		return nil, lock.ErrNotAcquired
	}
	h := &memLock{l: m, name: name, lost: make(chan struct{})}
	m.held[name] = h
	return h, nil
}

func (h *memLock) Unlock(context.Context) error {
	h.l.mu.Lock()
	defer h.l.mu.Unlock()
	if h.l.held[h.name] == h {
		delete(h.l.held, h.name)
	}
	return h.Err()
}

func (h *memLock) Lost() <-chan struct{} { return h.lost }

func (h *memLock) Err() error {
	select {
	case <-h.lost:
		return errors.New("the test took it away")
	default:
		return nil
	}
}

func (h *memLock) lose() { h.once.Do(func() { close(h.lost) }) }

// Do over a Locker of one's own: the second caller is turned away while the
// first holds the lock, and a lock found lost cancels the job with a cause
// wrapping ErrLockLost, which Do returns even though the job returned nil.
func TestDoOverYourOwnLocker(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := &memLocker{held: map[string]*memLock{}}
	ran, err := lock.Do(ctx, m, "job", func(ctx context.Context) error {
		other, err := lock.Do(ctx, m, "job", func(context.Context) error { return nil })
		if other || err != nil {
			t.Errorf("second Do while held: %v, %v; want false, nil", other, err)
		}
		m.mu.Lock()
		h := m.held["job"]
		m.mu.Unlock()
		h.lose()
		<-ctx.Done() // the job is cancelled once its lock is lost
		if !errors.Is(context.Cause(ctx), lock.ErrLockLost) {
			t.Errorf("cause %v; want ErrLockLost", context.Cause(ctx))
		}
		return nil
	})
	if !ran || !errors.Is(err, lock.ErrLockLost) {
		t.Fatalf("Do = %v, %v; want true and ErrLockLost", ran, err)
	}
	if ran, err := lock.Do(ctx, m, "job", func(context.Context) error { return nil }); !ran || err != nil {
		t.Fatalf("Do after release = %v, %v", ran, err)
	}
	var nilLocker *memLocker
	if _, err := lock.Do(ctx, nilLocker, "job", func(context.Context) error { return nil }); !errors.Is(err, lock.ErrInvalid) {
		t.Fatalf("Do over a nil *memLocker: %v; want ErrInvalid", err)
	}
}

// nothingLocker is a broken Locker: it returns neither a lock nor an error.
type nothingLocker struct{}

func (nothingLocker) Lock(context.Context, string) (lock.Lock, error) { return nil, nil }

// Do refuses to run a job under a lock it was not given, rather than run it
// unguarded.
func TestDoWithoutALockFromTheLocker(t *testing.T) {
	t.Parallel()
	ran, err := lock.Do(context.Background(), nothingLocker{}, "job", func(context.Context) error {
		t.Error("job ran without a lock")
		return nil
	})
	if ran || err == nil {
		t.Fatalf("Do = %v, %v; want false and an error", ran, err)
	}
}

// Two Leases on different tables do not see each other's leases; a table
// name that is not an identifier is refused before any SQL.
func TestLeaseTable(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	a := newLease(t, pool, lock.LeaseConfig{})
	b := newLease(t, pool, lock.LeaseConfig{Table: "other_leases"})
	ctx := context.Background()
	ha, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer ha.Unlock(ctx)
	hb, err := b.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("a Lease on another table: %v; want the lock", err)
	}
	defer hb.Unlock(ctx)
	var n int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM other_leases`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("other_leases holds %d rows (%v); want 1", n, err)
	}
	for _, bad := range []string{"x; DROP TABLE t", "1leases", "a.b"} {
		if _, err := lock.NewLease(pool, lock.LeaseConfig{Table: bad}); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("Table %q: %v; want ErrInvalid", bad, err)
		}
	}
}
