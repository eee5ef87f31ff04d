package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"iter"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/pgtest"
)

const period = "2026-09"

// env is the PostgreSQL cluster every measurement shares.
type env struct {
	cluster *pgtest.Cluster
	pools   []*pgxpool.Pool
	walConn *pgx.Conn // reads the WAL position; see mark
}

func newEnv(ctx context.Context) (*env, error) {
	c, err := pgtest.Start(ctx)
	if err != nil {
		return nil, err
	}
	return &env{cluster: c}, nil
}

func (e *env) close() {
	for _, p := range e.pools {
		p.Close()
	}
	if e.walConn != nil {
		e.walConn.Close(context.Background())
	}
	e.cluster.Stop()
}

// store returns a claim store on a fresh database, whose pool (the last
// of e.pools) counts its round trips.
func (e *env) store(ctx context.Context, maxConns int) (*claim.Postgres, string, error) {
	pool, u, err := e.pool(ctx, maxConns)
	if err != nil {
		return nil, "", err
	}
	s, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		return nil, "", err
	}
	return s, u, s.Migrate(ctx)
}

// pool returns a pool of at most maxConns connections on a fresh database,
// counting its round trips (see roundTrips), and the database's URL.
func (e *env) pool(ctx context.Context, maxConns int) (*pgxpool.Pool, string, error) {
	u, err := e.cluster.NewDatabase(ctx)
	if err != nil {
		return nil, "", err
	}
	u += fmt.Sprintf("&pool_max_conns=%d", maxConns)
	pool, err := newPool(ctx, u)
	if err != nil {
		return nil, "", err
	}
	e.pools = append(e.pools, pool)
	return pool, u, nil
}

// lastPool is the pool of the store or pool made last.
func (e *env) lastPool() *pgxpool.Pool { return e.pools[len(e.pools)-1] }

func customerID(i int) string { return fmt.Sprintf("cus_%08d", i) }

func price(i int) billing.Price {
	return billing.Price{Amount: 100 + int64(i%9900), Currency: "usd"}
}

// customers streams n customers with their prices, never holding them all.
func customers(n int) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for i := range n {
			p := price(i)
			if !yield(billing.Item{Customer: customerID(i), Price: &p}, nil) {
				return
			}
		}
	}
}

// concurrently calls do for each of n jobs (0 to n-1) on conc goroutines,
// as a naive loop at the same concurrency as a Run would, and returns the
// wall time and this process's CPU time per job. The first error stops
// the loop.
func concurrently(conc, n int, do func(i int) error) (elapsed, selfCPU time.Duration, err error) {
	jobs := make(chan int)
	errs := make(chan error, conc)
	var wg sync.WaitGroup
	self0, _ := cpuTimes()
	start := time.Now()
	for range conc {
		wg.Go(func() {
			for i := range jobs {
				if err := do(i); err != nil {
					errs <- err
					for range jobs { // let the feeder finish
					}
					return
				}
			}
		})
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	elapsed = time.Since(start)
	self1, _ := cpuTimes()
	select {
	case err := <-errs:
		return 0, 0, err
	default:
	}
	return elapsed, (self1 - self0) / time.Duration(n), nil
}

// medianOf is the median of f over rs.
func medianOf(rs []result, f func(result) float64) float64 {
	var xs []float64
	for _, r := range rs {
		xs = append(xs, f(r))
	}
	return median(xs)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func reps(n int, f func() (float64, error)) (float64, error) {
	var xs []float64
	for range max(1, n) {
		x, err := f()
		if err != nil {
			return 0, err
		}
		xs = append(xs, x)
	}
	return median(xs), nil
}

func benchKey(t *table) {
	r := testing.Benchmark(func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := idemkey.For("billonce", "cus_00001234", period, "1"); err != nil {
				b.Fatal(err)
			}
		}
	})
	t.add("key derivation (idemkey.For)", fmt.Sprintf("%d ns/op", r.NsPerOp()), fmt.Sprintf("%d allocs/op, %d B/op", r.AllocsPerOp(), r.AllocedBytesPerOp()))
}

func requests(n, from int) []claimengine.Request {
	reqs := make([]claimengine.Request, n)
	for i := range reqs {
		c := customerID(from + i)
		reqs[i] = claimengine.Request{Customer: c, Period: period, Key: "bench:" + c, Amount: 1000, Currency: "usd", Owner: "bench"}
	}
	return reqs
}

