package lock_test

import (
	"syscall"
	"testing"
	"time"

	"github.com/billonce/billonce/lock"
)

// A holder paused past its TTL (SIGSTOP here; a GC or VM pause alike)
// loses its lease to another process, and on resuming is told at its
// first renewal: its job's context is cancelled with ErrLockLost, and
// the side effects it made after the other process took the lease all
// fall within one renewal interval and round trip of its resuming. This
// is the limit the package documents: a lease excludes holders that keep
// running, not one the machine froze.
func TestLeasePausedHolderStopsAtFirstRenewal(t *testing.T) {
	pool, url := newPool(t, 0)
	mustExec(t, pool, `CREATE TABLE acquired (pid int, at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE effects (pid int, at timestamptz DEFAULT clock_timestamp())`)
	newLease(t, pool, lock.LeaseConfig{})
	const name = "monthly-billing:2026-09"
	const ttl = time.Second
	renew := ttl / 3 // LeaseConfig's default RenewInterval

	first := startHelper(t, "lease-job", url, name, ttl.String())
	pidA := first.Process.Pid
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA) > 0 })
	if err := first.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	second := startHelper(t, "lease-job", url, name, ttl.String())
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
	poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM cancelled WHERE pid = $1`, pidA) == 1 })

	var lost bool
	var cause string
	if err := pool.QueryRow(t.Context(), `SELECT lost, cause FROM cancelled WHERE pid = $1`, pidA).Scan(&lost, &cause); err != nil {
		t.Fatal(err)
	}
	if !lost {
		t.Fatalf("the paused holder's job was cancelled with %q; want ErrLockLost", cause)
	}
	var overlap int
	var last time.Time
	if err := pool.QueryRow(t.Context(), `SELECT count(*), coalesce(max(e.at), $2) FROM effects e, acquired a
		WHERE e.pid = $1 AND a.pid = $3 AND e.at > a.at`, pidA, resumedAt, pidB).Scan(&overlap, &last); err != nil {
		t.Fatal(err)
	}
	after := last.Sub(resumedAt)
	t.Logf("paused holder: %d side effects after the other process took the lease, the last %v after it resumed (renew interval %v); cancelled: %s",
		overlap, after.Round(time.Millisecond), renew, cause)
	if bound := renew + time.Second; after > bound {
		t.Fatalf("the paused holder went on %v after resuming; want at most its renewal interval and a round trip (%v)", after, bound)
	}
	// Only the second process goes on.
	n := count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA)
	poll(t, func() bool {
		return count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1 AND at > $2`, pidB, last) >= 10
	})
	if m := count(t, pool, `SELECT count(*) FROM effects WHERE pid = $1`, pidA); m != n {
		t.Fatalf("the paused holder made %d more side effects after its job was cancelled", m-n)
	}
}
