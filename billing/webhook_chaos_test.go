package billing_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/testenv"
)

// replicaEnv carries a webhook replica's configuration to the test binary
// re-executed as that replica (see TestMain).
const replicaEnv = "BILLONCE_WEBHOOK_REPLICA"

type replicaConfig struct {
	DatabaseURL, StripeURL, Secret, Addr string
}

// webhookReplica is one webhook handler process: a Biller on the shared
// database serving Webhook on Addr until killed.
func webhookReplica(raw string) int {
	var rc replicaConfig
	if err := json.Unmarshal([]byte(raw), &rc); err != nil {
		fmt.Fprintln(os.Stderr, "replica config:", err)
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, rc.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: rc.StripeURL, Claims: store, RateLimit: -1})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	h, err := b.Webhook(billing.WebhookConfig{Secret: rc.Secret})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	ln, err := net.Listen("tcp", rc.Addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("listening")
	http.Serve(ln, h)
	return 0
}

// replica is a webhook handler process started by the test.
type replica struct {
	addr string
	cmd  *exec.Cmd
	dead atomic.Bool
}

func startReplica(t *testing.T, rc replicaConfig) *replica {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rc.Addr = ln.Addr().String()
	ln.Close()
	raw, _ := json.Marshal(rc)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), replicaEnv+"="+string(raw))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, _ := cmd.StdoutPipe()
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	buf := make([]byte, 16)
	if n, _ := out.Read(buf); !strings.HasPrefix(string(buf[:n]), "listening") {
		t.Fatalf("replica did not start: %q", buf[:n])
	}
	return &replica{addr: rc.Addr, cmd: cmd}
}

