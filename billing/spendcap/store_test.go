package spendcap

import (
	"context"
	"errors"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// adminStore is a Store with the administration both stores offer.
type adminStore interface {
	Store
	issue(tb testing.TB, vaultKey string, k Key)
	revoke(tb testing.TB, vaultKey string)
	usage(tb testing.TB, vaultKey string, now time.Time) Usage
}

type memStore struct{ *MemoryStore }

func (s memStore) issue(tb testing.TB, vk string, k Key) {
	if err := s.IssueKey(context.Background(), vk, k); err != nil {
		tb.Fatal(err)
	}
}
func (s memStore) revoke(tb testing.TB, vk string) {
	if err := s.Revoke(context.Background(), KeyID(vk)); err != nil {
		tb.Fatal(err)
	}
}
func (s memStore) usage(_ testing.TB, vk string, now time.Time) Usage {
	return s.Usage(KeyID(vk), now)
}

type pgStore struct{ *PostgresStore }

func (s pgStore) issue(tb testing.TB, vk string, k Key) {
	if err := s.IssueKey(context.Background(), vk, k, "test"); err != nil {
		tb.Fatal(err)
	}
}
func (s pgStore) revoke(tb testing.TB, vk string) {
	if err := s.Revoke(context.Background(), KeyID(vk)); err != nil {
		tb.Fatal(err)
	}
}
func (s pgStore) usage(tb testing.TB, vk string, now time.Time) Usage {
	u, err := s.Usage(context.Background(), KeyID(vk), now)
	if err != nil {
		tb.Fatal(err)
	}
	return u
}

func newPostgresStore(tb testing.TB) *PostgresStore {
	tb.Helper()
	s, err := NewPostgresStore(pgtest.Pool(tb))
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.Migrate(context.Background()); err != nil {
		tb.Fatal(err)
	}
	return s
}

func eachStore(t *testing.T, f func(t *testing.T, s adminStore)) {
	t.Run("memory", func(t *testing.T) { f(t, memStore{NewMemoryStore()}) })
	t.Run("postgres", func(t *testing.T) { f(t, pgStore{newPostgresStore(t)}) })
}

// vaultKey is the key the store tests issue.
const vaultKey = "vault_key_test_store_000000000000000042"

var t0 = time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)

const countFor = 24*time.Hour - 5*time.Minute

func req(vk, idem string, amount int64, now time.Time) admitRequest {
	return admitRequest{KeyID: KeyID(vk), Method: "POST", Path: "/v1/charges", IdempotencyKey: idem,
		Amount: amount, Now: now, CountFor: countFor, Window: countFor + 2*time.Minute}
}

func admit(tb testing.TB, s Store, r admitRequest) admission {
	tb.Helper()
	a, err := s.admit(context.Background(), r)
	if err != nil {
		tb.Fatal(err)
	}
	return a
}

func settle(tb testing.TB, s Store, a admission, o outcome, now time.Time) {
	tb.Helper()
	if err := s.settle(context.Background(), a.Reservation, o, now); err != nil {
		tb.Fatal(err)
	}
}

func TestStoreReservesAtTheEdgeConcurrently(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s adminStore) {
		s.issue(t, vaultKey, Key{CapAmount: 1000})
		var (
			wg       sync.WaitGroup
			mu       sync.Mutex
			admitted []admission
		)
		for i := range 50 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				a := admit(t, s, req(vaultKey, "k"+string(rune('A'+i)), 30, t0))
				if a.Refusal == notRefused {
					mu.Lock()
					admitted = append(admitted, a)
					mu.Unlock()
				}
			}()
		}
		wg.Wait()
		if len(admitted) != 33 {
			t.Fatalf("%d of 50 requests of 30 admitted under a cap of 1000; want 33", len(admitted))
		}
		for i, a := range admitted {
			o := outcomeCharged
			if i%2 == 1 {
				o = outcomeReleased
			}
			settle(t, s, a, o, t0)
			settle(t, s, a, o, t0) // twice changes nothing
		}
		if u := s.usage(t, vaultKey, t0); u.Spent != 17*30 || u.Reserved != 0 {
			t.Fatalf("usage = %+v; want %d spent, none reserved", u, 17*30)
		}
	})
}

