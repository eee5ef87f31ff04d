package main

import (
	"context"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
)

// floorShape is one row of the floor table: a table, the statement that
// inserts a batch of units' rows before they are sent, and the statements
// that update a group of them after, in order (one, the outcome, for
// every kind).
type floorShape struct {
	name    string
	migrate bool   // the database has billonce's migrations, and fl is LIKE billonce_claims
	create  string // creates fl
	insert  func(from, to int) (string, []any)
	updates []func(units []int) (string, []any)
}

const floorCredential = "sha256:0123456789abcdef"

func floorOwner(i int) string { return "bench/1f2e3d4c5b6a7988/" + strconv.Itoa(i+1) }

func floorKey(customer, period string) string {
	k, err := idemkey.For("billonce", customer, period, "1")
	if err != nil {
		panic(err)
	}
	return k.String()
}

// floorID is the Stripe id the update of unit i records.
func floorID(prefix string, i int) string { return fmt.Sprintf("%s_%024d", prefix, i) }

// floorCharges are the arrays of charge-shaped rows from to to.
func floorCharges(from, to int) (keys, custs, owners []string, amounts []int64) {
	for i := from; i < to; i++ {
		c := customerID(i)
		keys, custs, owners, amounts = append(keys, floorKey(c, period)), append(custs, c), append(owners, floorOwner(i)), append(amounts, price(i).Amount)
	}
	return keys, custs, owners, amounts
}

// claimInsert is billonce's claim insert, without its checks: the columns
// a claim writes, from arrays, one row per unit.
const claimInsert = `INSERT INTO fl (customer, period, key, amount, currency, owner, lease_until, scope, attempt, endpoint, credential,
	meter, window_start, window_end, meter_id, refund_of, account)
SELECT customer, period, key, amount, currency, owner, now() + interval '5 minutes', '', 1, endpoint, $8::text,
	meter, window_start, window_end, meter_id, NULL, ''
FROM unnest($1::text[], $2::text[], $3::text[], $4::bigint[], $5::text[], $6::text[], $7::text[],
	$9::text[], $10::timestamptz[], $11::timestamptz[], $12::text[])
	AS r(customer, period, key, amount, currency, owner, endpoint, meter, window_start, window_end, meter_id)`

// keysOf is the keys of units, as the update statements name them.
type keysOf func(units []int) []string

// succeed is billonce's batched success: a group's rows succeeded.
func succeed(prefix string, keys keysOf) func([]int) (string, []any) {
	return func(units []int) (string, []any) {
		ids := make([]string, len(units))
		for j, i := range units {
			ids[j] = floorID(prefix, i)
		}
		return `UPDATE fl t SET state = 'succeeded', stripe_id = d.stripe_id, updated_at = now()
			FROM unnest($1::text[], $2::text[]) AS d(key, stripe_id)
			WHERE t.key = d.key AND t.state = 'pending'`, []any{keys(units), ids}
	}
}

