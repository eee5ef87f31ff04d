package lock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
	"github.com/billonce/billonce/lock/gocronlock"
)

// The keys are frozen: changing them would let an old and a new version of
// a replica run the same job at once. The values were checked against an
// independent implementation (Python hashlib).
func TestKeyFrozen(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		namespace, name string
		key             int64
	}{
		{"", "", 3983162290893594069},
		{"", "monthly-billing", -3097664530769235991},
		{"billonce", "monthly-billing:2026-09", -7794995977204650905},
		{"a:b", "c", -8615360286647923326},
		{"a", "b:c", -157609087115394744},
		{"billing", "nightly-reconcile", 2274653109730150850},
	} {
		if got := lock.Key(tc.namespace, tc.name); got != tc.key {
			t.Errorf("Key(%q, %q) = %d; want %d", tc.namespace, tc.name, got, tc.key)
		}
	}
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	ctx := context.Background()
	job := func(context.Context) error { t.Error("job ran on bad input"); return nil }

	t.Run("constructors", func(t *testing.T) {
		for _, tc := range []struct {
			name string
			new  func() error
		}{
			{"nil pool", func() error { _, err := lock.NewAdvisory(nil, lock.AdvisoryConfig{}); return err }},
			{"negative check interval", func() error {
				_, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{CheckInterval: -time.Second})
				return err
			}},
			{"tiny check interval", func() error {
				_, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{CheckInterval: time.Nanosecond})
				return err
			}},
			{"negative wait", func() error { _, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Wait: -1}); return err }},
			{"nil db", func() error { _, err := lock.NewLease(nil, lock.LeaseConfig{}); return err }},
			{"negative TTL", func() error { _, err := lock.NewLease(pool, lock.LeaseConfig{TTL: -time.Second}); return err }},
			{"negative renew", func() error { _, err := lock.NewLease(pool, lock.LeaseConfig{RenewInterval: -time.Second}); return err }},
			{"renew over half TTL", func() error {
				_, err := lock.NewLease(pool, lock.LeaseConfig{TTL: time.Second, RenewInterval: 600 * time.Millisecond})
				return err
			}},
			{"lease negative wait", func() error { _, err := lock.NewLease(pool, lock.LeaseConfig{Wait: -1}); return err }},
		} {
			err := tc.new()
			if !errors.Is(err, lock.ErrInvalid) {
				t.Errorf("%s: error = %v; want ErrInvalid", tc.name, err)
			}
		}
		if _, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: strings.Repeat("n", lock.MaxNameLen+1)}); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("oversized namespace: error = %v; want ErrInvalid", err)
		}
		if _, err := lock.NewLease(pool, lock.LeaseConfig{Namespace: "nul\x00"}); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("namespace with a NUL byte: error = %v; want ErrInvalid", err)
		}
	})

	adv, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lease, err := lock.NewLease(pool, lock.LeaseConfig{})
	if err != nil {
		t.Fatal(err)
	}
	for _, g := range []lock.Locker{adv, lease} {
		for _, name := range []string{"", strings.Repeat("x", lock.MaxNameLen+1), "bad\xffutf8", "nul\x00byte"} {
			if ran, err := lock.Do(ctx, g, name, job); ran || !errors.Is(err, lock.ErrInvalid) {
				t.Errorf("%T.Do(%q) = %v, %v; want ErrInvalid", g, name, ran, err)
			}
		}
		if ran, err := lock.Do(ctx, g, "job", nil); ran || !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%T.Do with nil fn = %v, %v; want ErrInvalid", g, ran, err)
		}
	}
	if _, err := lock.TryXact(ctx, nil, "", "job"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("TryXact(nil tx) error = %v; want ErrInvalid", err)
	}
	tx, err := pool.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(ctx)
	if _, err := lock.TryXact(ctx, tx, "", ""); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("TryXact empty name error = %v; want ErrInvalid", err)
	}
	if _, err := gocronlock.New(nil).Lock(ctx, "job"); !errors.Is(err, lock.ErrInvalid) {
		t.Errorf("gocronlock with nil guard: error = %v; want ErrInvalid", err)
	}
}