func benchClaim(ctx context.Context, e *env, o options, t *table) error {
	store, _, err := e.store(ctx, 4)
	if err != nil {
		return err
	}
	s := claimengine.Of[claim.Claim](store)
	next := 0
	const singles = 2000
	us, err := reps(o.reps, func() (float64, error) {
		reqs := requests(singles, next)
		next += singles
		start := time.Now()
		for _, r := range reqs {
			if _, err := s.Claim(ctx, r); err != nil {
				return 0, err
			}
		}
		return float64(time.Since(start).Microseconds()) / singles, nil
	})
	if err != nil {
		return err
	}
	t.add("claim: single round trip", fmt.Sprintf("%.0f µs", us), fmt.Sprintf("new claims, one at a time, median of %d×%d", o.reps, singles))
	for _, size := range []int{1000, 10000} {
		perSec, err := reps(o.reps, func() (float64, error) {
			reqs := requests(size, next)
			next += size
			start := time.Now()
			if _, err := s.ClaimBatch(ctx, reqs); err != nil {
				return 0, err
			}
			return float64(size) / time.Since(start).Seconds(), nil
		})
		if err != nil {
			return err
		}
		t.add(fmt.Sprintf("claim: batch of %d", size), fmt.Sprintf("%.0f claims/s", perSec), "new claims, one ClaimBatch")
	}
	return nil
}

// result is one timed run: charges per second, CPU per charge in this
// process (the fake included) and in PostgreSQL, and PostgreSQL's round
// trips and WAL per charge.
type result struct {
	rate           float64
	selfCPU, pgCPU time.Duration
	pg             pgPer
}

// billonceRun bills n customers with a Biller against a fresh fake, with
// no latency unless rt adds it.
func billonceRun(ctx context.Context, e *env, o options, n int, cpu io.Writer, rt http.RoundTripper) (result, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	s, _, err := e.store(ctx, o.concurrency+2)
	if err != nil {
		return result{}, err
	}
	cfg := billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: -1}
	if rt != nil {
		cfg.HTTPClient = &http.Client{Transport: rt}
	}
	b, err := billing.New(cfg)
	if err != nil {
		return result{}, err
	}
	if cpu != nil {
		if err := pprof.StartCPUProfile(cpu); err != nil {
			return result{}, err
		}
		defer pprof.StopCPUProfile()
	}
	m0, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return result{}, err
	}
	self0, pg0 := cpuTimes()
	sum, err := b.Run(ctx, period, customers(n), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch})
	if err != nil {
		return result{}, err
	}
	self1, pg1 := cpuTimes()
	m1, err := e.mark(ctx, e.lastPool())
	if err != nil {
		return result{}, err
	}
	if sum.Created != n || srv.Stats().Paid != int64(n) {
		return result{}, fmt.Errorf("billonce Run created %d, fake paid %d, want %d", sum.Created, srv.Stats().Paid, n)
	}
	return result{float64(n) / sum.Elapsed.Seconds(), (self1 - self0) / time.Duration(n), (pg1 - pg0) / time.Duration(n), m1.per(m0, n)}, nil
}

// naiveRun calls stripe-go directly with a random key per charge, no
// database, the same concurrency, against a fresh fake, with no latency
// unless rt adds it.
func naiveRun(ctx context.Context, o options, n int, rt http.RoundTripper) (result, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL: stripe.String(srv.URL), HTTPClient: &http.Client{Timeout: 30 * time.Second, Transport: rt},
		MaxNetworkRetries: stripe.Int64(0), LeveledLogger: &stripe.LeveledLogger{Level: stripe.LevelNull},
	})
	cl := charge.Client{B: backend, Key: "sk_test_bench"}
	elapsed, self, err := concurrently(o.concurrency, n, func(i int) error {
		p := price(i)
		var k [16]byte
		rand.Read(k[:])
		params := &stripe.ChargeParams{Amount: stripe.Int64(p.Amount), Currency: stripe.String(p.Currency), Customer: stripe.String(customerID(i))}
		params.Context, params.IdempotencyKey = ctx, stripe.String(hex.EncodeToString(k[:]))
		params.Metadata = map[string]string{billing.MetaCustomer: customerID(i), billing.MetaPeriod: period}
		_, err := cl.New(params)
		return err
	})
	if err != nil {
		return result{}, err
	}
	if srv.Stats().Paid != int64(n) {
		return result{}, fmt.Errorf("naive loop: fake paid %d, want %d", srv.Stats().Paid, n)
	}
	return result{rate: float64(n) / elapsed.Seconds(), selfCPU: self}, nil
}

