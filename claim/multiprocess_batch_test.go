package claim_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

const (
	envMixURL  = "BILLONCE_CLAIM_MIX_URL"
	envMixProc = "BILLONCE_CLAIM_MIX_PROC"
	mixLock    = 4343 // holds the mix helpers at the start line
	mixPeriods = 40   // customers each helper claims for 2025-01
	mixRefunds = 6    // refunds of 100 of the payment "pay" each helper claims
)

// mixBatch is what helper proc claims in one batch, as a Run would: the
// customers of 2025-01 under scope s0 or s1 (by proc's parity), refunds
// of 100 each of payment "pay", a usage window that overlaps its
// neighbours' and one window every helper claims by the same key.
func mixBatch(proc int) []claimengine.Request {
	owner := fmt.Sprintf("proc-%d", proc)
	scope := fmt.Sprintf("s%d", proc%2)
	var reqs []claimengine.Request
	for i := range mixPeriods {
		r := req(fmt.Sprintf("c_%d", i), fmt.Sprintf("%s/c_%d", scope, i), owner)
		r.Scope, r.Attempt = scope, 1
		reqs = append(reqs, r)
	}
	for j := range mixRefunds {
		r := refundReq("pay", fmt.Sprintf("%d-%d", proc, j), 100)
		r.Owner = owner
		reqs = append(reqs, r)
	}
	w := usageReq("u", fmt.Sprintf("u/%d", proc), proc*30, proc*30+60)
	w.Owner = owner
	same := usageReq("u", "u/same", 1000, 1060)
	same.Owner = owner
	return append(reqs, w, same)
}

// TestHelperProcessMix is one replica of TestMultiProcessBatchesKeepEveryRule,
// in its own OS process: it waits at the start line, claims its
// mixBatch in one ClaimBatch and prints the keys it won.
func TestHelperProcessMix(t *testing.T) {
	url := os.Getenv(envMixURL)
	if url == "" {
		t.Skip("runs only as a helper process")
	}
	proc, err := strconv.Atoi(os.Getenv(envMixProc))
	if err != nil {
		t.Fatal(err)
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
	if _, err := pool.Exec(ctx, "SELECT pg_advisory_lock_shared($1), pg_advisory_unlock_shared($1)", mixLock); err != nil {
		t.Fatal(err)
	}
	reqs := mixBatch(proc)
	res, err := engineOf(store).ClaimBatch(ctx, reqs) // conflicts are in the results too
	if len(res) != len(reqs) {
		fmt.Printf("ERR %d results for %d requests: %v\n", len(res), len(reqs), err)
		return
	}
	for i, r := range res {
		switch r.Outcome {
		case claimengine.Won:
			fmt.Printf("WON %s\n", reqs[i].Key)
		case claimengine.InProgress, claimengine.Mismatch:
		default:
			fmt.Printf("ERR %s: unexpected outcome %v (%v)\n", reqs[i].Key, r.Outcome, r.Conflict)
		}
	}
}

// Four OS processes claim overlapping batches at once: customers of one
// period under two scopes, refunds of one payment that together ask for
// more than it, overlapping usage windows. Every key is won once, each
// customer and period has one claim, the refunds claimed are exactly the
// payment, and no two live windows overlap, whatever the database's
// default isolation.
func TestMultiProcessBatchesKeepEveryRule(t *testing.T) {
	t.Parallel()
	for _, isolation := range []string{"", "repeatable read", "serializable"} {
		t.Run(fmt.Sprintf("%q", isolation), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			url := pgtest.URL(t)
			admin, err := pgxpool.New(ctx, url)
			if err != nil {
				t.Fatal(err)
			}
			defer admin.Close()
			store, err := claim.NewPostgres(admin, claim.Config{})
			if err != nil {
				t.Fatal(err)
			}
			if err := store.Migrate(ctx); err != nil {
				t.Fatal(err)
			}
			paid(t, engineOf(store), "pay", 1000)
			if isolation != "" {
				if _, err := admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{admin.Config().ConnConfig.Database}.Sanitize()+
					" SET default_transaction_isolation = '"+isolation+"'"); err != nil {
					t.Fatal(err)
				}
			}
			const procs = 4
			outs := runGated(t, url, mixLock, procs, "TestHelperProcessMix", func(i int) []string {
				return []string{envMixURL + "=" + url, envMixProc + "=" + strconv.Itoa(i)}
			})
			won := map[string]int{}
			for i, out := range outs {
				sc := bufio.NewScanner(strings.NewReader(out))
				for sc.Scan() {
					line := sc.Text()
					if k, ok := strings.CutPrefix(line, "WON "); ok {
						won[k]++
					} else if strings.HasPrefix(line, "ERR") {
						t.Errorf("helper %d: %s", i, line)
					}
				}
			}
			for k, n := range won {
				if n != 1 {
					t.Errorf("key %s won %d times", k, n)
				}
			}
			rows, err := admin.Query(ctx, "SELECT key, customer, period, amount, coalesce(refund_of, ''), window_start, window_end FROM billonce_claims WHERE key <> 'pay'")
			if err != nil {
				t.Fatal(err)
			}
			type w struct {
				key        string
				start, end time.Time
			}
			var (
				periods  = map[string]int{}
				refunded int64
				refunds  int
				windows  []w
			)
			for rows.Next() {
				var key, customer, period, of string
				var amount int64
				var start, end *time.Time
				if err := rows.Scan(&key, &customer, &period, &amount, &of, &start, &end); err != nil {
					t.Fatal(err)
				}
				if won[key] != 1 {
					t.Errorf("claim %s in the table, won %d times", key, won[key])
				}
				periods[customer+" "+period]++
				if of == "pay" {
					refunded += amount
					refunds++
				}
				if start != nil {
					windows = append(windows, w{key, *start, *end})
				}
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			if len(won) != len(periods) {
				t.Errorf("%d keys won, %d claims in the table", len(won), len(periods))
			}
			for cp, n := range periods {
				if n != 1 {
					t.Errorf("%s has %d claims", cp, n)
				}
			}
			for i := range mixPeriods {
				if periods[fmt.Sprintf("c_%d 2025-01", i)] != 1 {
					t.Errorf("c_%d has no claim for 2025-01", i)
				}
			}
			if refunded != 1000 || refunds != 10 {
				t.Errorf("%d refunds claimed, adding up to %d; want 10 adding up to the payment's 1000", refunds, refunded)
			}
			for i, a := range windows {
				for _, b := range windows[i+1:] {
					if a.start.Before(b.end) && b.start.Before(a.end) {
						t.Errorf("windows of %s and %s overlap", a.key, b.key)
					}
				}
			}
			if won["u/same"] != 1 {
				t.Errorf("the window every helper claimed by one key was won %d times", won["u/same"])
			}
		})
	}
}