func floorShapes(o options) []floorShape {
	chargeKeys := func(units []int) []string {
		keys := make([]string, len(units))
		for j, i := range units {
			keys[j] = floorKey(customerID(i), period)
		}
		return keys
	}
	minimal := floorShape{
		name:   "floor (a): minimal table, charges",
		create: `CREATE TABLE fl (key text PRIMARY KEY, state text, stripe_id text, updated_at timestamptz)`,
		insert: func(from, to int) (string, []any) {
			keys, _, _, _ := floorCharges(from, to)
			return `INSERT INTO fl (key, state, stripe_id, updated_at) SELECT k, 'pending', '', now() FROM unnest($1::text[]) k`, []any{keys}
		},
		updates: []func([]int) (string, []any){succeed("ch", chargeKeys)},
	}
	likeClaims := `CREATE TABLE fl (LIKE billonce_claims INCLUDING ALL)`
	paying := func(endpoint string) func(from, to int) (string, []any) {
		return func(from, to int) (string, []any) {
			keys, custs, owners, amounts := floorCharges(from, to)
			n := to - from
			periods, currencies, endpoints := repeat(period, n), repeat("usd", n), repeat(endpoint, n)
			return claimInsert, []any{custs, periods, keys, amounts, currencies, owners, endpoints, floorCredential,
				make([]*string, n), make([]*time.Time, n), make([]*time.Time, n), make([]*string, n)}
		}
	}
	// Usage reports as the usage section makes them: customers in turn,
	// each for one one-minute window, going back in time.
	base := usageBase()
	cs := max(1, o.usageCustomers)
	window := func(i int) (customer string, start time.Time) {
		return customerID(i % cs), base.Add(-time.Duration(i/cs+2) * time.Minute)
	}
	usagePeriod := func(start time.Time) string {
		return "usage " + meterName + " " + start.Format(time.RFC3339) + " increment"
	}
	usageKeys := func(units []int) []string {
		keys := make([]string, len(units))
		for j, i := range units {
			c, start := window(i)
			keys[j] = floorKey(c, usagePeriod(start))
		}
		return keys
	}
	usage := floorShape{
		name:    "floor (c): claim table, usage reports",
		migrate: true,
		create:  likeClaims,
		insert: func(from, to int) (string, []any) {
			var keys, custs, periods, owners, meters, meterIDs []string
			var amounts []int64
			var starts, ends []time.Time
			for i := from; i < to; i++ {
				c, start := window(i)
				p := usagePeriod(start)
				keys, custs, periods, owners = append(keys, floorKey(c, p)), append(custs, c), append(periods, p), append(owners, floorOwner(i))
				amounts, meters, meterIDs = append(amounts, usageValue(i)), append(meters, meterName), append(meterIDs, "mtr_0123456789abcdefghijklmn")
				starts, ends = append(starts, start), append(ends, start.Add(time.Minute))
			}
			n := to - from
			return claimInsert, []any{custs, periods, keys, amounts, repeat("", n), owners, repeat("meter_events", n), floorCredential,
				meters, starts, ends, meterIDs}
		},
		updates: []func([]int) (string, []any){succeed("mtrev", usageKeys)},
	}
	return []floorShape{
		minimal,
		{name: "floor (b): claim table, charges", migrate: true, create: likeClaims, insert: paying("charges"),
			updates: []func([]int) (string, []any){succeed("ch", chargeKeys)}},
		usage,
		{name: "floor (d): claim table, invoices", migrate: true, create: likeClaims, insert: paying("invoices"),
			updates: []func([]int) (string, []any){succeed("in", chargeKeys)}},
	}
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

// floorResult is one floor run, per unit.
type floorResult struct {
	rate  float64
	pgCPU time.Duration
	pg    pgPer
}

// floorRun writes n units of shape f in a fresh database: one goroutine
// inserts them o.batch rows per statement, as a Run claims, and hands
// them on in groups of o.floorGroup; o.concurrency goroutines run each
// group's updates, one statement each. Every statement is its own
// transaction.
func floorRun(ctx context.Context, e *env, o options, f floorShape, n int) (floorResult, error) {
	pool, _, err := e.pool(ctx, o.concurrency+2)
	if err != nil {
		return floorResult{}, err
	}
	if f.migrate {
		s, err := claim.NewPostgres(pool, claim.Config{})
		if err != nil {
			return floorResult{}, err
		}
		if err := s.Migrate(ctx); err != nil {
			return floorResult{}, err
		}
	}
	if _, err := pool.Exec(ctx, f.create); err != nil {
		return floorResult{}, fmt.Errorf("%s: %w", f.name, err)
	}
	// Open the pool's connections, and build the statements' arguments,
	// before measuring: what the floor counts is PostgreSQL's work on the
	// rows.
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			return floorResult{}, err
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Release()
	}
	type stmt struct {
		sql  string
		args []any
		rows int
	}
	var inserts []stmt
	var groups [][]stmt // per insert, its groups' updates
	var perInsert []int
	batch, group := max(1, o.batch), max(1, o.floorGroup)
	for from := 0; from < n; from += batch {
		to := min(n, from+batch)
		sql, args := f.insert(from, to)
		inserts = append(inserts, stmt{sql, args, to - from})
		k := 0
		for g := from; g < to; g += group {
			units := make([]int, 0, group)
			for i := g; i < min(to, g+group); i++ {
				units = append(units, i)
			}
			var ups []stmt
			for _, u := range f.updates {
				sql, args := u(units)
				ups = append(ups, stmt{sql, args, len(units)})
			}
			groups = append(groups, ups)
			k++
		}
		perInsert = append(perInsert, k)
	}
	exec := func(s stmt) error {
		tag, err := pool.Exec(ctx, s.sql, s.args...)
		if err != nil {
			return fmt.Errorf("%s: %w", f.name, err)
		}
		if int(tag.RowsAffected()) != s.rows {
			return fmt.Errorf("%s: a statement wrote %d rows, want %d", f.name, tag.RowsAffected(), s.rows)
		}
		return nil
	}
	m0, err := e.mark(ctx, pool)
	if err != nil {
		return floorResult{}, err
	}
	_, pg0 := cpuTimes()
	start := time.Now()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan []stmt, 2*batch/group+1)
	var wg sync.WaitGroup
	var once sync.Once
	var first error
	fail := func(err error) { once.Do(func() { first = err; cancel() }) }
	for range max(1, o.concurrency) {
		wg.Go(func() {
			for ups := range work {
				for _, u := range ups {
					if err := exec(u); err != nil {
						fail(err)
						break
					}
				}
			}
		})
	}
	next := 0