func pgsOf(rs []result) []pgPer {
	var ps []pgPer
	for _, r := range rs {
		ps = append(ps, r.pg)
	}
	return ps
}

func benchRun(ctx context.Context, e *env, o options, t *table) error {
	var safe, naive []result
	// Interleave the two so that drift of the machine hits both alike.
	for range max(1, o.reps) {
		s, err := billonceRun(ctx, e, o, o.customers, nil, nil)
		if err != nil {
			return err
		}
		nv, err := naiveRun(ctx, o, o.customers, nil)
		if err != nil {
			return err
		}
		safe, naive = append(safe, s), append(naive, nv)
	}
	med := medianOf
	rate := func(r result) float64 { return r.rate }
	self := func(r result) float64 { return float64(r.selfCPU.Microseconds()) }
	pg := func(r result) float64 { return float64(r.pgCPU.Microseconds()) }
	ms, mn := med(safe, rate), med(naive, rate)
	ratio := ms / mn
	t.add(fmt.Sprintf("Run of %d, billonce", o.customers), fmt.Sprintf("%.0f charges/s", ms),
		fmt.Sprintf("claims in PostgreSQL, concurrency %d, batch %d; CPU/charge: %.0f µs here (fake included) + %.0f µs PostgreSQL; %s", o.concurrency, o.batch, med(safe, self), med(safe, pg), pgNote("charge", pgsOf(safe))))
	t.add(fmt.Sprintf("Run of %d, naive loop", o.customers), fmt.Sprintf("%.0f charges/s", mn),
		fmt.Sprintf("stripe-go, random keys, no database, same concurrency; CPU/charge: %.0f µs here (fake included)", med(naive, self)))
	t.add("billonce / naive", fmt.Sprintf("%.2f", ratio), fmt.Sprintf("1.00 would be free; %d CPUs", runtime.NumCPU()))
	if ratio >= 0.5 && o.profile == "" {
		return nil
	}
	path := o.profile
	if path == "" {
		path = filepath.Join(os.TempDir(), "billonce-run.cpu.pprof")
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := billonceRun(ctx, e, o, o.customers, f, nil); err != nil {
		f.Close()
		return err
	}
	f.Close()
	if o.memprofile != "" {
		if err := writeAllocs(o.memprofile); err != nil {
			return err
		}
		t.add("allocation profile", o.memprofile, "allocations since the process started: go tool pprof -sample_index=alloc_space")
	}
	t.add("CPU profile of a billonce Run", path, "this process only; cumulative top entries below")
	t.notes = append(t.notes, topOfProfile(path)...)
	return nil
}

// topOfProfile summarises a CPU profile with go tool pprof, if the Go
// toolchain is there.
func topOfProfile(path string) []string {
	exe, _ := os.Executable()
	out, err := exec.Command("go", "tool", "pprof", "-top", "-cum", "-nodecount=200", exe, path).Output()
	if err != nil {
		return []string{"(go tool pprof -top " + path + " failed: " + err.Error() + ")"}
	}
	// Keep the header and the entries that say where a charge's time goes.
	keep := regexp.MustCompile(`flat%|Total samples|billing\.\(\*Biller\)\.(send|record|create|settle|sendUsage|prepareUsage)$|retry\.Do|claim\.\(\*Postgres\)\.(Succeed|ClaimBatch|Renew)$|(charge|meterevent)\.Client\.New|serveHTTP$|dialConnFor$|Syscall6$|runtime\.mallocgc$|runtime\.gcBgMarkWorker$|json\.Unmarshal$|stripe-go/v79\.\(\*BackendImplementation\)\.Do$`)
	var lines []string
	for _, l := range strings.Split(string(out), "\n") {
		if keep.MatchString(l) {
			lines = append(lines, regexp.MustCompile(`\[go\.shape[^\]]*\]`).ReplaceAllString(l, "[…]"))
		}
	}
	return lines
}

func benchRate(ctx context.Context, e *env, o options, t *table) error {
	floor := float64(o.rateN) / o.rate
	var limited int64
	ratio, err := reps(o.reps, func() (float64, error) {
		srv := billingtest.NewServer(billingtest.Config{RateLimit: o.rate})
		defer srv.Close()
		s, _, err := e.store(ctx, o.concurrency+2)
		if err != nil {
			return 0, err
		}
		b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: o.rate})
		if err != nil {
			return 0, err
		}
		sum, err := b.Run(ctx, period, customers(o.rateN), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch})
		if err != nil {
			return 0, err
		}
		if sum.Created != o.rateN {
			return 0, fmt.Errorf("rate-limited Run created %d of %d: %v", sum.Created, o.rateN, sum.Failures)
		}
		limited += srv.Stats().RateLimited
		return sum.Elapsed.Seconds() / floor, nil
	})
	if err != nil {
		return err
	}
	t.add(fmt.Sprintf("rate-limited Run of %d at R=%g/s", o.rateN, o.rate), fmt.Sprintf("%.2f × floor", ratio),
		fmt.Sprintf("floor N/R = %.1fs; Biller RateLimit = R; %d answers 429 in %d runs", floor, limited, max(1, o.reps)))
	if o.reconcileN <= 0 {
		return nil
	}
	var most int
	limited = 0
	ratio, err = reps(o.reps, func() (float64, error) {
		x, m, l, err := rateWithReconcile(ctx, e, o)
		most, limited = max(most, m), limited+l
		return x, err
	})
	if err != nil {
		return err
	}
	t.add(fmt.Sprintf("the same Run while Reconcile searches for %d claims", o.reconcileN), fmt.Sprintf("%.2f × floor", ratio),
		fmt.Sprintf("one Biller; claims past their window; at most %d searches in one second; %d answers 429 in %d runs", most, limited, max(1, o.reps)))
	return nil
}

