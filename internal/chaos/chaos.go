// Package chaos is the harness of the multi-process chaos examples
// (internal/cmd/chaos, internal/cmd/river-chaos). It serves the fake Stripe of
// billing/billingtest with seeded faults and declines, starts a throwaway
// PostgreSQL, starts child processes (the example's binary, re-executed
// with its configuration as JSON in an environment variable), SIGKILLs
// them, restarts PostgreSQL at seeded points of the run's progress, and
// last checks the fake's ledger against the claim table: every customer
// charged exactly once at its price, none missing but the declined, every
// paid charge named by a succeeded claim (Check); or invoiced once, each
// line once (CheckInvoices); or each usage window counted once at the
// fake's meter (CheckUsage); or charged once and each refund made once,
// none past the payment (CheckRefunds); or each connected account paid
// one transfer and one payout (CheckMoneyOut).
//
// What the children run, and how a run knows it is over, is each
// example's own. A run goes:
//
//	env, err := chaos.Start(ctx, chaos.Setup{...}) // PostgreSQL, the fake, declines, logs
//	defer env.Close()                              // kills the children still alive
//	env.Plan(kills, "kill")                        // events at seeded points of the run
//	p, err := env.StartProc(i, 1, childConfig)
//	reached := env.Hold(progress)                  // the fake holds writes at the next point
//	<-reached                                      // in the example's wait loop, then:
//	for _, ev := range env.Due(progress()) { ... } // fire what is due
//	reached = env.Release()                        // and hold at the next point
//	ledger, err := env.Check(ctx, period, periods) // the fake's ledger, once settled
//	fig.LogDir = env.CleanUp(ok)
package chaos

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/pgtest"
)

// CustomerID and Price define the customers of a run: customer i owes
// Price(i).
func CustomerID(i int) string { return fmt.Sprintf("cus_%07d", i) }

// Price is what customer i owes.
func Price(i int) billing.Price {
	return billing.Price{Amount: 100 + int64(i*7919%9900), Currency: "usd"}
}

// PriceOf is Price as a billing.Config.Price: it prices a customer by ID.
func PriceOf(_ context.Context, customer, _ string) (billing.Price, error) {
	i, err := strconv.Atoi(strings.TrimPrefix(customer, "cus_"))
	if err != nil {
		return billing.Price{}, fmt.Errorf("no price for %q", customer)
	}
	return Price(i), nil
}

// CheckConfig refuses the settings that would let a run prove nothing or
// never finish: an attempt timeout the slow fault cannot exceed, a lease
// shorter than three attempts, a decline fraction outside [0, 1], a bad
// period.
func CheckConfig(period string, attemptTimeout, lease time.Duration, declineFraction float64) error {
	switch {
	case attemptTimeout <= 0 || attemptTimeout >= billingtest.DefaultSlowDelay:
		return fmt.Errorf("attempt timeout %v must be positive and shorter than the slow fault's delay %v, or slow requests never time out", attemptTimeout, billingtest.DefaultSlowDelay)
	case lease < 3*attemptTimeout:
		return fmt.Errorf("lease %v must be at least 3 attempt timeouts (%v)", lease, 3*attemptTimeout)
	case declineFraction < 0 || declineFraction > 1:
		return fmt.Errorf("decline fraction %v must be between 0 and 1", declineFraction)
	}
	return billing.ValidatePeriod(period)
}

// Setup is what Start needs.
type Setup struct {
	// Name prefixes errors and names the temporary log directory.
	Name string
	// Seed and Stream seed Rand, which draws the declines and then the
	// events; each example has a Stream of its own.
	Seed      int64
	Stream    uint64
	Customers int
	// Rates are the fake's seeded fault probabilities per request.
	Rates map[billingtest.FaultKind]float64
	// DeclineFraction of the customers have a card that always declines.
	DeclineFraction float64
	// MeterDelay is the fake's billingtest.Config.MeterDelay: how long
	// after acceptance a meter event is counted or rejected into an error
	// report. Zero is the fake's default, a minute.
	MeterDelay time.Duration
	// LogDir keeps the children's logs; empty means a temporary directory,
	// removed by CleanUp after a run whose invariants hold.
	LogDir string
	// Exe is the program StartProc runs (os.Args[0] by default), ProcEnv
	// the variable that carries a child's configuration, ProcName what a
	// child is called in errors ("runner", "worker").
	Exe, ProcEnv, ProcName string
	// Out receives progress lines and the children's output; nil discards
	// them.
	Out io.Writer
	// Cluster, if set, is the PostgreSQL the run takes a fresh database
	// of (and restarts), so that runs in a row start it once; Close
	// leaves it running. Nil starts a cluster of the run's own.
	Cluster *pgtest.Cluster
}

