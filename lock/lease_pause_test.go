package lock_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/billonce/billonce/lock"
)

// A holder paused past its TTL (SIGSTOP here; a GC or VM pause alike)
// loses its lease to another process. Once it resumes, its side effects
// are refused: each one checks the holder's fencing token against the
// lease row in the statement that makes it. The paused holder's job here
// is the worst case, one that never looks at its context and goes on
// until a side effect is refused; not one of its side effects lands after
// the other process took the lease.
func TestLeasePausedHolderWritesNothingAfterTakeover(t *testing.T) {
	pool, url := newPool(t, 0)
	mustExec(t, pool, `CREATE TABLE acquired (pid int, at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE effects (pid int, at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE tries (pid int, done bool, at timestamptz DEFAULT clock_timestamp())`)
	newLease(t, pool, lock.LeaseConfig{})
	const name = "monthly-billing:2026-09"
	const ttl = time.Second

	first := startHelper(t, "lease-fenced-job", url, name, ttl.String())
	pidA := first.Process.Pid
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA) > 0 })
	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second := startHelper(t, "lease-fenced-job", url, name, ttl.String())
	pidB := second.Process.Pid
	// The second process takes the lease once the paused one's expires.
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM acquired WHERE pid = $1`, pidB) == 1 })
	var resumedAt time.Time
	if err := pool.QueryRow(t.Context(), `SELECT clock_timestamp()`).Scan(&resumedAt); err != nil {
		t.Fatal(err)
	}
	if err := first.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	// The paused holder tries again once it resumes.
	poll(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM tries WHERE pid = $1 AND at > $2`, pidA, resumedAt) > 0
	})
	overlap := count(t, pool, `SELECT count(*) FROM effects e, acquired a WHERE e.pid = $1 AND a.pid = $2 AND e.at > a.at`, pidA, pidB)
	refused := count(t, pool, `SELECT count(*) FROM tries WHERE pid = $1 AND NOT done`, pidA)
	t.Logf("paused holder: %d side effects after the other process took the lease, %d refused", overlap, refused)
	if overlap != 0 {
		t.Fatalf("the paused holder made %d side effects after the other process took the lease; want 0", overlap)
	}
	if refused != 1 {
		t.Fatalf("the paused holder had %d side effects refused; want 1, after which it stops", refused)
	}

	// Its job's context is cancelled at its first renewal.
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM cancelled WHERE pid = $1`, pidA) == 1 })
	var lost bool
	var cause string
	if err := pool.QueryRow(t.Context(), `SELECT lost, cause FROM cancelled WHERE pid = $1`, pidA).Scan(&lost, &cause); err != nil {
		t.Fatal(err)
	}
	if !lost {
		t.Fatalf("the paused holder's job was cancelled with %q; want ErrLockLost", cause)
	}
	// Only the second process goes on.
	n := count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA)
	var last time.Time
	if err := pool.QueryRow(t.Context(), `SELECT max(at) FROM tries WHERE pid = $1`, pidA).Scan(&last); err != nil {
		t.Fatal(err)
	}
	poll(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1 AND at > $2`, pidB, last) >= 10
	})
	if m := count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA); m != n {
		t.Fatalf("the paused holder made %d more side effects after its job was cancelled", m-n)
	}
}
