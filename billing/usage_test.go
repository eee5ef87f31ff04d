package billing_test

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

const meterEvents = "/v1/billing/meter_events"

// hourAgo is the start of the last whole hour that is over.
func hourAgo() time.Time { return time.Now().UTC().Truncate(time.Hour).Add(-time.Hour) }

func usage(customer string, value int64) billing.Usage {
	start := hourAgo()
	return billing.Usage{Customer: customer, Meter: "api_calls", Kind: billing.Increments,
		Start: start, End: start.Add(time.Hour), Value: value}
}

// otherTable returns a Biller on the env's fake with a claim table of its
// own, in another database, and another API key: Stripe's idempotency
// keys are per API key, its meter event identifiers are not.
func (e *env) otherTable() *billing.Biller {
	e.tb.Helper()
	other := &env{tb: e.tb, srv: e.srv, pool: e.pool}
	other.store = newStore(e.tb, pgtest.Pool(e.tb))
	return other.biller(func(c *billing.Config) { c.SecretKey = "sk_test_other_0000000000000000000" })
}

// sends counts the meter events POSTed to the fake, answered or not.
func sends(srv *billingtest.Server) int {
	n := 0
	for _, e := range srv.Log() {
		if e.Method == "POST" && e.Path == meterEvents {
			n++
		}
	}
	return n
}

// requireCounted wants u counted exactly once in the meter's total at the
// fake, as one event.
func requireCounted(t *testing.T, srv *billingtest.Server, u billing.Usage) {
	t.Helper()
	if n := srv.MeterEvents(u.Meter, u.Customer); n != 1 {
		t.Errorf("%s: %d meter events at Stripe, want 1", u.Customer, n)
	}
	if got := srv.MeterTotal(u.Meter, u.Customer, u.Start, u.End); got != float64(u.Value) {
		t.Errorf("%s: meter total %v, want %d", u.Customer, got, u.Value)
	}
}

// Reported again and again, and from eight replicas at once, a window's
// usage is counted once. A reporter without a stable identifier counts it
// once per call.
func TestReportUsageOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 42)
	ctx := context.Background()
	r, err := e.b.ReportUsage(ctx, u)
	if err != nil || r.Outcome != billing.Created || r.Amount != 42 || r.StripeID != r.Key.String() {
		t.Fatalf("first report = %+v, %v; want created, value 42, the key as identifier", r, err)
	}
	var wg sync.WaitGroup
	for range 8 {
		b := e.biller()
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := b.ReportUsage(ctx, u)
			if err != nil || r.Outcome != billing.AlreadyBilled {
				t.Errorf("repeat = %+v, %v; want already billed", r, err)
			}
		}()
	}
	wg.Wait()
	requireCounted(t, e.srv, u)
	if n := sends(e.srv); n != 1 {
		t.Errorf("%d meter event requests, want 1: repeats must not reach Stripe", n)
	}
	// Another value for the same window is refused, not counted.
	u2 := u
	u2.Value = 43
	_, err = e.b.ReportUsage(ctx, u2)
	var m *claim.MismatchError
	if !errors.As(err, &m) {
		t.Errorf("another value for the window = %v, want a *claim.MismatchError", err)
	}
	requireCounted(t, e.srv, u)
}

// An event whose answer was lost is resumed with the same identifier.
// When Stripe has forgotten the idempotency key but not the identifier,
// it answers 400 "already exists": that is the event, delivered, and it
// is recorded once, neither retried forever nor sent with a new
// identifier.
func TestDuplicateIdentifierAfterLostAnswerIsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{KeyTTL: time.Hour, IdentifierWindow: 48 * time.Hour}, oneAttempt)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 7)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err := e.b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("report with a lost answer = %v, want ErrOutcomeUnknown", err)
	}
	e.srv.Advance(2 * time.Hour) // the fake forgets the key, keeps the identifier
	before := sends(e.srv)
	r, err := e.b.ReportUsage(ctx, u)
	if err != nil || r.Outcome != billing.Replayed {
		t.Fatalf("resumed report = %+v, %v; want replayed (Stripe has the event)", r, err)
	}
	if n := sends(e.srv) - before; n != 1 {
		t.Errorf("resume sent %d requests, want 1: the duplicate answer is final", n)
	}
	r, err = e.b.ReportUsage(ctx, u)
	if err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("third report = %+v, %v; want already billed", r, err)
	}
	requireCounted(t, e.srv, u)
}