func TestStoreCountsIdempotencyKeysWhileStripeRemembersThem(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s adminStore) {
		s.issue(t, vaultKey, Key{CapAmount: 1000})
		s.issue(t, "vault_other_key_0000000000000", Key{CapAmount: 1000})
		a := admit(t, s, req(vaultKey, "charged", 400, t0))
		settle(t, s, a, outcomeCharged, t0.Add(time.Second))
		// Within the lifetime, from any vault key: nothing reserved.
		for _, vk := range []string{vaultKey, "vault_other_key_0000000000000"} {
			if a := admit(t, s, req(vk, "charged", 400, t0.Add(countFor-time.Second))); a.Refusal != "" || a.Reservation.Amount != 0 {
				t.Errorf("resend before the lifetime ends: %+v; want admitted with nothing reserved", a)
			}
		}
		// After it, reserved anew.
		a = admit(t, s, req(vaultKey, "charged", 400, t0.Add(countFor)))
		if a.Refusal != "" || a.Reservation.Amount != 400 {
			t.Fatalf("resend after the lifetime: %+v; want 400 reserved", a)
		}
		settle(t, s, a, outcomeReleased, t0.Add(countFor))

		// An unknown outcome counts from the first forward of the chain.
		first := admit(t, s, req(vaultKey, "unknown", 100, t0))
		settle(t, s, first, outcomeReleased, t0)
		later := admit(t, s, req(vaultKey, "unknown", 100, t0.Add(time.Hour)))
		settle(t, s, later, outcomeUnknown, t0.Add(time.Hour))
		if a := admit(t, s, req(vaultKey, "unknown", 100, t0.Add(countFor-time.Second))); a.Reservation.Amount != 0 {
			t.Errorf("resend within the lifetime of the first forward: %+v; want nothing reserved", a)
		}
		if a := admit(t, s, req(vaultKey, "unknown", 100, t0.Add(countFor))); a.Reservation.Amount != 100 {
			t.Errorf("resend a lifetime after the first forward: %+v; want 100 reserved: the answer may have replayed the first", a)
		}
	})
}

func TestStoreRefusals(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s adminStore) {
		s.issue(t, vaultKey, Key{CapAmount: 1000, AllowedEndpoints: []string{"POST /v1/charges"}, ExpiresAt: t0.Add(time.Hour)})
		for _, c := range []struct {
			r    admitRequest
			want string
		}{
			{req("vault_unknown_0000000000000", "", 1, t0), refusedUnknownKey},
			{req(vaultKey, "", math.MaxInt64, t0), refusedCap},
			{req(vaultKey, "", 1001, t0), refusedCap},
			{req(vaultKey, "", 1, t0.Add(time.Hour)), refusedExpired},
			{func() admitRequest { r := req(vaultKey, "", 1, t0); r.Path = "/v1/refunds"; return r }(), refusedEndpoint},
			{req(vaultKey, "", 1000, t0), notRefused},
		} {
			if a := admit(t, s, c.r); a.Refusal != c.want {
				t.Errorf("%s %s amount %d at %v: %q; want %q", c.r.Method, c.r.Path, c.r.Amount, c.r.Now, a.Refusal, c.want)
			}
		}
		s.revoke(t, vaultKey)
		if a := admit(t, s, req(vaultKey, "", 1, t0)); a.Refusal != refusedRevoked {
			t.Errorf("after Revoke: %q; want revoked", a.Refusal)
		}
	})
}

func TestStorePerDayWindow(t *testing.T) {
	t.Parallel()
	eachStore(t, func(t *testing.T, s adminStore) {
		s.issue(t, vaultKey, Key{CapAmount: 1000, Per: PerDay})
		a := admit(t, s, req(vaultKey, "", 900, t0))
		settle(t, s, a, outcomeCharged, t0)
		if a := admit(t, s, req(vaultKey, "", 200, t0.Add(time.Hour))); a.Refusal != refusedCap {
			t.Errorf("same day: %q; want cap", a.Refusal)
		}
		next := t0.Add(14 * time.Hour) // past midnight UTC
		if a := admit(t, s, req(vaultKey, "", 200, next)); a.Refusal != "" {
			t.Errorf("next day: %q; want admitted", a.Refusal)
		}
		if u := s.usage(t, vaultKey, next); u.Spent != 0 || u.Reserved != 200 {
			t.Errorf("next day usage %+v; want 0 spent, 200 reserved", u)
		}
	})
}

// Migrate is idempotent and refuses tables a newer billonce migrated
// (the runner's own tests, in internal/migrate, cover the rest).
func TestPostgresStoreMigrate(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	s, err := NewPostgresStore(pool)
	if err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := s.Migrate(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := pool.Exec(context.Background(), "INSERT INTO spendcap_migrations (version, name) VALUES (99, 'future')"); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(context.Background()); !errors.Is(err, ErrNewerSchema) {
		t.Fatalf("Migrate with a newer record: %v; want ErrNewerSchema", err)
	}
}
