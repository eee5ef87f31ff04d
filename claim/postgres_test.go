package claim_test

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/internal/testenv"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	envHelperURL = "BILLONCE_CLAIM_HELPER_URL"
	helperLock   = 4242 // advisory lock that holds the helper processes at the start line
)

// helperClaims is how many customers each helper process claims; the
// helpers inherit BILLONCE_LONG, so they agree with the test.
var helperClaims = testenv.Size(50, 200)

// TestHelperProcess is a replica of a billing run in its own OS process,
// started by TestMultiProcessOneWinner. It waits at the start line, claims
// helperClaims customers and prints the keys it won.
func TestHelperProcess(t *testing.T) {
	url := os.Getenv(envHelperURL)
	if url == "" {
		t.Skip("runs only as a helper process")
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if err := store.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, "SELECT pg_advisory_lock_shared($1), pg_advisory_unlock_shared($1)", helperLock); err != nil {
		t.Fatal(err)
	}
	owner := fmt.Sprintf("pid-%d", os.Getpid())
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range helperClaims {
		wg.Go(func() {
			res, err := engineOf(store).Claim(ctx, req(fmt.Sprintf("cus_%d", i), fmt.Sprintf("key_%d", i), owner))
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err != nil:
				fmt.Printf("ERR %v\n", err)
			case res.Outcome == claimengine.Won:
				fmt.Printf("WON %s\n", res.Claim.Key)
			case res.Outcome != claimengine.InProgress:
				fmt.Printf("ERR unexpected outcome %v\n", res.Outcome)
			}
		})
	}
	wg.Wait()
}

// Three OS processes claim the same customers at once: each claim is won by
// exactly one of them.
func TestMultiProcessOneWinner(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	const procs = 3
	outs := runGated(t, url, helperLock, procs, "TestHelperProcess", func(int) []string { return []string{envHelperURL + "=" + url} })
	winners := map[string]int{}
	perProc := make([]int, procs)
	for i, out := range outs {
		sc := bufio.NewScanner(strings.NewReader(out))
		for sc.Scan() {
			line := sc.Text()
			if k, ok := strings.CutPrefix(line, "WON "); ok {
				winners[k]++
				perProc[i]++
			} else if strings.HasPrefix(line, "ERR") {
				t.Errorf("helper %d: %s", i, line)
			}
		}
	}
	if len(winners) != helperClaims {
		t.Errorf("%d distinct keys won, want %d", len(winners), helperClaims)
	}
	for k, n := range winners {
		if n != 1 {
			t.Errorf("key %s won %d times", k, n)
		}
	}
	t.Logf("wins per process: %v", perProc)
	db, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close(ctx)
	var rows, attempts int
	if err := db.QueryRow(ctx, "SELECT count(*), sum(attempts) FROM billonce_claims").Scan(&rows, &attempts); err != nil {
		t.Fatal(err)
	}
	if rows != helperClaims || attempts != helperClaims {
		t.Errorf("table holds %d rows with %d attempts, want %d and %d", rows, attempts, helperClaims, helperClaims)
	}
}