// Env is one run: the PostgreSQL cluster, a database in it, the fake
// Stripe, the declined customers, the children and the planned events.
type Env struct {
	Pool     *pgxpool.Pool // the harness's own connections
	Fake     *billingtest.Server
	Declined map[string]bool
	LogDir   string     // where the children log
	Rand     *rand.Rand // drew the declines and the events; the example's to use for its own

	s        Setup
	cluster  *pgtest.Cluster
	dbURL    string
	toCharge int // customers not declined
	wall     time.Time
	procs    []*Proc
	events   []Event
	gate     gate

	delivered int                 // the fake's events delivered by DeliverWebhooks
	redeliver []billingtest.Event // and those refused, delivered again next time

	accounts   []string       // the connected accounts of CreateAccounts, by customer
	accountIdx map[string]int // and the customer of each
}

// Start starts PostgreSQL with a fresh database and serves the fake with
// the seeded faults and declines. Close undoes it.
func Start(ctx context.Context, s Setup) (*Env, error) {
	if s.Exe == "" {
		s.Exe = os.Args[0]
	}
	if s.Out == nil {
		s.Out = io.Discard
	}
	e := &Env{s: s, wall: time.Now(), Rand: rand.New(rand.NewPCG(uint64(s.Seed), s.Stream))}
	err := e.start(ctx)
	if err != nil {
		e.Close()
		return nil, err
	}
	return e, nil
}

func (e *Env) start(ctx context.Context) error {
	var err error
	if e.cluster = e.s.Cluster; e.cluster == nil {
		if e.cluster, err = pgtest.Start(ctx); err != nil {
			return err
		}
	}
	if e.dbURL, err = e.cluster.NewDatabase(ctx); err != nil {
		return err
	}
	pcfg, err := pgxpool.ParseConfig(e.dbURL)
	if err != nil {
		return err
	}
	// PostgreSQL is restarted during the chaos phase (by this harness, or
	// by another one on the same cluster): a connection left idle in the
	// pool across a restart is dead, and is found out by a ping before it
	// is used rather than by the query that follows.
	pcfg.PrepareConn = func(ctx context.Context, c *pgx.Conn) (bool, error) {
		return c.Ping(ctx) == nil, nil
	}
	if e.Pool, err = pgxpool.NewWithConfig(ctx, pcfg); err != nil {
		return err
	}
	random, err := billingtest.RandomFaults(e.s.Seed, e.s.Rates)
	if err != nil {
		return err
	}
	e.Fake = billingtest.NewServer(billingtest.Config{Script: e.gate.script(random), MeterDelay: e.s.MeterDelay})
	// The seeded draws depend on the requests' keys, and a usage report's
	// key on its window, which moves with the day: a small run may draw no
	// fault of a kind at all. The first writes get one lost answer and one
	// 500 after commit each, whenever their rates are set, so that every
	// run meets them.
	for _, k := range []billingtest.FaultKind{billingtest.FaultCut, billingtest.FaultErrorAfter} {
		if e.s.Rates[k] > 0 {
			e.Fake.FailNext(billingtest.Match{Method: http.MethodPost}, billingtest.Fault{Kind: k})
		}
	}
	e.Declined = map[string]bool{}
	for i := range e.s.Customers {
		if e.Rand.Float64() < e.s.DeclineFraction {
			e.Declined[CustomerID(i)] = true
			e.Fake.Decline(CustomerID(i), "insufficient_funds")
		}
	}
	e.toCharge = e.s.Customers - len(e.Declined)
	e.LogDir = e.s.LogDir
	if e.LogDir == "" {
		e.LogDir, err = os.MkdirTemp("", "billonce-"+e.s.Name+"-")
		return err
	}
	return os.MkdirAll(e.LogDir, 0o755)
}

// Close SIGKILLs the children still alive, closes the fake and stops
// PostgreSQL.
func (e *Env) Close() {
	for _, p := range e.procs {
		if !p.Exited() {
			p.cmd.Process.Kill()
			<-p.done
		}
	}
	if e.Fake != nil {
		e.Fake.Close()
	}
	if e.Pool != nil {
		e.Pool.Close()
	}
	if e.cluster != nil && e.s.Cluster == nil {
		e.cluster.Stop()
	}
}

// Logf writes a progress line to Out, stamped with the time since Start.
func (e *Env) Logf(format string, args ...any) {
	fmt.Fprintf(e.s.Out, "%s "+format+"\n", append([]any{time.Since(e.wall).Round(time.Millisecond)}, args...)...)
}

// Elapsed is the time since Start.
func (e *Env) Elapsed() time.Duration { return time.Since(e.wall) }