claiming:
	for i, ins := range inserts {
		if err := exec(ins); err != nil {
			fail(err)
			break
		}
		for range perInsert[i] {
			select {
			case work <- groups[next]:
				next++
			case <-ctx.Done():
				break claiming
			}
		}
	}
	close(work)
	wg.Wait()
	elapsed := time.Since(start)
	_, pg1 := cpuTimes()
	if first != nil {
		return floorResult{}, first
	}
	m1, err := e.mark(ctx, pool)
	if err != nil {
		return floorResult{}, err
	}
	var done int
	if err := pool.QueryRow(ctx, `SELECT count(*) FROM fl WHERE state = 'succeeded'`).Scan(&done); err != nil {
		return floorResult{}, err
	}
	if done != n {
		return floorResult{}, fmt.Errorf("%s: %d rows succeeded, want %d", f.name, done, n)
	}
	return floorResult{float64(n) / elapsed.Seconds(), (pg1 - pg0) / time.Duration(n), m1.per(m0, n)}, nil
}

func benchFloor(ctx context.Context, e *env, o options, t *table) error {
	n := o.floorUnits
	for _, f := range floorShapes(o) {
		var rs []floorResult
		for range max(1, o.reps) {
			r, err := floorRun(ctx, e, o, f, n)
			if err != nil {
				return err
			}
			rs = append(rs, r)
		}
		med := func(g func(floorResult) float64) float64 {
			var xs []float64
			for _, r := range rs {
				xs = append(xs, g(r))
			}
			return median(xs)
		}
		var ps []pgPer
		for _, r := range rs {
			ps = append(ps, r.pg)
		}
		t.add(f.name, fmt.Sprintf("%.0f µs PostgreSQL CPU/unit", med(func(r floorResult) float64 { return float64(r.pgCPU.Nanoseconds()) / 1e3 })),
			fmt.Sprintf("%s; %.0f units/s; %d units, %d rows per insert, %d rows per update, %d update(s) per unit, updates from %d goroutines, each statement its own transaction",
				pgNote("unit", ps), med(func(r floorResult) float64 { return r.rate }), n, max(1, o.batch), max(1, o.floorGroup), len(f.updates), max(1, o.concurrency)))
	}
	return nil
}
