package lock_test

import (
	"context"
	"testing"
	"time"

	"github.com/billonce/billonce/lock"
)

// Every acquisition of a name, by the same replica or another, gets a
// greater fencing token than the one before, and Do hands it to the job.
func TestTokenGrowsWithEveryHolder(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	adv, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	lease := newLease(t, pool, lock.LeaseConfig{})
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		l    lock.Locker
	}{{"advisory", adv}, {"lease", lease}} {
		t.Run(tc.name, func(t *testing.T) {
			var last int64
			for i := range 3 {
				ran, err := lock.Do(ctx, tc.l, "job", func(ctx context.Context) error {
					token, ok := lock.Token(ctx)
					if !ok || token <= last {
						t.Errorf("acquisition %d: token %d, %v; want one above %d", i, token, ok, last)
					}
					last = token
					return nil
				})
				if !ran || err != nil {
					t.Fatalf("Do = %v, %v", ran, err)
				}
			}
		})
	}
	if token, ok := lock.Token(ctx); ok {
		t.Errorf("Token outside a job = %d, true; want false", token)
	}
}

// A lease's token is in its row, stays there while the holder renews,
// and changes when another holder takes the expired lease over.
func TestLeaseTokenInRow(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	ctx := context.Background()
	cfg := lock.LeaseConfig{TTL: time.Hour, RenewInterval: 20 * time.Millisecond}
	a, b := newLease(t, pool, cfg), newLease(t, pool, cfg)
	rowToken := func() int64 {
		return int64(count(t, pool, `SELECT token FROM `+lock.DefaultLeaseTable+` WHERE name = 'job'`))
	}

	stale, err := a.Lock(ctx, "job")
	if err != nil {
		t.Fatal(err)
	}
	defer stale.Unlock(ctx)
	first := stale.(lock.Fenced).Token()
	poll(t, func() bool { // renewed
		return count(t, pool, `SELECT count(*) FROM `+lock.DefaultLeaseTable+` WHERE lock_until > locked_at + interval '1 hour'`) == 1
	})
	if got := rowToken(); got != first {
		t.Fatalf("after a renewal the row's token is %d; want the holder's %d", got, first)
	}

	mustExec(t, pool, `UPDATE `+lock.DefaultLeaseTable+` SET lock_until = now() - interval '1 second'`)
	fresh, err := b.Lock(ctx, "job")
	if err != nil {
		t.Fatalf("takeover of the expired lease: %v", err)
	}
	defer fresh.Unlock(ctx)
	second := fresh.(lock.Fenced).Token()
	if second <= first {
		t.Fatalf("the new holder's token %d is not above the stale holder's %d", second, first)
	}
	if got := rowToken(); got != second {
		t.Fatalf("after the takeover the row's token is %d; want the new holder's %d", got, second)
	}
	if got := stale.(lock.Fenced).Token(); got != first {
		t.Fatalf("the stale holder's token changed to %d", got)
	}
}

// The fence row that guards writes under an advisory lock (the package
// documentation, under "Fencing tokens"): once a holder has written, a
// write with an older holder's token is refused; a write with the same or
// a newer token is not.
func TestFenceRowRefusesOlderToken(t *testing.T) {
	t.Parallel()
	pool, _ := newPool(t, 0)
	mustExec(t, pool, `CREATE TABLE export_fences (name text PRIMARY KEY, token bigint NOT NULL);
		CREATE TABLE exports (period text, file text)`)
	adv, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	write := func(token int64, file string) bool {
		tag, err := pool.Exec(ctx, `WITH fence AS (
				INSERT INTO export_fences (name, token) VALUES ($1, $2)
				ON CONFLICT (name) DO UPDATE SET token = excluded.token
				WHERE export_fences.token <= excluded.token
				RETURNING 1)
			INSERT INTO exports (period, file) SELECT $3, $4 FROM fence`, "exports", token, "2026-09", file)
		if err != nil {
			t.Fatal(err)
		}
		return tag.RowsAffected() == 1
	}
	var tokens []int64
	for range 2 {
		ran, err := lock.Do(ctx, adv, "exports", func(ctx context.Context) error {
			token, _ := lock.Token(ctx)
			tokens = append(tokens, token)
			return nil
		})
		if !ran || err != nil {
			t.Fatalf("Do = %v, %v", ran, err)
		}
	}
	old, current := tokens[0], tokens[1]
	for _, w := range []struct {
		token int64
		file  string
		want  bool
	}{
		{old, "a", true}, // nobody newer has written yet
		{current, "b", true},
		{current, "c", true},
		{old, "d", false},
	} {
		if got := write(w.token, w.file); got != w.want {
			t.Errorf("write %s with token %d: done = %v; want %v", w.file, w.token, got, w.want)
		}
	}
	if n := count(t, pool, `SELECT count(*) FROM exports`); n != 3 {
		t.Fatalf("%d exports; want 3", n)
	}
}

// fencedLock is a lock of the test's own with a fencing token.
type fencedLock struct {
	*memLock
	token int64
}

func (f fencedLock) Token() int64 { return f.token }

type fencedLocker struct{ *memLocker }

func (f fencedLocker) Lock(ctx context.Context, name string) (lock.Lock, error) {
	h, err := f.memLocker.Lock(ctx, name)
	if err != nil {
		return nil, err
	}
	return fencedLock{h.(*memLock), 42}, nil
}

// Do hands the job the token of a lock of one's own when it has one, and
// none when it has not.
func TestTokenOfYourOwnLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, tc := range []struct {
		name  string
		l     lock.Locker
		token int64
		ok    bool
	}{
		{"fenced", fencedLocker{&memLocker{held: map[string]*memLock{}}}, 42, true},
		{"not fenced", &memLocker{held: map[string]*memLock{}}, 0, false},
	} {
		ran, err := lock.Do(ctx, tc.l, "job", func(ctx context.Context) error {
			if token, ok := lock.Token(ctx); token != tc.token || ok != tc.ok {
				t.Errorf("%s: Token = %d, %v; want %d, %v", tc.name, token, ok, tc.token, tc.ok)
			}
			return nil
		})
		if !ran || err != nil {
			t.Fatalf("%s: Do = %v, %v", tc.name, ran, err)
		}
	}
}