// A duplicate-identifier answer to a claim that never sent its key means
// another table (or a restored backup) sent the event: it needs a person,
// is not retried, and counts nothing twice.
func TestDuplicateIdentifierOnANewClaimNeedsReconciliation(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 7)
	ctx := context.Background()
	if _, err := e.b.ReportUsage(ctx, u); err != nil {
		t.Fatal(err)
	}
	b := e.otherTable()
	before := sends(e.srv)
	_, err := b.ReportUsage(ctx, u)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Fatalf("report from a table that never sent it = %v, want ErrNeedsReconciliation", err)
	}
	if billing.StopsRun(err) {
		t.Errorf("a taken identifier stops a run: %v", err)
	}
	if n := sends(e.srv) - before; n != 1 {
		t.Errorf("%d requests, want 1: a duplicate identifier is never retried", n)
	}
	// Asked again (a job queue retries), the answer is the same: the
	// first call's claim is not taken for a report that went before.
	if _, err := b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("second report from that table = %v, want ErrNeedsReconciliation again", err)
	}
	requireCounted(t, e.srv, u)
}

// Past the key's deadline with an unknown outcome, the meter's summary
// decides: an event that is there is recorded without a send; one that is
// not is sent once.
func TestUsagePastTheWindowSettledBySummary(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		fault  billingtest.FaultKind
		sent   int // requests after the deadline
		result billing.Outcome
	}{
		{"event landed", billingtest.FaultCut, 0, billing.Reconciled},
		{"event lost", billingtest.FaultErrorBefore, 1, billing.Created},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			e := newEnv(t, oneAttempt)
			e.srv.CreateMeter("api_calls", "sum", "")
			u := usage("cus_1", 7)
			ctx := context.Background()
			e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: tc.fault})
			if _, err := e.b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
				t.Fatalf("first report = %v, want ErrOutcomeUnknown", err)
			}
			e.advance(25 * time.Hour)
			e.srv.AggregateNow()
			before := sends(e.srv)
			r, err := e.b.ReportUsage(ctx, u)
			if err != nil || r.Outcome != tc.result {
				t.Fatalf("report past the deadline = %+v, %v; want %v", r, err, tc.result)
			}
			if n := sends(e.srv) - before; n != tc.sent {
				t.Errorf("%d sends past the deadline, want %d", n, tc.sent)
			}
			requireCounted(t, e.srv, u)
		})
	}
}

// Pre-aggregated meters take the window's running total: each total once,
// as the next attempt of its window, the newest counting; an older total
// reported again sends nothing.
func TestWindowTotals(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("seats", "sum", "hour")
	ctx := context.Background()
	start := hourAgo()
	u := billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour)}
	for _, r := range []struct {
		value   int64
		attempt int
	}{{10, 1}, {10, 1}, {25, 2}, {25, 2}, {10, 1}} {
		u.Value, u.Attempt = r.value, r.attempt
		if _, err := e.b.ReportUsage(ctx, u); err != nil {
			t.Fatalf("total %d (attempt %d): %v", r.value, r.attempt, err)
		}
	}
	if n := e.srv.MeterEvents("seats", "cus_1"); n != 2 {
		t.Errorf("%d events, want 2 (one per distinct total)", n)
	}
	if got := e.srv.MeterTotal("seats", "cus_1", start, start.Add(time.Hour)); got != 25 {
		t.Errorf("window total %v, want 25", got)
	}
}