// Errorf is an error of the harness, prefixed with its Name.
func (e *Env) Errorf(format string, args ...any) error {
	return fmt.Errorf(e.s.Name+": "+format, args...)
}

// ProcURL is the database URL for a child: its connections carry
// application name appName (so they can be found and terminated) and its
// pool holds at most maxConns.
func (e *Env) ProcURL(appName string, maxConns int) string {
	u, _ := url.Parse(e.dbURL)
	q := u.Query()
	q.Set("application_name", appName)
	q.Set("pool_max_conns", fmt.Sprint(maxConns))
	u.RawQuery = q.Encode()
	return u.String()
}

// Proc is one child process.
type Proc struct {
	Index, Gen int
	// Killed is set by Kill: the process did not exit on its own.
	Killed bool
	// Err is how the process exited, once Done is closed.
	Err  error
	cmd  *exec.Cmd
	done chan struct{}
}

// StartProc starts child index, generation gen: Exe with config, as JSON,
// in ProcEnv. The child dies with the harness.
func (e *Env) StartProc(index, gen int, config any) (*Proc, error) {
	raw, err := json.Marshal(config)
	if err != nil {
		return nil, e.Errorf("%s config: %w", e.s.ProcName, err)
	}
	cmd := exec.Command(e.s.Exe)
	cmd.Env = append(os.Environ(), e.s.ProcEnv+"="+string(raw))
	cmd.Stdout, cmd.Stderr = e.s.Out, e.s.Out
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, e.Errorf("starting %s %d: %w", e.s.ProcName, index, err)
	}
	p := &Proc{Index: index, Gen: gen, cmd: cmd, done: make(chan struct{})}
	go func() { p.Err = cmd.Wait(); close(p.done) }()
	e.procs = append(e.procs, p)
	return p, nil
}

// Child makes this process the child StartProc started, if it is one: it
// decodes the configuration from envVar and exits with main's code.
// Otherwise it returns at once. Call it first thing in main and TestMain:
// a child must never fall through to the harness, which would start
// children of its own.
func Child[C any](envVar string, main func(C) int) {
	raw, ok := os.LookupEnv(envVar)
	if !ok {
		return
	}
	var cfg C
	if err := json.Unmarshal([]byte(raw), &cfg); err != nil {
		fmt.Fprintf(os.Stderr, "bad %s: %v\n", envVar, err)
		os.Exit(3)
	}
	os.Exit(main(cfg))
}

