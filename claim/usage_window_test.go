package claim_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

// windowBase is the start of the windows of these tests.
var windowBase = time.Date(2026, 9, 1, 10, 0, 0, 0, time.UTC)

// usageReq is a usage report's claim of customer's meter api_calls from
// windowBase+from to windowBase+to minutes.
func usageReq(customer, key string, from, to int) claimengine.Request {
	start, end := windowBase.Add(time.Duration(from)*time.Minute), windowBase.Add(time.Duration(to)*time.Minute)
	return claimengine.Request{Customer: customer, Period: "usage api_calls " + start.Format(time.RFC3339) + " increment",
		Key: key, Amount: 7, Owner: "a", Endpoint: "meter_events", Meter: "api_calls", WindowStart: start, WindowEnd: end}
}

// wantOverlap wants err to be the refusal of a window that overlaps the
// claim of key.
func wantOverlap(t *testing.T, err error, key string) {
	t.Helper()
	var m *claim.MismatchError
	if !errors.As(err, &m) || m.Field != "window" || m.Existing.Key != key || !strings.Contains(err.Error(), m.Have) {
		t.Errorf("claim = %v, want a mismatch on the window of %s, naming it", err, key)
	}
}

// No two live claims of one customer and meter have overlapping windows,
// but the same window may be claimed again: the same key resumes, and
// another key (the next total of the window) is a claim of its own.
// Windows that meet do not overlap, other customers and meters are apart,
// and a failed claim frees its window.
func TestUsageWindowsOfOneMeterNeverOverlap(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		s := h.store
		hour := mustClaim(t, s, usageReq("cus_1", "k_hour", 60, 120), claimengine.Won).Claim
		if hour.Meter != "api_calls" || !hour.WindowStart.Equal(windowBase.Add(time.Hour)) || !hour.WindowEnd.Equal(windowBase.Add(2*time.Hour)) {
			t.Errorf("claim's window = %q %v to %v", hour.Meter, hour.WindowStart, hour.WindowEnd)
		}
		for _, w := range [][2]int{{30, 90}, {90, 150}, {75, 105}, {0, 180}, {60, 90}, {90, 120}, {119, 120}} {
			_, err := s.Claim(ctx, usageReq("cus_1", fmt.Sprintf("k_%d_%d", w[0], w[1]), w[0], w[1]))
			wantOverlap(t, err, "k_hour")
		}
		mustClaim(t, s, usageReq("cus_1", "k_hour", 60, 120), claimengine.Resumed)
		total2 := usageReq("cus_1", "k_hour_total_2", 60, 120)
		total2.Period += " 2"
		mustClaim(t, s, total2, claimengine.Won)
		mustClaim(t, s, usageReq("cus_1", "k_before", 0, 60), claimengine.Won)
		mustClaim(t, s, usageReq("cus_1", "k_after", 120, 180), claimengine.Won)
		mustClaim(t, s, usageReq("cus_2", "k_other_customer", 90, 150), claimengine.Won)
		other := usageReq("cus_1", "k_other_meter", 90, 150)
		other.Meter = "seats"
		mustClaim(t, s, other, claimengine.Won)
		charge := req("cus_1", "k_charge", "a") // no window
		mustClaim(t, s, charge, claimengine.Won)

		for _, k := range []string{"k_hour", "k_hour_total_2"} {
			if err := s.Fail(ctx, k, "", "rejected"); err != nil {
				t.Fatal(err)
			}
		}
		mustClaim(t, s, usageReq("cus_1", "k_later", 75, 105), claimengine.Won)
		_, err := s.Claim(ctx, usageReq("cus_1", "k_again", 60, 120))
		wantOverlap(t, err, "k_later")

		// In one batch: the second of two overlapping requests is refused,
		// and the others are claimed.
		res, err := s.ClaimBatch(ctx, []claimengine.Request{
			usageReq("cus_3", "k_b1", 0, 60), usageReq("cus_3", "k_b2", 30, 90), usageReq("cus_3", "k_b3", 60, 120)})
		if len(res) != 3 || res[0].Outcome != claimengine.Won || res[1].Outcome != claimengine.Mismatch || res[2].Outcome != claimengine.Won {
			t.Fatalf("batch = %+v, %v; want won, mismatch, won", res, err)
		}
		wantOverlap(t, res[1].Conflict, "k_b1")
		wantOverlap(t, err, "k_b1")
	})
}