// The kind of a report must match its meter, and the report must be
// valid: each mistake is an ErrInvalid, and no meter event is sent.
func TestUsageRefusedBeforeSending(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	e.srv.CreateMeter("seats", "sum", "day")
	e.srv.CreateMeter("logins", "count", "")
	now := time.Now().UTC().Truncate(time.Minute)
	ok := usage("cus_1", 5)
	edit := func(f func(*billing.Usage)) billing.Usage { u := ok; f(&u); return u }
	for name, tc := range map[string]struct {
		u    billing.Usage
		want string
	}{
		"increments to a windowed meter": {edit(func(u *billing.Usage) { u.Meter = "seats" }), "running total"},
		"totals to a sum meter":          {edit(func(u *billing.Usage) { u.Kind = billing.WindowTotals }), "overcount"},
		"count meter":                    {edit(func(u *billing.Usage) { u.Meter = "logins" }), "sum meters only"},
		"no such meter":                  {edit(func(u *billing.Usage) { u.Meter = "nope" }), "no active Stripe meter"},
		"total for part of a day":        {billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: ok.Start, End: ok.End, Value: 3}, "exactly one day"},
		"no kind":                        {edit(func(u *billing.Usage) { u.Kind = 0 }), "say which kind"},
		"zero value":                     {edit(func(u *billing.Usage) { u.Value = 0 }), "positive quantity"},
		"negative value":                 {edit(func(u *billing.Usage) { u.Value = -3 }), "positive quantity"},
		"empty customer":                 {edit(func(u *billing.Usage) { u.Customer = "" }), "customer ID is empty"},
		"long meter":                     {edit(func(u *billing.Usage) { u.Meter = strings.Repeat("m", 101) }), "at most 100"},
		"end before start":               {edit(func(u *billing.Usage) { u.End = u.Start }), "End must be after Start"},
		"not whole minutes":              {edit(func(u *billing.Usage) { u.Start = u.Start.Add(time.Second) }), "whole minutes"},
		"older than Stripe takes":        {edit(func(u *billing.Usage) { u.Start = now.Add(-36 * 24 * time.Hour) }), "older than 35 days"},
		"in the future":                  {edit(func(u *billing.Usage) { u.End = now.Add(time.Hour) }), "in the future"},
		"no window":                      {edit(func(u *billing.Usage) { u.Start = time.Time{} }), "must be set"},
	} {
		_, err := e.b.ReportUsage(context.Background(), tc.u)
		if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want ErrInvalid saying %q", name, err, tc.want)
		}
	}
	if n := sends(e.srv); n != 0 {
		t.Errorf("%d meter events sent for invalid reports", n)
	}
	if n := e.claimRows(); n != 0 {
		t.Errorf("%d claims written for invalid reports", n)
	}
}

// RunUsage reports every window of every customer once, through faults,
// with two runs at once.
func TestRunUsageOnceThroughFaults(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	e.srv.SetScript(faults(7, map[billingtest.FaultKind]float64{
		billingtest.FaultDrop: 0.05, billingtest.FaultErrorAfter: 0.05, billingtest.FaultErrorBefore: 0.05, billingtest.FaultRateLimit: 0.05,
	}))
	var reports []billing.Usage
	for i := range 60 {
		for w := range 3 {
			u := usage(fmt.Sprintf("cus_%03d", i), int64(i+1))
			u.Start, u.End = u.Start.Add(-time.Duration(w)*time.Hour), u.End.Add(-time.Duration(w)*time.Hour)
			reports = append(reports, u)
		}
	}
	ctx := context.Background()
	var wg sync.WaitGroup
	for range 2 {
		b := e.biller()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := b.RunUsage(ctx, slicesSeq(reports), &billing.RunOptions{BatchSize: 16}); err != nil {
				t.Errorf("RunUsage: %v", err)
			}
		}()
	}
	wg.Wait()
	e.srv.SetScript(nil)
	// Stripe stores a 500 it answered after executing, and replays it for
	// the key: those reports stay pending, unknown, for the whole window.
	sum, err := e.b.RunUsage(ctx, slicesSeq(reports), nil)
	if err != nil || sum.Done != len(reports) || sum.Created != 0 || sum.Pending == 0 || sum.AlreadyBilled+sum.Pending != len(reports) {
		t.Fatalf("RunUsage after the faults = %+v, %v; want every report already billed or pending, none sent anew", sum, err)
	}
	// A day later, the meter's summaries settle them: nothing is sent.
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	before := sends(e.srv)
	sum, err = e.b.RunUsage(ctx, slicesSeq(reports), nil)
	if err != nil || !sum.Complete() || sum.Done != len(reports) {
		t.Fatalf("RunUsage a day later = %+v, %v; want all %d complete", sum, err, len(reports))
	}
	if n := sends(e.srv) - before; n != 0 {
		t.Errorf("%d events sent a day later, want 0: the summaries show each delivered", n)
	}
	for _, u := range reports {
		if n := e.srv.MeterEvents(u.Meter, u.Customer); n != 3 {
			t.Fatalf("%s: %d events, want 3 (one per window)", u.Customer, n)
		}
		if got := e.srv.MeterTotal(u.Meter, u.Customer, u.Start, u.End); got != float64(u.Value) {
			t.Errorf("%s %s: total %v, want %d", u.Customer, u.Start.Format(time.RFC3339), got, u.Value)
		}
	}
}

func slicesSeq[T any](s []T) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for _, v := range s {
			if !yield(v, nil) {
				return
			}
		}
	}
}