// Done is closed when the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited (and Err is set).
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Pid is the process's ID.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill SIGKILLs the process and waits for it.
func (p *Proc) Kill() {
	p.Killed = true
	p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Terminate sends SIGTERM; wait on Done.
func (p *Proc) Terminate() { p.cmd.Process.Signal(syscall.SIGTERM) }

// Event is a chaos event: it fires once At customers are charged.
type Event struct {
	At   int
	Kind string
}

// Plan adds n events of kind at seeded points between 5% and 85% of the
// customers to charge. Events fire at progress measured as customers
// charged at the fake, so they land mid-run however fast the machine is.
func (e *Env) Plan(n int, kind string) {
	for range n {
		e.events = append(e.events, Event{At: int(float64(e.toCharge) * (0.05 + 0.8*e.Rand.Float64())), Kind: kind})
	}
	slices.SortStableFunc(e.events, func(a, b Event) int { return a.At - b.At })
}

// Due removes and returns the events due once paid customers are charged,
// in order.
func (e *Env) Due(paid int) []Event {
	n := 0
	for n < len(e.events) && e.events[n].At <= paid {
		n++
	}
	due := e.events[:n:n]
	e.events = e.events[n:]
	return due
}

// EventsLeft is how many planned events have not fired.
func (e *Env) EventsLeft() int { return len(e.events) }

// Hold makes the fake hold the answer of every write it executes once
// progress (customers charged, as the example counts them) has reached
// the next planned event's point, and returns a channel closed when a
// write has met it. The example then fires the due events (Due) while
// the runners wait for their answers, and calls Release. The events
// land at their points however busy the machine: the runners cannot
// run on and finish while the example's loop waits for its next turn.
// A runner killed meanwhile dies with its write executed at the fake and
// unanswered.
func (e *Env) Hold(progress func() int) <-chan struct{} {
	return e.gate.arm(progress, e.nextAt())
}

// Release lets the held writes answer, and holds again at the next
// planned event's point: it returns the channel of that point, or nil
// (never ready) when no event is left.
func (e *Env) Release() <-chan struct{} {
	return e.gate.arm(nil, e.nextAt())
}

func (e *Env) nextAt() int {
	if len(e.events) == 0 {
		return -1
	}
	return e.events[0].At
}

// gate is Hold's: the fake's script consults it for every write.
type gate struct {
	mu       sync.Mutex
	progress func() int
	at       int           // the point writes are held at; -1: none
	reached  chan struct{} // closed once a write met at
	met      bool
	release  chan struct{} // what held writes wait for
}

// arm releases the held writes and holds again at at (-1: nowhere), with
// progress if it is not nil. It returns the new point's channel, nil for
// none.
func (g *gate) arm(progress func() int, at int) <-chan struct{} {
	g.mu.Lock()
	defer g.mu.Unlock()
	if progress != nil {
		g.progress = progress
	}
	if g.release != nil {
		close(g.release)
	}
	g.at, g.met = at, false
	g.release = make(chan struct{})
	if at < 0 {
		g.reached = nil
		return nil
	}
	g.reached = make(chan struct{})
	return g.reached
}

// script is next behind the gate: a write that finds the point reached
// is executed and held (billingtest.FaultSlow until Release), any other
// request gets next's fault.
func (g *gate) script(next func(billingtest.Request) billingtest.Fault) func(billingtest.Request) billingtest.Fault {
	return func(r billingtest.Request) billingtest.Fault {
		if r.Method == http.MethodPost {
			g.mu.Lock()
			held := g.progress != nil && g.at >= 0 && g.progress() >= g.at
			if held && !g.met {
				g.met = true
				close(g.reached)
			}
			release := g.release
			g.mu.Unlock()
			if held {
				return billingtest.Fault{Kind: billingtest.FaultSlow, Release: release}
			}
		}
		return next(r)
	}
}

// RestartPostgres stops PostgreSQL, keeps it down for down and starts it
// again; paid is the progress logged.
func (e *Env) RestartPostgres(ctx context.Context, down time.Duration, paid int) error {
	e.Logf("restarting PostgreSQL (down %v) at %d charged", down, paid)
	if err := e.cluster.Restart(ctx, down); err != nil {
		return e.Errorf("restarting PostgreSQL: %w", err)
	}
	return nil
}

// CleanUp removes a temporary log directory if ok, and returns the
// directory the logs are kept in ("" if removed).
func (e *Env) CleanUp(ok bool) string {
	if ok && e.s.LogDir == "" {
		os.RemoveAll(e.LogDir)
		return ""
	}
	return e.LogDir
}

// FaultRows writes, with row, the total of faults injected and the count
// of each kind injected.
func FaultRows(faults map[billingtest.FaultKind]int64, row func(name string, v any)) {
	var total int64
	for _, k := range faultOrder {
		total += faults[k]
	}
	row("faults injected", total)
	for _, k := range faultOrder {
		if n := faults[k]; n > 0 {
			row("  "+string(k), n)
		}
	}
}

// FaultFlags defines on fs a flag per fault kind of defaults (-cut,
// -slow, …): the probability of the fault per request, set in rates,
// which starts with the defaults.
func FaultFlags(fs *flag.FlagSet, rates, defaults map[billingtest.FaultKind]float64) {
	for k, def := range defaults {
		rates[k] = def
		fs.Func(faultFlags[k][0], fmt.Sprintf("probability of %s per request (default %v)", faultFlags[k][1], def), func(s string) error {
			v, err := strconv.ParseFloat(s, 64)
			rates[k] = v
			return err
		})
	}
}

// faultFlags are the flag name and meaning of each fault kind.
var faultFlags = map[billingtest.FaultKind][2]string{
	billingtest.FaultCut:         {"cut", "commit, then cut the response (the lost answer)"},
	billingtest.FaultDrop:        {"drop", "commit, then drop the connection without a byte"},
	billingtest.FaultSlow:        {"slow", "commit, then answer after 2s, beyond the attempt timeout"},
	billingtest.FaultErrorBefore: {"error-before", "500 before commit"},
	billingtest.FaultErrorAfter:  {"error-after", "500 after commit (stored and replayed)"},
	billingtest.FaultInFlight:    {"in-flight", "409 idempotency_key_in_use"},
	billingtest.FaultLockTimeout: {"lock-timeout", "429 lock_timeout"},
}

var faultOrder = []billingtest.FaultKind{
	billingtest.FaultCut, billingtest.FaultDrop, billingtest.FaultSlow, billingtest.FaultErrorBefore,
	billingtest.FaultErrorAfter, billingtest.FaultInFlight, billingtest.FaultLockTimeout,
	billingtest.FaultRateLimit, billingtest.FaultDecline,
}

// LogWriter is an Out for tests: every write is a t.Log line.
func LogWriter(t testing.TB) io.Writer { return tWriter{t} }

type tWriter struct{ t testing.TB }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Helper()
	w.t.Log(string(p))
	return len(p), nil
}
