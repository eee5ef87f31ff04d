package lock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
	"github.com/jackc/pgx/v5/pgxpool"
)

// Environment of a helper process (the test binary re-executed).
const (
	envMode = "BILLONCE_LOCK_HELPER"
	envURL  = "BILLONCE_LOCK_HELPER_URL"
	envName = "BILLONCE_LOCK_HELPER_NAME"
	envArg  = "BILLONCE_LOCK_HELPER_ARG"
)

func TestMain(m *testing.M) {
	if os.Getenv(envMode) != "" {
		// A helper process: it talks to the parent's database and needs no
		// cluster of its own.
		os.Exit(m.Run())
	}
	pgtest.Main(m)
}

// startHelper re-executes the test binary as a helper process running mode.
func startHelper(t *testing.T, mode, url, name, arg string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$", "-test.v")
	cmd.Env = append(os.Environ(), envMode+"="+mode, envURL+"="+url, envName+"="+name, envArg+"="+arg)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	wait := func() { once.Do(func() { cmd.Wait() }) }
	t.Cleanup(func() {
		cmd.Process.Kill()
		wait()
		if t.Failed() {
			t.Logf("helper %s (pid %d) output:\n%s", mode, cmd.Process.Pid, out.String())
		}
	})
	return cmd
}

// TestHelperProcess is the body of the helper processes; it does nothing in
// a normal test run.
func TestHelperProcess(t *testing.T) {
	mode := os.Getenv(envMode)
	if mode == "" {
		t.Skip("runs only as a helper process")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv(envURL))
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	name := os.Getenv(envName)
	pid := os.Getpid()

	switch mode {
	case "race":
		// Wait at the barrier, then all start the guarded job at once. The
		// winner holds the lock until it sees the expected number of skips,
		// so every process tries while the lock is held.
		wantSkips, _ := strconv.Atoi(os.Getenv(envArg))
		g, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		mustExec(t, pool, `INSERT INTO ready (pid) VALUES ($1)`, pid)
		poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM start`) > 0 })
		ran, err := lock.Do(ctx, g, name, func(ctx context.Context) error {
			mustExec(t, pool, `INSERT INTO runs (pid) VALUES ($1)`, pid)
			poll(t, func() bool { return count(t, pool, `SELECT count(*) FROM skips`) >= wantSkips })
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if !ran {
			mustExec(t, pool, `INSERT INTO skips (pid) VALUES ($1)`, pid)
		}

	case "hold":
		// Hold the lock until the job's context is cancelled; report when
		// and why.
		g, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
		if err != nil {
			t.Fatal(err)
		}
		ran, err := lock.Do(ctx, g, name, func(ctx context.Context) error {
			mustExec(t, pool, `INSERT INTO held (pid) VALUES ($1)`, pid)
			<-ctx.Done()
			at := time.Now().UnixNano()
			cause := context.Cause(ctx)
			mustExec(t, pool, `INSERT INTO cancelled (pid, at_unix_nano, lost, cause) VALUES ($1, $2, $3, $4)`,
				pid, at, errors.Is(cause, lock.ErrLockLost), fmt.Sprint(cause))
			return ctx.Err()
		})
		if !ran || !errors.Is(err, lock.ErrLockLost) {
			t.Fatalf("Do = %v, %v; want ran and ErrLockLost", ran, err)
		}

	case "lease-hold":
		// Hold a short lease and never finish: the parent kills this
		// process, so the lease is no longer renewed.
		ttl, _ := time.ParseDuration(os.Getenv(envArg))
		g, err := lock.NewLease(pool, lock.LeaseConfig{TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		lock.Do(ctx, g, name, func(ctx context.Context) error {
			mustExec(t, pool, `INSERT INTO held (pid) VALUES ($1)`, pid)
			select {}
		})

	case "lease-fenced-job":
		// Take a short lease (waiting for it) and do a side effect every
		// 20ms, whatever the job's context says, each checking the lease's
		// fencing token in its own statement, until one is refused;
		// record each try. Then wait for the context to end and report
		// when and why.
		ttl, _ := time.ParseDuration(os.Getenv(envArg))
		g, err := lock.NewLease(pool, lock.LeaseConfig{TTL: ttl, Wait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		lock.Do(ctx, g, name, func(ctx context.Context) error {
			token, ok := lock.Token(ctx)
			if !ok {
				t.Fatal("the job's context has no fencing token")
			}
			mustExec(t, pool, `INSERT INTO acquired (pid) VALUES ($1)`, pid)
			for {
				// The try is recorded in the side effect's statement: a
				// pause cannot come between them.
				var done bool
				err := pool.QueryRow(context.Background(), `WITH effect AS (
						INSERT INTO effects (pid)
						SELECT $1 FROM `+lock.DefaultLeaseTable+` WHERE token = $2 FOR SHARE
						RETURNING true)
					INSERT INTO tries (pid, done) SELECT $1, EXISTS (SELECT FROM effect) RETURNING done`, pid, token).Scan(&done)
				if err != nil {
					t.Fatal(err)
				}
				if !done {
					break
				}
				time.Sleep(20 * time.Millisecond)
			}
			<-ctx.Done()
			cause := context.Cause(ctx)
			mustExec(t, pool, `INSERT INTO cancelled (pid, at_unix_nano, lost, cause) VALUES ($1, $2, $3, $4)`,
				pid, time.Now().UnixNano(), errors.Is(cause, lock.ErrLockLost), fmt.Sprint(cause))
			return ctx.Err()
		})

	default:
		t.Fatalf("unknown helper mode %q", mode)
	}
}

func mustExec(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) {
	tb.Helper()
	if _, err := pool.Exec(context.Background(), sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

func count(tb testing.TB, pool *pgxpool.Pool, sql string, args ...any) int {
	tb.Helper()
	var n int
	if err := pool.QueryRow(context.Background(), sql, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
	return n
}

// poll waits for cond, which watches another process or the database.
// It sets no deadline of its own: a condition never met is the test
// binary's timeout, with every goroutine's stack, never a machine too busy
// to meet it in time.
func poll(tb testing.TB, cond func() bool) {
	tb.Helper()
	for !cond() {
		time.Sleep(10 * time.Millisecond)
	}
}

// newPool returns a pool on a fresh database with the tables the tests and
// helper processes record into, and its URL.
func newPool(t *testing.T, maxConns int32) (*pgxpool.Pool, string) {
	t.Helper()
	url := pgtest.URL(t)
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	if maxConns > 0 {
		cfg.MaxConns = maxConns
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	mustExec(t, pool, `CREATE TABLE ready (pid int);
		CREATE TABLE start (go bool);
		CREATE TABLE runs (pid int, at timestamptz DEFAULT clock_timestamp());
		CREATE TABLE skips (pid int);
		CREATE TABLE held (pid int);
		CREATE TABLE cancelled (pid int, at_unix_nano bigint, lost bool, cause text)`)
	return pool, url
}

// advisoryLocks counts the advisory locks held in the database, optionally
// excluding one backend.
func advisoryLocks(t *testing.T, pool *pgxpool.Pool) int {
	t.Helper()
	return count(t, pool, `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND database =
		(SELECT oid FROM pg_database WHERE datname = current_database())`)
}
