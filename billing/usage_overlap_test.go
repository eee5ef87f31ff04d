package billing_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// window is a report of customer on api_calls from base+from to base+to
// (in minutes): base is whole hours ago, so that every window is over.
func window(customer string, base time.Time, from, to int, value int64) billing.Usage {
	return billing.Usage{Customer: customer, Meter: "api_calls", Kind: billing.Increments,
		Start: base.Add(time.Duration(from) * time.Minute), End: base.Add(time.Duration(to) * time.Minute), Value: value}
}

// overlapBase is the start of the hour four hours ago.
func overlapBase() time.Time { return hourAgo().Add(-3 * time.Hour) }

// claimedWindow is how a refusal names the window already claimed.
func claimedWindow(u billing.Usage) string {
	return u.Start.Format(time.RFC3339) + " to " + u.End.Format(time.RFC3339)
}

// The meter adds up every event of a customer, so two reports whose
// windows overlap would count the overlap twice. A window that overlaps
// a claimed one is refused as invalid input, naming the claimed window,
// whichever replica or scope claimed it and whatever the overlap (a start
// or an end inside it, a window inside it or around it, the same start);
// the same window again is the same report, and windows that only meet
// are two.
func TestOverlappingUsageWindowIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase()
	hour := window("cus_1", base, 60, 120, 7)
	if r, err := e.b.ReportUsage(ctx, hour); err != nil || r.Outcome != billing.Created {
		t.Fatalf("first window = %+v, %v; want created", r, err)
	}
	replica := e.biller()
	otherScope := e.biller(func(c *billing.Config) { c.Scope = "other-product" })
	for name, tc := range map[string]struct {
		b *billing.Biller
		u billing.Usage
	}{
		"end inside":                     {e.b, window("cus_1", base, 30, 90, 3)},
		"start inside":                   {e.b, window("cus_1", base, 90, 150, 3)},
		"inside":                         {e.b, window("cus_1", base, 75, 105, 3)},
		"around":                         {e.b, window("cus_1", base, 0, 180, 3)},
		"same start, shorter":            {e.b, window("cus_1", base, 60, 90, 3)},
		"same end, longer":               {e.b, window("cus_1", base, 30, 120, 3)},
		"from another replica":           {replica, window("cus_1", base, 61, 121, 3)},
		"another scope, moved":           {otherScope, window("cus_1", base, 59, 119, 7)},
		"from another replica, a minute": {replica, window("cus_1", base, 119, 120, 3)},
	} {
		r, err := tc.b.ReportUsage(ctx, tc.u)
		if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), claimedWindow(hour)) {
			t.Errorf("%s: %+v, %v; want ErrInvalid naming the window claimed, %s", name, r, err, claimedWindow(hour))
		}
	}
	// The same window under another scope's key is another report of it,
	// refused as one.
	var m *claim.MismatchError
	if _, err := otherScope.ReportUsage(ctx, hour); !errors.As(err, &m) {
		t.Errorf("the same window from another scope = %v, want a *claim.MismatchError", err)
	}
	if r, err := replica.ReportUsage(ctx, hour); err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("the same window again = %+v, %v; want already billed", r, err)
	}
	before, after := window("cus_1", base, 0, 60, 2), window("cus_1", base, 120, 180, 4)
	for _, u := range []billing.Usage{before, after, window("cus_2", base, 90, 150, 5)} {
		if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
			t.Errorf("%s %s = %+v, %v; want created: it overlaps no window of its customer", u.Customer, claimedWindow(u), r, err)
		}
	}
	if n := e.srv.MeterEvents("api_calls", "cus_1"); n != 3 {
		t.Errorf("cus_1: %d meter events, want 3 (the hour and the two that meet it)", n)
	}
	if got := e.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)); got != 2+7+4 {
		t.Errorf("cus_1: the meter counts %v over the three hours, want %d", got, 2+7+4)
	}
	if got := e.srv.MeterTotal("api_calls", "cus_2", base, base.Add(3*time.Hour)); got != 5 {
		t.Errorf("cus_2: the meter counts %v, want 5", got)
	}
}

// A window whose event Stripe rejected (its claim failed) no longer holds
// its time: an overlapping window is counted.
func TestRejectedUsageWindowFreesItsTime(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	h.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase()
	h.srv.RejectUsage("cus_1", "meter_event_customer_not_found")
	if _, err := h.b.ReportUsage(ctx, window("cus_1", base, 60, 120, 7)); err != nil {
		t.Fatal(err)
	}
	h.srv.AggregateNow()
	h.deliverAll()
	h.srv.RejectUsage("cus_1", "")
	later := window("cus_1", base, 90, 150, 5)
	if r, err := h.b.ReportUsage(ctx, later); err != nil || r.Outcome != billing.Created {
		t.Errorf("window over a rejected one = %+v, %v; want created", r, err)
	}
	if got := h.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)); got != 5 {
		t.Errorf("the meter counts %v, want 5", got)
	}
}

