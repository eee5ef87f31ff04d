package lock_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/lock"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Honest locks: three replicas start the same job at once; exactly one runs it. A
// later start, after it finished, runs it again.
func TestAdvisoryThreeProcessesOneRuns(t *testing.T) {
	t.Parallel()
	pool, url := newPool(t, 0)
	const name = "monthly-billing:2026-09"
	var cmds []interface{ Wait() error }
	for range 3 {
		cmds = append(cmds, startHelper(t, "race", url, name, "2"))
	}
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM ready`) == 3 })
	mustExec(t, pool, `INSERT INTO start VALUES (true)`)
	for i, c := range cmds {
		if err := c.Wait(); err != nil {
			t.Fatalf("helper %d: %v", i, err)
		}
	}
	if runs, skips := count(t, pool, `SELECT count(*) FROM runs`), count(t, pool, `SELECT count(*) FROM skips`); runs != 1 || skips != 2 {
		t.Fatalf("runs = %d, skips = %d; want exactly 1 run and 2 skips", runs, skips)
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Fatalf("%d advisory locks still held after the job finished", n)
	}

	// A later start (next tick, another replica) runs it again.
	later := startHelper(t, "race", url, name, "0")
	if err := later.Wait(); err != nil {
		t.Fatalf("later helper: %v", err)
	}
	if runs := count(t, pool, `SELECT count(*) FROM runs`); runs != 2 {
		t.Fatalf("runs = %d after a later start; want 2", runs)
	}
}

// Honest locks: terminating the holder's backend cancels the job in another process
// with cause ErrLockLost, and the lock becomes free for others.
func TestAdvisoryKilledBackendCancelsJobInOtherProcess(t *testing.T) {
	t.Parallel()
	pool, url := newPool(t, 0)
	const name = "nightly-reconcile"
	holder := startHelper(t, "hold", url, name, "")
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM held`) == 1 })

	backend := lockHolderBackend(t, pool, "", name)
	killedAt := time.Now()
	mustExec(t, pool, `SELECT pg_terminate_backend($1)`, backend)

	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM cancelled`) == 1 })
	var atNano int64
	var lost bool
	var cause string
	if err := pool.QueryRow(context.Background(), `SELECT at_unix_nano, lost, cause FROM cancelled`).Scan(&atNano, &lost, &cause); err != nil {
		t.Fatal(err)
	}
	latency := time.Unix(0, atNano).Sub(killedAt)
	t.Logf("backend kill -> job context cancelled in the holder process: %v (CheckInterval %v); cause: %s",
		latency, lock.DefaultCheckInterval, cause)
	if !lost {
		t.Fatalf("cause %q does not wrap ErrLockLost", cause)
	}
	if latency > lock.DefaultCheckInterval+5*time.Second {
		t.Fatalf("cancelled %v after the kill; want within the check interval %v (+5s slack)", latency, lock.DefaultCheckInterval)
	}
	if err := holder.Wait(); err != nil {
		t.Fatalf("holder: %v", err)
	}

	g := newAdvisory(t, pool, lock.AdvisoryConfig{Wait: 10 * time.Second})
	ran, err := lock.Do(context.Background(), g, name, func(context.Context) error { return nil })
	if !ran || err != nil {
		t.Fatalf("after the kill, Do = %v, %v; want the lock to be free", ran, err)
	}
}

// Honest locks, the same in one process, where the time from kill to cancellation is
// measured on one clock; Do reports the loss even when the job returns nil.
func TestAdvisoryKilledBackendCancelsJob(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	const name = "weekly-report"
	const interval = 200 * time.Millisecond
	g := newAdvisory(t, pool, lock.AdvisoryConfig{CheckInterval: interval})

	running := make(chan struct{})
	cancelledAt := make(chan time.Time, 1)
	var cause error
	type result struct {
		ran bool
		err error
	}
	done := make(chan result, 1)
	go func() {
		ran, err := lock.Do(context.Background(), g, name, func(ctx context.Context) error {
			close(running)
			<-ctx.Done()
			cancelledAt <- time.Now()
			cause = context.Cause(ctx)
			return nil
		})
		done <- result{ran, err}
	}()
	<-running

	// Meanwhile nobody else gets it.
	other := newAdvisory(t, pool, lock.AdvisoryConfig{})
	if ran, err := lock.Do(context.Background(), other, name, func(context.Context) error { return nil }); ran || err != nil {
		t.Fatalf("second holder: Do = %v, %v; want ran=false, nil", ran, err)
	}

	backend := lockHolderBackend(t, pool, "", name)
	killedAt := time.Now()
	mustExec(t, pool, `SELECT pg_terminate_backend($1)`, backend)
	latency := (<-cancelledAt).Sub(killedAt)
	t.Logf("backend kill -> job context cancelled: %v (CheckInterval %v)", latency, interval)
	res := <-done
	if !errors.Is(cause, lock.ErrLockLost) {
		t.Fatalf("context cause = %v; want ErrLockLost", cause)
	}
	if !res.ran || !errors.Is(res.err, lock.ErrLockLost) {
		t.Fatalf("Do = %v, %v; want ran and an error wrapping ErrLockLost", res.ran, res.err)
	}
	if latency > interval+5*time.Second {
		t.Fatalf("cancelled %v after the kill; want within %v (+5s slack)", latency, interval)
	}

	g2 := newAdvisory(t, pool, lock.AdvisoryConfig{Wait: 10 * time.Second})
	if ran, err := lock.Do(context.Background(), g2, name, func(context.Context) error { return nil }); !ran || err != nil {
		t.Fatalf("after the kill, Do = %v, %v; want the lock to be free", ran, err)
	}
}

// Honest locks: after many guarded runs on a small pool, including jobs that fail,
// panic or are cancelled, and runs that lose the race, no connection of the
// pool holds an advisory lock (and none is held anywhere).
func TestAdvisoryPoolNeverGetsALockedConnection(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 2)
	g := newAdvisory(t, pool, lock.AdvisoryConfig{})
	errJob := errors.New("job failed")
	ctx := context.Background()
	var ranCount, skipped int
	var mu sync.Mutex

	for i := range 200 {
		name := "job-" + strconv.Itoa(i%7)
		switch i % 6 {
		case 0: // succeeds, and uses the pool itself
			ran, err := lock.Do(ctx, g, name, func(ctx context.Context) error {
				_, err := pool.Exec(ctx, `SELECT 1`)
				return err
			})
			if !ran || err != nil {
				t.Fatalf("run %d: Do = %v, %v", i, ran, err)
			}
		case 1: // fails
			if ran, err := lock.Do(ctx, g, name, func(context.Context) error { return errJob }); !ran || !errors.Is(err, errJob) {
				t.Fatalf("run %d: Do = %v, %v; want the job's error", i, ran, err)
			}
		case 2: // panics: the panic propagates after the lock is released
			func() {
				defer func() {
					if p := recover(); p != "boom" {
						t.Fatalf("run %d: recovered %v; want the job's panic", i, p)
					}
				}()
				lock.Do(ctx, g, name, func(context.Context) error { panic("boom") })
			}()
		case 3: // cancelled before it starts
			cctx, cancel := context.WithCancel(ctx)
			cancel()
			if ran, err := lock.Do(cctx, g, name, func(context.Context) error { return nil }); ran || !errors.Is(err, context.Canceled) {
				t.Fatalf("run %d: Do = %v, %v; want not run, context.Canceled", i, ran, err)
			}
		case 4: // cancelled while it runs
			cctx, cancel := context.WithCancel(ctx)
			ran, err := lock.Do(cctx, g, name, func(ctx context.Context) error {
				cancel()
				<-ctx.Done()
				return ctx.Err()
			})
			if !ran || !errors.Is(err, context.Canceled) {
				t.Fatalf("run %d: Do = %v, %v; want context.Canceled", i, ran, err)
			}
		case 5: // three at once on one name: some lose
			var wg sync.WaitGroup
			for range 3 {
				wg.Go(func() {
					ran, err := lock.Do(ctx, g, name, func(ctx context.Context) error {
						_, err := pool.Exec(ctx, `SELECT pg_sleep(0.005)`)
						return err
					})
					if err != nil {
						t.Errorf("run %d: %v", i, err)
					}
					mu.Lock()
					if ran {
						ranCount++
					} else {
						skipped++
					}
					mu.Unlock()
				})
			}
			wg.Wait()
		}
	}
	t.Logf("concurrent rounds: %d ran, %d skipped", ranCount, skipped)

	if n := advisoryLocks(t, pool); n != 0 {
		t.Fatalf("%d advisory locks held after the runs; want 0", n)
	}
	if total := pool.Stat().TotalConns(); total > 2 {
		t.Fatalf("pool has %d connections; want at most MaxConns 2", total)
	}
	// Every connection the pool can hand out holds nothing.
	conns := make([]*pgxpool.Conn, 2)
	for i := range conns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns[i] = c
	}
	for _, c := range conns {
		var n int
		if err := c.QueryRow(ctx, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		if n != 0 {
			t.Fatalf("pooled backend %d holds %d advisory locks", c.Conn().PgConn().PID(), n)
		}
		c.Release()
	}
}

// Session locks are re-entrant: a naive guard that takes the lock on a
// pooled connection already holding it lets a second caller in. Here a
// second Do on the same name from the same process is refused.
func TestAdvisoryNotReentrant(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 1)
	g := newAdvisory(t, pool, lock.AdvisoryConfig{})
	ctx := context.Background()
	var inner bool
	ran, err := lock.Do(ctx, g, "job", func(ctx context.Context) error {
		ran, err := lock.Do(ctx, g, "job", func(context.Context) error { inner = true; return nil })
		if ran || err != nil {
			return fmt.Errorf("nested Do = %v, %v; want ran=false, nil", ran, err)
		}
		if _, err := g.Lock(ctx, "job"); !errors.Is(err, lock.ErrNotAcquired) {
			return fmt.Errorf("nested Acquire error = %v; want ErrNotAcquired", err)
		}
		return nil
	})
	if !ran || err != nil || inner {
		t.Fatalf("Do = %v, %v, inner ran = %v", ran, err, inner)
	}
}

// Wait makes Acquire keep trying until the holder is done, or give up.
func TestAdvisoryWait(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	holder := newAdvisory(t, pool, lock.AdvisoryConfig{})
	h, err := holder.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	short := newAdvisory(t, pool, lock.AdvisoryConfig{Wait: 150 * time.Millisecond})
	if ran, err := lock.Do(ctx, short, "job", func(context.Context) error { return nil }); ran || err != nil {
		t.Fatalf("Do with a short wait = %v, %v; want ran=false, nil", ran, err)
	}

	long := newAdvisory(t, pool, lock.AdvisoryConfig{Wait: 30 * time.Second})
	done := make(chan error, 1)
	go func() {
		ran, err := lock.Do(ctx, long, "job", func(context.Context) error { return nil })
		if !ran && err == nil {
			err = errors.New("did not run")
		}
		done <- err
	}()
	if err := h.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("waiting Do: %v", err)
	}
}

func TestTryXact(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	tx1, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx1.Rollback(ctx)
	if ok, err := lock.TryXact(ctx, tx1, "billing", "customer-42"); !ok || err != nil {
		t.Fatalf("first TryXact = %v, %v; want true", ok, err)
	}
	tryOther := func() bool {
		t.Helper()
		var ok bool
		err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			var err error
			ok, err = lock.TryXact(ctx, tx, "billing", "customer-42")
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		return ok
	}
	if tryOther() {
		t.Fatal("a second transaction got the lock the first holds")
	}
	if ok, _ := lock.TryXact(ctx, tx1, "billing", "customer-43"); !ok {
		t.Fatal("another name should be free")
	}
	if err := tx1.Commit(ctx); err != nil {
		t.Fatal(err)
	}
	if !tryOther() {
		t.Fatal("the lock was not released when the transaction ended")
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Fatalf("%d advisory locks outlived their transactions", n)
	}
}

func newAdvisory(t *testing.T, pool *pgxpool.Pool, cfg lock.AdvisoryConfig) *lock.Advisory {
	t.Helper()
	g, err := lock.NewAdvisory(pool, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return g
}

// lockHolderBackend returns the pid of the backend holding the session
// advisory lock for namespace and name.
func lockHolderBackend(t *testing.T, pool *pgxpool.Pool, namespace, name string) int {
	t.Helper()
	u := uint64(lock.Key(namespace, name))
	var pid int
	err := pool.QueryRow(context.Background(), `SELECT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND classid = $1::bigint::oid AND objid = $2::bigint::oid AND objsubid = 1`,
		int64(u>>32), int64(u&0xffffffff)).Scan(&pid)
	if err != nil {
		t.Fatalf("finding the lock holder's backend: %v", err)
	}
	return pid
}