// Overlapping windows claimed at once, one claim each or in batches that
// cross: exactly one of every overlapping pair is won.
func TestUsageWindowsClaimedAtOnceOneWins(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		const n = 12
		var (
			wg   sync.WaitGroup
			mu   sync.Mutex
			won  []string
			bad  []error
			gate = make(chan struct{})
		)
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-gate
				// Every window overlaps every other: each starts a minute
				// after the one before and lasts an hour.
				r := usageReq("cus_1", fmt.Sprintf("k_%02d", i), i, 60+i)
				r.Owner = fmt.Sprintf("pod-%d", i)
				var res []result
				var err error
				if i%2 == 0 {
					var one result
					one, err = h.store.Claim(ctx, r)
					res = []result{one}
				} else {
					// Batched with a window of another customer.
					res, err = h.store.ClaimBatch(ctx, []claimengine.Request{r, usageReq(fmt.Sprintf("cus_x%d", i), "kx_"+r.Key, i, 60+i)})
				}
				mu.Lock()
				defer mu.Unlock()
				var m *claim.MismatchError
				switch {
				case err == nil || errors.As(err, &m) && m.Field == "window":
					if len(res) > 0 && res[0].Outcome == claimengine.Won {
						won = append(won, r.Key)
					}
				default:
					bad = append(bad, err)
				}
			}()
		}
		close(gate)
		wg.Wait()
		if len(won) != 1 || len(bad) != 0 {
			t.Errorf("won %v, errors %v; want exactly one won and the others refused", won, bad)
		}
	})
}

// A request's window must be whole: a meter, a start and an end after it;
// a meter id goes with a meter.
func TestUsageWindowRequestChecked(t *testing.T) {
	t.Parallel()
	bothStores(t, lease, func(t *testing.T, h harness) {
		ctx := context.Background()
		for name, edit := range map[string]func(*claimengine.Request){
			"no meter":         func(r *claimengine.Request) { r.Meter = "" },
			"no end":           func(r *claimengine.Request) { r.WindowEnd = time.Time{} },
			"end before start": func(r *claimengine.Request) { r.WindowEnd = r.WindowStart.Add(-time.Minute) },
			"empty":            func(r *claimengine.Request) { r.WindowEnd = r.WindowStart },
			"meter id alone": func(r *claimengine.Request) {
				r.MeterID, r.Meter, r.WindowStart, r.WindowEnd = "mtr_1", "", time.Time{}, time.Time{}
			},
		} {
			r := usageReq("cus_1", "k_1", 0, 60)
			edit(&r)
			if _, err := h.store.Claim(ctx, r); !errors.Is(err, claim.ErrInvalid) {
				t.Errorf("%s: %v, want ErrInvalid", name, err)
			}
		}
	})
}

// applyUpTo applies cfg's migrations up to version v with the admin pool.
func applyUpTo(tb testing.TB, db *pgxpool.Pool, cfg claim.Config, v int) {
	tb.Helper()
	ms, err := claim.Migrations(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	for _, m := range ms[:v] {
		if _, err := db.Exec(context.Background(), m.SQL); err != nil {
			tb.Fatalf("migration %d: %v", m.Version, err)
		}
	}
}

// Migration 6 on a table with usage claims: they get their meter and
// window start from their period, no window end, and take no part in the
// overlap check; other claims get no window. Claims made from then on
// do.
func TestMigrationUsageWindowsUpgradesRows(t *testing.T) {
	t.Parallel()
	for _, cfg := range migrateConfigs {
		t.Run(fmt.Sprintf("%+v", cfg), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := pgtest.Pool(t)
			applyUpTo(t, pool, cfg, 5)
			table, _ := names(cfg)
			if _, err := pool.Exec(ctx, `INSERT INTO `+table+` (customer, period, key, amount, currency, endpoint, attempt) VALUES
				('cus_1', 'usage api_calls 2026-09-01T10:00:00Z increment', 'k_inc', 7, '', 'meter_events', 1),
				('cus_1', 'usage seats 2026-09-01T10:00:00Z total 2', 'k_total', 9, '', 'meter_events', 2),
				('cus_1', '2026-09', 'k_charge', 2500, 'usd', 'charges', 1)`); err != nil {
				t.Fatal(err)
			}
			s := migrate(t, pool, cfg)
			got := rows(t, pool, cfg, "key, meter, window_start AT TIME ZONE 'UTC', window_end IS NULL")
			want := []string{`(k_charge,,,t)`, `(k_inc,api_calls,"2026-09-01 10:00:00",t)`, `(k_total,seats,"2026-09-01 10:00:00",t)`}
			if !slices.Equal(got, want) {
				t.Errorf("usage columns = %q, want %q", got, want)
			}
			e := engineOf(s)
			mustClaim(t, e, usageReq("cus_1", "k_new", 30, 90), claimengine.Won)
			_, err := e.Claim(ctx, usageReq("cus_1", "k_newer", 0, 60))
			wantOverlap(t, err, "k_new")
		})
	}
}