// Reconcile resumes a usage report a runner left pending, with its own
// key and identifier, and never treats it as a charge.
func TestReconcileResumesUsage(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 11)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultCut})
	if _, err := e.b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("report with a lost answer = %v, want ErrOutcomeUnknown", err)
	}
	sum, err := e.biller().Reconcile(ctx, nil)
	if err != nil || sum.Done != 1 || sum.Created != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the report settled by Stripe's replay", sum, err)
	}
	requireCounted(t, e.srv, u)
	if n := e.srv.Stats().Paid; n != 0 {
		t.Errorf("%d payments: a usage claim was resumed as a charge", n)
	}
	if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.AlreadyBilled {
		t.Errorf("report after Reconcile = %+v, %v; want already billed", r, err)
	}
}

// A window total whose send failed is never sent after a larger total of
// the same window was delivered: Stripe keeps the newest event of the
// window, so the stale total would replace the larger one and bill less.
func TestStaleWindowTotalNeverReplacesANewerOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.srv.CreateMeter("seats", "sum", "hour")
	ctx := context.Background()
	start := hourAgo()
	u := billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour), Value: 10}
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.ReportUsage(ctx, u); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("total 10 with a lost send = %v, want ErrOutcomeUnknown", err)
	}
	// A new total of the window is the next attempt, and waits for the
	// total before it to settle; the same attempt with another total is
	// refused.
	next := u
	next.Value, next.Attempt = 25, 2
	if _, err := e.b.ReportUsage(ctx, next); !errors.Is(err, billing.ErrInProgress) {
		t.Fatalf("total 25 while 10 is unsettled = %v, want ErrInProgress", err)
	}
	same := u
	same.Value = 25
	var m *claim.MismatchError
	if _, err := e.b.ReportUsage(ctx, same); !errors.As(err, &m) {
		t.Fatalf("total 25 as attempt 1 = %v, want a *claim.MismatchError", err)
	}
	// The cron's Reconcile resumes every pending claim, the stale total's too.
	if _, err := e.biller().Reconcile(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if r, err := e.b.ReportUsage(ctx, next); err != nil || r.Outcome != billing.Created {
		t.Fatalf("total 25 once 10 settled = %+v, %v; want created", r, err)
	}
	_, _ = e.b.ReportUsage(ctx, u) // a late replica still holding the old total
	if got := e.srv.MeterTotal("seats", "cus_1", start, start.Add(time.Hour)); got != 25 {
		t.Errorf("window total %v at Stripe, want 25: a stale total replaced the newer one", got)
	}
}

// A claim table restored from a backup older than a report has no claim
// for it. Within a day Stripe still knows the identifier and refuses the
// resend; a day later it does not, and only the meter's summary can tell
// that the window's usage is counted already: a new claim of a window
// that ended that long ago reads it before sending.
func TestRestoredClaimTableDoesNotCountAnOldWindowTwice(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 7)
	u.Start, u.End = u.Start.Add(-48*time.Hour), u.End.Add(-48*time.Hour) // a backfill
	ctx := context.Background()
	if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
		t.Fatalf("first report = %+v, %v; want created", r, err)
	}
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	e.exec("DELETE FROM billonce_claims") // the backup predates the report
	before := sends(e.srv)
	r, err := e.b.ReportUsage(ctx, u)
	if err != nil || r.Outcome != billing.Reconciled {
		t.Errorf("report of a counted window after a restore = %+v, %v; want reconciled from the meter's summary", r, err)
	}
	if n := sends(e.srv) - before; n != 0 {
		t.Errorf("%d meter events sent after the restore, want 0", n)
	}
	requireCounted(t, e.srv, u)
}

// Windows of one customer and meter must not overlap, and a report whose
// window overlaps another's is refused or counted: it is never recorded
// as delivered on the strength of the other report's usage in the
// meter's summary.
func TestOverlappingWindowIsNeverProvedByAnotherReport(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	hour := usage("cus_1", 7)
	half := hour
	half.End = hour.Start.Add(30 * time.Minute)
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.ReportUsage(ctx, hour); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("hour with a lost send = %v, want ErrOutcomeUnknown", err)
	}
	_, errHalf := e.b.ReportUsage(ctx, half)
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	r, err := e.b.ReportUsage(ctx, hour)
	delivered := int64(0)
	if errHalf == nil {
		delivered += half.Value
	}
	if err == nil {
		delivered += hour.Value
	}
	if got := e.srv.MeterTotal("api_calls", "cus_1", hour.Start, hour.End); got != float64(delivered) {
		t.Errorf("meter total %v, but reports recorded as delivered add up to %d (hour: %+v, %v; half hour: %v)", got, delivered, r, err, errHalf)
	}
}

