// Package lock makes sure that one replica at a time runs a scheduled job,
// such as the monthly billing run that every pod's cron fires at midnight.
//
// # Running a job on one replica
//
// Build a [Locker] once and run each job with [Do]:
//
//	locker, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billing", Logger: logger})
//	...
//	ran, err := lock.Do(ctx, locker, "monthly-billing:2026-09", func(ctx context.Context) error {
//		_, err := biller.Run(ctx, "2026-09", customers, nil)
//		return err
//	})
//
// The replica that wins the lock runs the job; the others get ran == false
// and a nil error: another holder has it, which is not a failure. By default
// Do tries once; AdvisoryConfig.Wait makes it keep trying for a while.
// (billing's RunOptions.Lock does this for a billing run.)
//
// A name, and a namespace, is at most 200 bytes of valid UTF-8 without NUL
// bytes; a name is not empty. Anything else is refused with [ErrInvalid]
// before any statement runs.
//
// The lock prevents overlap, not repetition: a replica whose tick comes
// after the winner has finished runs the job again. Make the job itself
// idempotent (billonce's claims do that for charges) or record completion
// per period.
//
// # Lost locks
//
// While the job runs, the lock is confirmed every AdvisoryConfig.CheckInterval
// (default [DefaultCheckInterval], one second). If the connection died or
// the lock is no longer held, the job's context is cancelled with a cause
// wrapping [ErrLockLost]:
//
//	if errors.Is(context.Cause(ctx), lock.ErrLockLost) { ... stop, another replica may start }
//
// Do then returns an error wrapping ErrLockLost even if the job returned
// nil, so the loss is never silent.
//
// # What one replica at a time means
//
// A lock excludes holders that keep running. A holder whose process is
// paused (SIGSTOP, a long garbage-collection or virtual-machine pause)
// cannot be told anything while it is paused. With [Advisory], the lock
// lives as long as the session, so a paused holder keeps it unless its
// connection dies. With [Lease], a holder paused past LeaseConfig.TTL
// loses the lease to the next replica that asks, and, once it resumes,
// goes on with its job until its first renewal fails: at most
// LeaseConfig.RenewInterval and one round trip to the database. Its job's
// context is then cancelled with [ErrLockLost]. Its writes in that
// interval are refused if they check its fencing token, from the moment
// the other replica took the lease.
//
// # Fencing tokens
//
// Every Lock of an Advisory or a Lease has a fencing token ([Fenced]): a
// number that grows with every new holder of a name and stays the same
// while one holder keeps the lock. It is the PostgreSQL transaction id
// (xid8) of the statement that took the lock, which is unique and only
// grows on a database cluster. [Do] hands it to the job:
//
//	token, ok := lock.Token(ctx) // ok is false outside a job Do runs
//
// A write made on the holder's behalf checks the token in its own
// statement, so that once another holder has taken the lock the write is
// refused, however late the paused holder finds out. A lease keeps its
// token in its row (column token); a write in the same database checks
// that the row still carries it, with FOR SHARE so that a takeover waits
// for the write to commit, or the write waits for the takeover and then
// finds the row changed:
//
//	tag, err := pool.Exec(ctx, `INSERT INTO exports (period, file)
//		SELECT $2, $3 FROM billonce_lock_leases WHERE token = $1 FOR SHARE`,
//		token, period, file)
//	if err == nil && tag.RowsAffected() == 0 {
//		return errors.New("another replica holds the lock now: stop")
//	}
//
// An UPDATE or DELETE adds AND EXISTS (SELECT FROM billonce_lock_leases
// WHERE token = $1 FOR SHARE) to its WHERE clause. A released lease has
// no row, so a write after the release is refused too; a lease that
// expired and that nobody has taken over keeps its row, and its holder's
// writes still pass, as no other holder exists. Use [Lease.Table] where
// LeaseConfig.Table is set.
//
// An advisory lock has no row to check. Its token guards writes through
// a fence row of your own, which keeps the highest token seen for the
// name and refuses a lower one, in the statement that writes:
//
//	CREATE TABLE export_fences (name text PRIMARY KEY, token bigint NOT NULL);
//
//	WITH fence AS (
//		INSERT INTO export_fences (name, token) VALUES ($1, $2)
//		ON CONFLICT (name) DO UPDATE SET token = excluded.token
//		WHERE export_fences.token <= excluded.token
//		RETURNING 1)
//	INSERT INTO exports (period, file) SELECT $3, $4 FROM fence
//
// This works for any store that compares numbers, and with any Fenced
// lock, but refuses an old holder only once the new one has written: its
// first write takes the fence. An advisory lock is held by its session,
// which the server keeps while the process is paused, so another replica
// gets it only once the connection is gone. Where that cannot be ruled
// out (a machine cut off, a virtual machine frozen past the server's TCP
// keepalive), fence such writes, or use a Lease.
//
// billing's RunOptions.Lock does this for billonce's own writes: under a
// Lease, a run's claims check its token against the lease row, so a run
// whose lease was taken over claims nothing more and stops, before
// anything more is sent to Stripe.
//
// Tokens hold once every replica runs a billonce that sets them: an
// earlier one takes a lease over without changing its token.
//
// # Advisory lock or lease row
//
// [Advisory] uses a PostgreSQL session advisory lock. It needs no table,
// is released by the server the moment the session ends, and is the right
// choice when the application talks to PostgreSQL directly (or through
// PgBouncer in session mode). Each acquisition takes one connection out of
// the pool for good and closes it afterwards.
//
// [Lease] keeps a row per name with an owner, a fencing token and an
// expiry (lock_until) on the database clock, renewed while the job runs.
// Choose it when the application reaches PostgreSQL through PgBouncer (or
// another pooler) in transaction mode, where session state, advisory locks
// included, does not survive from one statement to the next, or when
// writes must be fenced against a holder that was paused. A holder that
// dies is replaced after at most LeaseConfig.TTL. LeaseConfig.Table names
// the table (billonce_lock_leases by default). It is migrated as the claim
// table is (package claim's documentation, under Migrations, says how):
// [Lease.Migrate] at start-up from every replica, or the files of the
// package's migrations directory applied with psql or a migration tool,
// which list themselves in billonce_lock_leases_migrations.
//
// For a short critical section inside a transaction you already have,
// [TryXact] takes a transaction-scoped advisory lock that ends with the
// transaction; it works in every pooling mode.
//
// # Bugs this package avoids
//
//   - Unlocking through a pool: pg_advisory_unlock run on a different pooled
//     connection than the lock silently does nothing, and the lock stays
//     with a connection that goes back to the pool. Here the lock, its
//     checks and its release all use one connection that never returns to
//     the pool; if the release cannot be confirmed, the connection is
//     closed, which makes the server drop the lock.
//   - Re-entrant session locks: a pooled connection that already holds a
//     lock gets it again for an unrelated caller. Here every acquisition has
//     a session (or a lease owner token) of its own, so a second Do for the
//     same name in the same process is refused.
//   - 31-bit keys: Math.abs(hashCode()) collides often and is negative for
//     one input. [Key] is a documented 64-bit hash of the namespace and name,
//     frozen across versions.
//   - Silently lost locks: a dropped connection ends the lock but not the
//     job. Here the job's context is cancelled.
//   - Session locks behind a transaction pooler: use [Lease].
//
// # Your own lock
//
// [Locker] is one method, Lock(ctx, name) (Lock, error), returning a [Lock]
// with Unlock, Lost and Err: the shape of gocron's Locker and Lock. A lock
// on Redis, etcd or a Kubernetes lease that implements it works with [Do],
// [Func], billing's RunOptions.Lock and gocronlock alike. Return an error
// wrapping [ErrNotAcquired] when another holder has the lock, and close
// Lost when the lock is found lost (or return a nil channel if your lock
// cannot tell: Do then cannot cancel the job). A Lock with a fencing
// token (an etcd revision, a counter incremented at each acquisition)
// adds Token() int64 ([Fenced]), and Do hands it to the job; billing's
// runs check only a Lease's.
//
// # Schedulers
//
// [Func] wraps a job as the func() that robfig/cron (cron.FuncJob) and
// similar schedulers call. The subpackage gocronlock adapts a Locker to
// gocron v2's Locker. Neither forces a scheduler dependency on this
// package.
package lock