// A chaos configuration for asynchronous payments: 1,000 customers (100
// without BILLONCE_LONG=1), 20%
// paying by bank debit of which 10% fail when they settle; Stripe's events
// delivered through a load balancer to two handler processes, 30%
// duplicated, in shuffled order, one process killed (SIGKILL) while
// deliveries are in flight and the sender retrying what it did not
// acknowledge. Afterwards every claim's state is its payment's final
// state at the fake, and nobody was charged twice.
func TestWebhookChaos(t *testing.T) {
	t.Parallel()
	customers := testenv.Size(100, 1000)
	const seed = 17
	rng := rand.New(rand.NewPCG(seed, 0x5e771e))
	async := map[string]billingtest.Async{}
	var nAsync, nFail int
	for i := range customers {
		if rng.Float64() < 0.2 {
			a := billingtest.Async{After: time.Duration(1+rng.IntN(72)) * time.Hour}
			if rng.Float64() < 0.1 {
				a.FailureCode = []string{"insufficient_funds", "account_closed", "debit_not_authorized"}[rng.IntN(3)]
				nFail++
			}
			async[fmt.Sprintf("cus_%04d", i)] = a
			nAsync++
		}
	}
	e := newEnvWith(t, billingtest.Config{Async: async}, func(c *billing.Config) { c.RateLimit = -1 })
	ctx := context.Background()
	var ids []string
	for i := range customers {
		ids = append(ids, fmt.Sprintf("cus_%04d", i))
	}
	start := time.Now()
	sum, err := e.b.Run(ctx, period, billing.Customers(ids...), &billing.RunOptions{Concurrency: 16})
	if err != nil {
		t.Fatal(err)
	}
	runTime := time.Since(start)
	if sum.Processing != nAsync || sum.Created != customers-nAsync {
		t.Fatalf("run = %+v; want %d processing", sum.Progress, nAsync)
	}

	// Two handler processes behind a load balancer that picks one at
	// random and answers 502 when the connection to it fails.
	dbURL := e.pool.Config().ConnString()
	rc := replicaConfig{DatabaseURL: dbURL, StripeURL: e.srv.URL, Secret: whsec}
	replicas := []*replica{startReplica(t, rc), startReplica(t, rc)}
	var forwarded, inFlight, inFlightAtKill atomic.Int64
	var mu sync.Mutex
	lbRand := rand.New(rand.NewPCG(seed, 1))
	lb := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			// The balancer's health check takes a dead replica out of
			// rotation; deliveries already sent to it fail with 502.
			mu.Lock()
			rp := replicas[lbRand.IntN(len(replicas))]
			if rp.dead.Load() {
				rp = replicas[1]
			}
			mu.Unlock()
			r.SetURL(&url.URL{Scheme: "http", Host: rp.addr})
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			w.WriteHeader(http.StatusBadGateway)
		},
	}
	killAt := int64(0)
	lbSrv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := forwarded.Add(1)
		inFlight.Add(1)
		defer inFlight.Add(-1)
		if n == atomic.LoadInt64(&killAt) {
			// Kill the first replica while this and other deliveries are
			// on their way to it.
			go func() {
				inFlightAtKill.Store(inFlight.Load())
				replicas[0].cmd.Process.Signal(syscall.SIGKILL)
				replicas[0].dead.Store(true)
			}()
		}
		lb.ServeHTTP(w, r)
	})}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go lbSrv.Serve(ln)
	t.Cleanup(func() { lbSrv.Close() })

	e.srv.Advance(73 * time.Hour) // every bank debit settles
	events := e.srv.Events()
	atomic.StoreInt64(&killAt, int64(len(events)/3))
	sender, err := billingtest.NewSender(billingtest.SenderConfig{URL: "http://" + ln.Addr().String(), Secret: whsec, Seed: seed,
		Duplicate: 0.3, Reorder: true, MaxDelay: 2 * time.Millisecond, Workers: 16, Attempts: 20, Retry: 2 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	start = time.Now()
	rep := sender.Send(ctx, events)
	sendTime := time.Since(start)
	if !replicas[0].dead.Load() {
		t.Fatal("the replica was never killed: the chaos did not happen")
	}
	if len(rep.Undelivered) > 0 {
		t.Fatalf("%d events never acknowledged: %v", len(rep.Undelivered), rep.Undelivered[:min(5, len(rep.Undelivered))])
	}

	// Every claim is in its payment's final state, and every customer has
	// at most one payment that was not failed.
	final := e.srv.Final()
	want := map[string]claim.State{"succeeded": claim.StateSucceeded, "failed": claim.StateFailed,
		"requires_payment_method": claim.StateFailed, "pending": claim.StateProcessing, "processing": claim.StateProcessing}
	var mismatches []string
	states := map[claim.State]int{}
	for _, c := range ids {
		cl := e.claimOf(c)
		states[cl.State]++
		if got, w := cl.State, want[final[cl.StripeID]]; got != w {
			mismatches = append(mismatches, fmt.Sprintf("%s: claim %s, payment %s %s", c, got, cl.StripeID, final[cl.StripeID]))
		}
		if a, ok := async[c]; ok && a.FailureCode != "" && cl.FailureCode != a.FailureCode {
			mismatches = append(mismatches, fmt.Sprintf("%s: failure code %q, want %q", c, cl.FailureCode, a.FailureCode))
		}
	}
	perCustomer := map[string]int{}
	for _, p := range e.srv.Payments() {
		if p.Status != "failed" && p.Status != "requires_payment_method" {
			perCustomer[p.Customer]++
		}
	}
	var doubles int
	for _, n := range perCustomer {
		if n > 1 {
			doubles++
		}
	}
	var eventRows int
	e.pool.QueryRow(ctx, "SELECT count(*) FROM billonce_claims_events").Scan(&eventRows)
	statuses := map[int]int{}
	for _, s := range rep.Statuses {
		statuses[s]++
	}
	t.Logf("webhook chaos: %d customers, %d by bank debit (%d failing); run %v; %d events, %d deliveries (%d duplicated), %d HTTP attempts, %d retried, statuses %v; replica killed with %d deliveries in flight; send %v; event rows %d; claims %v; mismatches %d; customers charged twice %d",
		customers, nAsync, nFail, runTime.Round(time.Millisecond), rep.Events, rep.Deliveries, rep.Duplicates, rep.Attempts, rep.Retries, statuses,
		inFlightAtKill.Load(), sendTime.Round(time.Millisecond), eventRows, states, len(mismatches), doubles)
	if len(mismatches) > 0 {
		t.Errorf("%d claims differ from the fake's final state, first: %v", len(mismatches), mismatches[:min(10, len(mismatches))])
	}
	if doubles > 0 {
		t.Errorf("%d customers charged twice", doubles)
	}
	if states[claim.StateFailed] != nFail || states[claim.StateProcessing] != 0 {
		t.Errorf("claims by state %v; want %d failed and none processing", states, nFail)
	}
	if eventRows > len(events) {
		t.Errorf("%d event rows for %d events", eventRows, len(events))
	}
	// The next run charges nobody, and reports the failed bank debits.
	before := len(e.srv.Log())
	again, err := e.b.Run(ctx, period, billing.Customers(ids...), nil)
	if err != nil {
		t.Fatal(err)
	}
	if again.DeclinedAfterProcessing != nFail || again.AlreadyBilled != customers-nFail || len(e.srv.Log()) != before {
		t.Errorf("next run = %+v with %d requests to Stripe", again.Progress, len(e.srv.Log())-before)
	}
}