// An identifier taken by an event this claim never sent needs a person,
// and keeps needing one: asked again, as a cron does, the report is not
// recorded as delivered on the strength of the other event, which may
// count another value.
func TestTakenIdentifierIsNeverRecordedAsDelivered(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	u := usage("cus_1", 42)
	ctx := context.Background()
	if _, err := e.b.ReportUsage(ctx, u); err != nil {
		t.Fatal(err)
	}
	b := e.otherTable() // whose records say 50
	u.Value = 50
	for i, do := range []func() error{
		func() error { _, err := b.ReportUsage(ctx, u); return err },
		func() error { _, err := b.ReportUsage(ctx, u); return err },
		func() error { _, err := b.Reconcile(ctx, nil); return err },
	} {
		err := do()
		if i < 2 && !errors.Is(err, billing.ErrNeedsReconciliation) {
			t.Errorf("call %d = %v, want ErrNeedsReconciliation", i+1, err)
		}
	}
	r, err := b.ReportUsage(ctx, u)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("report after Reconcile = %+v, %v; want ErrNeedsReconciliation: Stripe counts 42, not this report's 50", r, err)
	}
	if got := e.srv.MeterTotal("api_calls", "cus_1", u.Start, u.End); got != 42 {
		t.Errorf("meter total %v, want 42", got)
	}
}

// Stripe's summaries count in float64, exact up to 2^53: a report of
// 2^53 is sent and counted as reported; one of 2^53 + 1, which Stripe
// would count as 2^53, is refused before anything is claimed or sent.
func TestUsageValueBeyondExactCountingIsRefused(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	exact := usage("cus_exact", 1<<53)
	if r, err := e.b.ReportUsage(ctx, exact); err != nil || r.Outcome != billing.Created {
		t.Fatalf("report of 2^53 = %+v, %v; want created", r, err)
	}
	requireCounted(t, e.srv, exact)
	over := usage("cus_over", 1<<53+1)
	_, err := e.b.ReportUsage(ctx, over)
	if !errors.Is(err, billing.ErrInvalid) || !strings.Contains(err.Error(), "9007199254740993") {
		t.Errorf("report of 2^53 + 1 = %v, want ErrInvalid naming the value", err)
	}
	if err := over.Validate(); !errors.Is(err, billing.ErrInvalid) {
		t.Errorf("Validate of 2^53 + 1 = %v, want ErrInvalid", err)
	}
	if n := e.srv.MeterEvents(over.Meter, over.Customer); n != 0 {
		t.Errorf("%d meter events for 2^53 + 1, want 0 (Stripe counts %v)", n, e.srv.MeterTotal(over.Meter, over.Customer, over.Start, over.End))
	}
	if n := e.claimRows(); n != 1 {
		t.Errorf("%d claims, want 1: the refused report claims nothing", n)
	}
}

// A pending report that Stripe refuses as older than 35 days can never be
// delivered under its key: its claim fails with a reason a person can act
// on, and Reconcile, which goes oldest first, goes on to settle the
// reports behind it instead of stopping on it every time.
func TestUsageTooOldForStripeFailsItsClaimAndReconcileGoesOn(t *testing.T) {
	t.Parallel()
	e := newEnv(t, oneAttempt)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	old := usage("cus_old", 5)
	old.Start, old.End = old.Start.Add(-33*24*time.Hour), old.End.Add(-33*24*time.Hour)
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.ReportUsage(ctx, old); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("old window with a lost send = %v, want ErrOutcomeUnknown", err)
	}
	e.advance(3 * 24 * time.Hour) // its window now starts 36 days ago for Stripe
	recent := usage("cus_recent", 9)
	e.srv.FailNext(billingtest.Match{Path: meterEvents}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	if _, err := e.b.ReportUsage(ctx, recent); !errors.Is(err, billing.ErrOutcomeUnknown) {
		t.Fatalf("recent window with a lost send = %v, want ErrOutcomeUnknown", err)
	}
	for i := range 2 { // a cron's Reconcile, run after run
		sum, err := e.biller().Reconcile(ctx, nil)
		if err != nil || billing.StopsRun(err) {
			t.Fatalf("Reconcile %d = %+v, %v; want it to go on past the report Stripe calls too old", i+1, sum.Progress, err)
		}
	}
	if n := e.srv.MeterEvents(old.Meter, old.Customer); n != 0 {
		t.Errorf("%d meter events for the old window, want 0: Stripe refuses it", n)
	}
	requireCounted(t, e.srv, recent)
	_, err := e.b.ReportUsage(ctx, old)
	var ce *billing.ChargeError
	if !errors.As(err, &ce) || !errors.Is(err, billing.ErrDeclined) || billing.StopsRun(err) {
		t.Fatalf("old window after Reconcile = %v, want ErrDeclined from its failed claim", err)
	}
	c, gerr := e.store.Get(ctx, ce.Key)
	if gerr != nil || c.State != claim.StateFailed || !strings.Contains(c.LastError, "timestamp_too_far_in_past") || !strings.Contains(c.LastError, "no longer") {
		t.Errorf("old window's claim = %s %q, %v; want failed, saying Stripe's code and what can be done", c.State, c.LastError, gerr)
	}
}