// A runner with a real one-second lease dies; once the lease has run out on
// the database clock, another runner resumes the claim with the same key.
func TestRealShortLeaseExpires(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, _ := newPostgres(t, claim.Config{Lease: time.Second})
	won := mustClaim(t, s, req("cus_1", "k1", "crashed"), claimengine.Won)
	mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.InProgress)
	for { // until the lease has run out on the database clock
		st, err := s.Stale(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if len(st) == 1 {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	got := mustClaim(t, s, req("cus_1", "k1", "b"), claimengine.Resumed).Claim
	if got.Key != won.Claim.Key || got.Leases != 2 || !got.LeaseUntil.After(won.Claim.LeaseUntil) {
		t.Errorf("resumed %+v after %+v", got, won.Claim)
	}
}

func batch(n int, owner string, pick func(i int) bool) []claimengine.Request {
	var reqs []claimengine.Request
	for i := range n {
		if pick(i) {
			reqs = append(reqs, req(fmt.Sprintf("cus_%05d", i), fmt.Sprintf("key_%05d", i), owner))
		}
	}
	return reqs
}

// Half of 10,000 customers are already claimed: a batch over all of them
// wins exactly the other half, and running it again wins nothing.
func TestClaimBatchTenThousand(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newPostgres(t, claim.Config{})
	const n = 10000
	first, err := s.ClaimBatch(ctx, batch(n, "first", func(i int) bool { return i%2 == 0 }))
	if err != nil || len(first) != n/2 {
		t.Fatalf("first batch: %d results, %v", len(first), err)
	}
	for run, owner := range []string{"second", "third"} {
		all := batch(n, owner, func(int) bool { return true })
		res, err := s.ClaimBatch(ctx, all)
		if err != nil {
			t.Fatal(err)
		}
		won := 0
		for i, r := range res {
			if r.Claim.Key != all[i].Key {
				t.Fatalf("result %d is for %s, want %s", i, r.Claim.Key, all[i].Key)
			}
			want := claimengine.InProgress
			if run == 0 && i%2 == 1 {
				want = claimengine.Won
			}
			if r.Outcome != want {
				t.Fatalf("run %d: result %d = %v, want %v", run, i, r.Outcome, want)
			}
			if r.Outcome == claimengine.Won {
				won++
			}
		}
		if wantWon := []int{n / 2, 0}[run]; won != wantWon {
			t.Errorf("run %d won %d, want %d", run, won, wantWon)
		}
	}
	var rows, attempts int
	if err := pool.QueryRow(ctx, "SELECT count(*), sum(attempts) FROM billonce_claims").Scan(&rows, &attempts); err != nil {
		t.Fatal(err)
	}
	if rows != n || attempts != n {
		t.Errorf("table holds %d rows with %d attempts, want %d each", rows, attempts, n)
	}
}

// Migrate from eight connections at once, then twice more: no error, one
// claim table and its migrations record.
func TestMigrateConcurrentlyAndTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	url := pgtest.URL(t)
	for _, cfg := range []claim.Config{{}, {Schema: "billing", Table: "Claims_v2"}} {
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		start := make(chan struct{})
		for range 8 {
			pool := pgtestPool(t, url)
			s, err := claim.NewPostgres(pool, cfg)
			if err != nil {
				t.Fatal(err)
			}
			wg.Go(func() {
				<-start
				errs <- s.Migrate(ctx)
			})
		}
		close(start)
		wg.Wait()
		close(errs)
		for err := range errs {
			if err != nil {
				t.Errorf("concurrent Migrate %+v: %v", cfg, err)
			}
		}
		pool := pgtest.Pool(t) // another database: Migrate twice in a row there
		s, err := claim.NewPostgres(pool, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for i := range 2 {
			if err := s.Migrate(ctx); err != nil {
				t.Fatalf("Migrate #%d %+v: %v", i+1, cfg, err)
			}
		}
		mustClaim(t, engineOf(s), req("cus_1", "k1", "a"), claimengine.Won)
	}
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	var tables []string
	rows, _ := conn.Query(ctx, "SELECT schemaname || '.' || tablename FROM pg_tables WHERE tablename ILIKE '%claims%' ORDER BY 1")
	tables, err = pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(tables, " "); got != "billing.Claims_v2 billing.Claims_v2_events billing.Claims_v2_migrations public.billonce_claims public.billonce_claims_events public.billonce_claims_migrations" {
		t.Errorf("tables = %s", got)
	}
}

func TestNewPostgresRefusesBadConfig(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t)
	var nilPool *pgxpool.Pool
	if _, err := claim.NewPostgres(nil, claim.Config{}); !errors.Is(err, claim.ErrInvalid) || !strings.Contains(err.Error(), "nil") {
		t.Errorf("NewPostgres(nil) = %v, want ErrInvalid naming nil", err)
	}
	if _, err := claim.NewPostgres(nilPool, claim.Config{}); !errors.Is(err, claim.ErrInvalid) {
		t.Errorf("NewPostgres(nil *pgxpool.Pool) = %v, want ErrInvalid", err)
	}
	for _, cfg := range []claim.Config{
		{Table: `claims"; DROP TABLE users; --`},
		{Table: "my claims"},
		{Table: "1claims"},
		{Table: "claims.v2"},
		{Table: strings.Repeat("t", 51)},
		{Schema: "bad-schema"},
		{Schema: `"quoted"`},
		{Lease: -time.Second},
		{Lease: time.Microsecond},
	} {
		if _, err := claim.NewPostgres(pool, cfg); !errors.Is(err, claim.ErrInvalid) {
			t.Errorf("NewPostgres(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
	var n int
	if err := pool.QueryRow(context.Background(), "SELECT count(*) FROM pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')").Scan(&n); err != nil || n != 0 {
		t.Errorf("%d tables after refused configs (%v), want none", n, err)
	}
}

func TestClosedPoolIsAnError(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s, pool := newPostgres(t, claim.Config{})
	url := pool.Config().ConnString()
	pool.Close()
	if _, err := s.Claim(ctx, req("cus_1", "k1", "a")); err == nil || errors.Is(err, claim.ErrInvalid) {
		t.Errorf("Claim on a closed pool = %v, want a database error", err)
	}
	if _, err := s.ClaimBatch(ctx, []claimengine.Request{req("cus_1", "k1", "a")}); err == nil {
		t.Error("ClaimBatch on a closed pool succeeded")
	}
	if err := s.Migrate(ctx); err == nil {
		t.Error("Migrate on a closed pool succeeded")
	}
	check, err := claim.NewPostgres(pgtestPool(t, url), claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := check.Get(ctx, "k1"); !errors.Is(err, claim.ErrNotFound) {
		t.Errorf("Get after a closed-pool claim = %v, want ErrNotFound", err)
	}
}

func pgtestPool(t *testing.T, url string) *pgxpool.Pool {
	pool, err := pgxpool.New(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	return pool
}

// A pool of one connection serves concurrent claims one statement at a
// time, each committed on its own (a single *pgx.Conn would fail with
// "conn busy"; NewPostgres takes only a pool for that reason).
func TestPoolOfOneConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, s := poolOfOne(t, pgtest.URL(t))
	counts := race(t, 16, func(i int) (result, error) {
		return engineOf(s).Claim(ctx, req(fmt.Sprintf("cus_%d", i), fmt.Sprintf("k%d", i), "a"))
	})
	if counts[claimengine.Won] != 16 {
		t.Errorf("outcomes = %v, want 16 Won", counts)
	}
}

// runGated starts procs OS processes of this test binary running the test
// named run, each with env(i) added to its environment, holds them at an
// advisory lock on lock (in url's database) until all of them wait on it,
// releases them at once, and returns each one's output once it exited; a
// process that failed fails the test.
func runGated(t *testing.T, url string, lock int64, procs int, run string, env func(i int) []string) []string {
	t.Helper()
	ctx := context.Background()
	gate, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer gate.Close(ctx)
	if _, err := gate.Exec(ctx, "SELECT pg_advisory_lock($1)", lock); err != nil {
		t.Fatal(err)
	}
	outs := make([]bytes.Buffer, procs)
	cmds := make([]*exec.Cmd, procs)
	for i := range procs {
		cmd := exec.Command(os.Args[0], "-test.run=^"+run+"$", "-test.count=1")
		cmd.Env = append(os.Environ(), env(i)...)
		cmd.Stdout, cmd.Stderr = &outs[i], &outs[i]
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		cmds[i] = cmd
	}
	for { // polling real external processes
		var waiting int
		if err := gate.QueryRow(ctx, "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objid = $1"+
			" AND database = (SELECT oid FROM pg_database WHERE datname = current_database())", lock).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting == procs {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := gate.Exec(ctx, "SELECT pg_advisory_unlock($1)", lock); err != nil {
		t.Fatal(err)
	}
	res := make([]string, procs)
	for i, cmd := range cmds {
		if err := cmd.Wait(); err != nil {
			t.Fatalf("helper %d: %v\n%s", i, err, outs[i].String())
		}
		res[i] = outs[i].String()
	}
	return res
}