// rateWithReconcile runs the rate-limited Run while the same Biller
// reconciles o.reconcileN claims of an earlier period that are past their
// window, so that each needs two searches. It returns the Run's wall time
// over N/R, the most search requests the fake saw in one second, and its
// 429 answers.
func rateWithReconcile(ctx context.Context, e *env, o options) (float64, int, int64, error) {
	srv := billingtest.NewServer(billingtest.Config{})
	defer srv.Close()
	s, _, err := e.store(ctx, o.concurrency+4)
	if err != nil {
		return 0, 0, 0, err
	}
	pool := e.lastPool()
	const earlier = "2026-08"
	b0, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: -1})
	if err != nil {
		return 0, 0, 0, err
	}
	if sum, err := b0.Run(ctx, earlier, customers(o.reconcileN), nil); err != nil || sum.Created != o.reconcileN {
		return 0, 0, 0, fmt.Errorf("preparing claims to reconcile: %+v, %v", sum.Progress, err)
	}
	// Left pending by a runner that died, a day ago: Stripe forgot the
	// keys, so Reconcile must find each charge by search.
	if _, err := pool.Exec(ctx, `UPDATE billonce_claims SET state = 'pending', stripe_id = '', owner = '',
		lease_until = now() - interval '1 second', created_at = created_at - interval '25 hours',
		first_sent_at = first_sent_at - interval '25 hours' WHERE period = $1`, earlier); err != nil {
		return 0, 0, 0, err
	}
	srv.Advance(25 * time.Hour)
	if err := srv.SetRateLimit(o.rate, 0); err != nil {
		return 0, 0, 0, err
	}
	b, err := billing.New(billing.Config{SecretKey: "sk_test_bench", StripeURL: srv.URL, Claims: s, RateLimit: o.rate})
	if err != nil {
		return 0, 0, 0, err
	}
	rctx, stop := context.WithCancel(ctx)
	reconciled := make(chan error, 1)
	go func() {
		_, err := b.Reconcile(rctx, nil)
		reconciled <- err
	}()
	time.Sleep(200 * time.Millisecond) // the reconciliation is under way
	sum, err := b.Run(ctx, period, customers(o.rateN), &billing.RunOptions{Concurrency: o.concurrency, BatchSize: o.batch})
	stop()
	<-reconciled
	if err != nil {
		return 0, 0, 0, err
	}
	if sum.Created != o.rateN {
		return 0, 0, 0, fmt.Errorf("rate-limited Run during Reconcile created %d of %d: %v", sum.Created, o.rateN, sum.Failures)
	}
	var searches []time.Time
	for _, en := range srv.Log() {
		if strings.HasSuffix(en.Path, "/search") {
			searches = append(searches, en.Time)
		}
	}
	most := 0
	for i := range searches {
		j := i
		for j < len(searches) && searches[j].Sub(searches[i]) < time.Second {
			j++
		}
		most = max(most, j-i)
	}
	return sum.Elapsed.Seconds() / (float64(o.rateN) / o.rate), most, srv.Stats().RateLimited, nil
}