// A claim table restored from a backup older than a window's totals 10
// and 25 has no claim of either. A day later Stripe no longer knows their
// identifiers, and keeps the newest event of the window: sending the
// total 10 again would make the window count 10. Past the identifier
// window a total is sent only when the meter's summary shows nothing;
// showing this very total settles the claim, and anything else needs a
// person.
func TestRestoredClaimTableNeverReplacesANewerWindowTotal(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("seats", "sum", "hour")
	ctx := context.Background()
	start := hourAgo().Add(-48 * time.Hour) // a backfill
	total := func(customer string, value int64, attempt int) billing.Usage {
		return billing.Usage{Customer: customer, Meter: "seats", Kind: billing.WindowTotals,
			Start: start, End: start.Add(time.Hour), Value: value, Attempt: attempt}
	}
	for _, u := range []billing.Usage{total("cus_revised", 10, 1), total("cus_revised", 25, 2), total("cus_once", 10, 1)} {
		if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
			t.Fatalf("%s total %d (attempt %d) = %+v, %v; want created", u.Customer, u.Value, u.Attempt, r, err)
		}
	}
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	e.exec("DELETE FROM billonce_claims") // the backup predates every total
	before := sends(e.srv)
	if _, err := e.b.ReportUsage(ctx, total("cus_revised", 10, 1)); !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("total 10 again after the restore = %v, want ErrNeedsReconciliation: the window counts 25", err)
	}
	if r, err := e.b.ReportUsage(ctx, total("cus_once", 10, 1)); err != nil || r.Outcome != billing.Reconciled {
		t.Errorf("the one total again after the restore = %+v, %v; want reconciled from the meter's summary", r, err)
	}
	if n := sends(e.srv) - before; n != 0 {
		t.Errorf("%d meter events sent after the restore, want 0", n)
	}
	for customer, want := range map[string]float64{"cus_revised": 25, "cus_once": 10} {
		if got := e.srv.MeterTotal("seats", customer, start, start.Add(time.Hour)); got != want {
			t.Errorf("%s: window total %v at Stripe, want %v: an older total replaced the newer one", customer, got, want)
		}
	}
}

// A window's new total sent soon after the window ended goes out at
// once: no event of the window can be older than its end, less the 5
// minutes Stripe takes ahead, so Stripe still knows every identifier of
// the window until WindowMargin after that. A meter's day window is
// revised that way after midnight; here an hour window and a
// WindowMargin an hour or so long stand for it, whatever the minute the
// test runs at.
func TestWindowTotalRevisedSoonAfterItsWindowIsSent(t *testing.T) {
	t.Parallel()
	minutes := time.Since(time.Now().UTC().Truncate(time.Hour))
	margin := max(time.Hour, minutes+10*time.Minute) // past the window's end, not past its start
	e := newEnv(t, func(c *billing.Config) { c.WindowMargin = margin })
	e.srv.CreateMeter("seats", "sum", "hour")
	ctx := context.Background()
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	u := billing.Usage{Customer: "cus_1", Meter: "seats", Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour), Value: 10}
	if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
		t.Fatalf("total 10 = %+v, %v; want created", r, err)
	}
	e.srv.AggregateNow() // the meter's summary shows 10
	u.Value, u.Attempt = 25, 2
	if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
		t.Errorf("total 25 = %+v, %v; want created: every identifier of the window is still known to Stripe", r, err)
	}
	if got := e.srv.MeterTotal("seats", "cus_1", start, start.Add(time.Hour)); got != 25 {
		t.Errorf("window total %v at Stripe, want 25", got)
	}
}