// A nil *Advisory or *Lease (what `guard, _ := lock.NewAdvisory(nil, ...)`
// leaves behind), a nil pool behind the DB interface or a nil transaction
// behind pgx.Tx is refused with ErrInvalid, never a panic.
func TestNilGuardsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	job := func(context.Context) error { t.Error("job ran"); return nil }
	noPanic := func(f func() error) (err error) {
		defer func() {
			if p := recover(); p != nil {
				err = fmt.Errorf("panicked: %v", p)
			}
		}()
		return f()
	}
	var (
		adv   *lock.Advisory
		lease *lock.Lease
	)
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"nil *Advisory Do", func() error { _, err := lock.Do(ctx, adv, "job", job); return err }},
		{"nil *Advisory Acquire", func() error { _, err := adv.Lock(ctx, "job"); return err }},
		{"nil *Lease Do", func() error { _, err := lock.Do(ctx, lease, "job", job); return err }},
		{"nil *Lease Acquire", func() error { _, err := lease.Lock(ctx, "job"); return err }},
		{"nil *Lease Migrate", func() error { return lease.Migrate(ctx) }},
		{"Guard holding a nil *Advisory", func() error { var g lock.Locker = adv; _, err := lock.Do(ctx, g, "job", job); return err }},
		{"gocronlock on a nil *Advisory", func() error { _, err := gocronlock.New(adv).Lock(ctx, "job"); return err }},
		{"NewLease on a nil *pgxpool.Pool", func() error { _, err := lock.NewLease((*pgxpool.Pool)(nil), lock.LeaseConfig{}); return err }},
		{"TryXact on a nil *pgxpool.Tx", func() error { _, err := lock.TryXact(ctx, (*pgxpool.Tx)(nil), "", "job"); return err }},
	} {
		if err := noPanic(tc.call); !errors.Is(err, lock.ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", tc.name, err)
		}
	}
	// Func cannot return an error: its job logs one and runs nothing.
	for _, f := range []func() func(){
		func() func() { return lock.Func(ctx, adv, "job", job) },
		func() func() { return lock.Func(ctx, lease, "job", job) },
	} {
		if err := noPanic(func() error { f()(); return nil }); err != nil {
			t.Errorf("Func on a nil guard: %v", err)
		}
	}
}

// A closed pool is an error, not "another holder has it".
func TestClosedPool(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	g := newAdvisory(t, pool, lock.AdvisoryConfig{})
	pool.Close()
	ran, err := lock.Do(context.Background(), g, "job", func(context.Context) error { return nil })
	if ran || err == nil {
		t.Fatalf("Do on a closed pool = %v, %v; want an error", ran, err)
	}
	t.Logf("closed pool: %v", err)
}

// Func runs the job under the lock, logs each outcome through the injected
// logger, and turns a panic into a log line after releasing the lock.
func TestFuncLogsOutcomes(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	var buf bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelInfo}))
	g := newAdvisory(t, pool, lock.AdvisoryConfig{Logger: logger})
	ctx := context.Background()
	runs := 0

	lock.Func(ctx, g, "ok", func(context.Context) error { runs++; return nil })()
	lock.Func(ctx, g, "fails", func(context.Context) error { return errors.New("card network down") })()
	lock.Func(ctx, g, "panics", func(context.Context) error { panic("boom") })()
	h, err := g.Lock(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	lock.Func(ctx, g, "busy", func(context.Context) error { runs++; return nil })()
	h.Unlock(ctx)

	if runs != 1 {
		t.Errorf("job ran %d times; want 1", runs)
	}
	out := buf.String()
	for _, want := range []string{
		`msg="scheduled job done" name=ok`,
		`msg="scheduled job failed" name=fails ran=true err="card network down"`,
		`msg="scheduled job panicked" name=panics panic=boom`,
		`msg="scheduled job skipped: another holder has the lock" name=busy`,
	} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %s:\n%s", want, out)
		}
	}
	if n := advisoryLocks(t, pool); n != 0 {
		t.Fatalf("%d advisory locks held after the jobs (the panicking one leaked its lock?)", n)
	}
}