// hasExtension reports whether db has the extension ext.
func hasExtension(tb testing.TB, db *pgxpool.Pool, ext string) bool {
	tb.Helper()
	var ok bool
	if err := db.QueryRow(context.Background(), "SELECT EXISTS (SELECT FROM pg_extension WHERE extname = $1)", ext).Scan(&ok); err != nil {
		tb.Fatal(err)
	}
	return ok
}

// withoutBtreeGist returns a fresh database without btree_gist (test
// databases are made from a template that has it).
func withoutBtreeGist(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	db := pgtest.Pool(tb)
	if _, err := db.Exec(context.Background(), "DROP EXTENSION IF EXISTS btree_gist"); err != nil {
		tb.Fatal(err)
	}
	return db
}

// Migrate creates btree_gist where the database lacks it and the role may
// create it.
func TestMigrateCreatesBtreeGist(t *testing.T) {
	t.Parallel()
	db := withoutBtreeGist(t)
	s := migrate(t, db, claim.Config{})
	if !hasExtension(t, db, "btree_gist") {
		t.Fatal("Migrate went through without creating btree_gist")
	}
	mustClaim(t, engineOf(s), usageReq("cus_1", "k_1", 0, 60), claimengine.Won)
}

// A database without btree_gist, migrated by a role that may not create
// extensions: Migrate fails, naming the extension and what to do, and
// changes nothing. Once the database's owner has created the extension,
// the same role's Migrate goes through.
func TestMigrateWithoutBtreeGistNamesTheExtension(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	admin := withoutBtreeGist(t)
	url := admin.Config().ConnString()
	name := admin.Config().ConnConfig.Database + "_noext"
	role := pgx.Identifier{name}.Sanitize()
	if _, err := admin.Exec(ctx, "CREATE ROLE "+role+" LOGIN PASSWORD 'app'; GRANT USAGE, CREATE ON SCHEMA public TO "+role); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if _, err := admin.Exec(context.Background(), "DROP OWNED BY "+role+"; DROP ROLE "+role); err != nil {
			t.Error(err)
		}
	})
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	cfg.ConnConfig.User, cfg.ConnConfig.Password = name, "app"
	app, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(app.Close)
	s, err := claim.NewPostgres(app, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	err = s.Migrate(ctx)
	if err == nil {
		t.Fatal("Migrate created btree_gist as a role without CREATE on the database; the test proves nothing")
	}
	for _, want := range []string{"migration 6 (usage_windows)", "needs the PostgreSQL extension btree_gist", "CREATE EXTENSION btree_gist;", "CREATE privilege", "nothing was changed"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("Migrate = %v; want it to say %q", err, want)
		}
	}
	if exists(t, admin, "billonce_claims") || hasExtension(t, admin, "btree_gist") {
		t.Error("the failed Migrate left a claim table or an extension")
	}
	if _, err := admin.Exec(ctx, "CREATE EXTENSION btree_gist"); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("Migrate once the extension exists: %v", err)
	}
	mustClaim(t, engineOf(s), usageReq("cus_1", "k_1", 0, 60), claimengine.Won)
}