// RunUsage refuses an overlapping window as invalid, within one batch,
// across batches and across runs, and counts every other report once.
func TestRunUsageRefusesOverlappingWindows(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase()
	first := []billing.Usage{
		window("cus_1", base, 0, 60, 1),
		window("cus_1", base, 30, 90, 2), // overlaps the row before it, in its batch
		window("cus_2", base, 0, 60, 3),
		window("cus_3", base, 0, 60, 4),
		window("cus_2", base, 59, 60, 5), // in the next batch
	}
	sum, err := e.b.RunUsage(ctx, slicesSeq(first), &billing.RunOptions{BatchSize: 4})
	if err != nil || sum.Created != 3 || sum.Invalid != 2 {
		t.Fatalf("RunUsage = %+v, %v; want 3 sent and 2 invalid", sum.Progress, err)
	}
	for _, f := range sum.Failures {
		if !errors.Is(f, billing.ErrInvalid) || !strings.Contains(f.Error(), " to ") {
			t.Errorf("failure %v, want ErrInvalid naming the window claimed", f)
		}
	}
	second := []billing.Usage{window("cus_3", base, 45, 105, 6), window("cus_3", base, 60, 120, 7)}
	sum, err = e.biller().RunUsage(ctx, slicesSeq(second), nil)
	if err != nil || sum.Created != 1 || sum.Invalid != 1 {
		t.Fatalf("a second run = %+v, %v; want 1 sent and 1 invalid", sum.Progress, err)
	}
	for customer, want := range map[string]float64{"cus_1": 1, "cus_2": 3, "cus_3": 4 + 7} {
		if got := e.srv.MeterTotal("api_calls", customer, base, base.Add(3*time.Hour)); got != want {
			t.Errorf("%s: the meter counts %v, want %v", customer, got, want)
		}
	}
}

// Overlapping windows reported at once by sixteen replicas: one is sent,
// the others are refused.
func TestOverlappingUsageWindowsAtOnceSendOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase()
	const replicas = 16
	var (
		wg               sync.WaitGroup
		mu               sync.Mutex
		created, refused int
		start            = make(chan struct{})
	)
	for i := range replicas {
		b := e.biller()
		u := window("cus_1", base, i, 60+i, int64(i+1)) // every two overlap
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			r, err := b.ReportUsage(ctx, u)
			mu.Lock()
			defer mu.Unlock()
			switch {
			case err == nil && r.Outcome == billing.Created:
				created++
			case errors.Is(err, billing.ErrInvalid):
				refused++
			default:
				t.Errorf("window %s: %+v, %v; want created or ErrInvalid", claimedWindow(u), r, err)
			}
		}()
	}
	close(start)
	wg.Wait()
	if created != 1 || refused != replicas-1 {
		t.Errorf("%d created, %d refused; want 1 and %d", created, refused, replicas-1)
	}
	if n := e.srv.MeterEvents("api_calls", "cus_1"); n != 1 {
		t.Errorf("%d meter events, want 1", n)
	}
}

// usageReporterEnv carries a usage reporter's configuration to the test
// binary re-executed as that reporter (see TestMain).
const usageReporterEnv = "BILLONCE_USAGE_REPORTER"

type reporterConfig struct {
	DatabaseURL, StripeURL string
	Usage                  billing.Usage
}

// usageReporter is one reporting process: it prints "ready", waits for a
// line on standard input, reports its usage once and prints the outcome
// ("created", or the error's kind) and the error.
func usageReporter(raw string) int {
	var rc reporterConfig
	if err := json.Unmarshal([]byte(raw), &rc); err != nil {
		fmt.Fprintln(os.Stderr, "reporter config:", err)
		return 2
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, rc.DatabaseURL)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	b, err := billing.New(billing.Config{SecretKey: secretKey, StripeURL: rc.StripeURL, Claims: store, RateLimit: -1,
		HTTPClient: &http.Client{Transport: testTransport}})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	if _, err := pool.Exec(ctx, "SELECT 1"); err != nil { // connected before the start
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 2
	}
	r, err := b.ReportUsage(ctx, rc.Usage)
	switch {
	case err != nil:
		fmt.Println(billing.ErrorKind(err), err)
	default:
		fmt.Println(r.Outcome)
	}
	return 0
}

// Two processes report overlapping windows at the same moment: one is
// sent, the other is refused.
func TestOverlappingUsageWindowsFromTwoProcessesSendOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	base := overlapBase()
	url := e.pool.Config().ConnString()
	type proc struct {
		cmd   *exec.Cmd
		in    *os.File
		lines *bufio.Scanner
	}
	var procs []proc
	for i, u := range []billing.Usage{window("cus_1", base, 0, 60, 3), window("cus_1", base, 30, 90, 4)} {
		raw, err := json.Marshal(reporterConfig{DatabaseURL: url, StripeURL: e.srv.URL, Usage: u})
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), usageReporterEnv+"="+string(raw))
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		cmd.Stderr = os.Stderr
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		cmd.Stdin = r
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		r.Close()
		t.Cleanup(func() { w.Close(); cmd.Process.Kill(); cmd.Wait() })
		p := proc{cmd: cmd, in: w, lines: bufio.NewScanner(out)}
		if !p.lines.Scan() || p.lines.Text() != "ready" {
			t.Fatalf("reporter %d did not start: %q", i, p.lines.Text())
		}
		procs = append(procs, p)
	}
	for _, p := range procs { // both go at once
		if _, err := p.in.WriteString("go\n"); err != nil {
			t.Fatal(err)
		}
	}
	outcomes := map[string]int{}
	for i, p := range procs {
		if !p.lines.Scan() {
			t.Fatalf("reporter %d printed no outcome", i)
		}
		line := p.lines.Text()
		t.Logf("reporter %d: %s", i, line)
		outcomes[strings.Fields(line)[0]]++
		if err := p.cmd.Wait(); err != nil {
			t.Errorf("reporter %d: %v", i, err)
		}
	}
	if outcomes["created"] != 1 || outcomes["invalid"] != 1 {
		t.Errorf("outcomes %v; want one created and one refused", outcomes)
	}
	if n := e.srv.MeterEvents("api_calls", "cus_1"); n != 1 {
		t.Errorf("%d meter events, want 1", n)
	}
}
