package main

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

// lastHour is the last whole UTC hour, a window Stripe takes.
func lastHour() (start, end time.Time) {
	end = time.Now().UTC().Truncate(time.Hour)
	return end.Add(-time.Hour), end
}

// usageRow is one row of a usage file.
func usageRow(customer, meter, kind string, start, end time.Time, value int) string {
	return fmt.Sprintf("%s,%s,%s,%s,%s,%d\n", customer, meter, kind, start.Format(time.RFC3339), end.Format(time.RFC3339), value)
}

func TestUsageReportsEveryRowOnceAndAgainNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.fake.CreateMeter("api_calls", "sum", "")
	e.fake.CreateMeter("seats", "sum", "hour")
	start, end := lastHour()
	rows := "customer,meter,kind,start,end,value\n" +
		usageRow("cus_a", "api_calls", "increments", start, end, 120) +
		usageRow("cus_b", "api_calls", "increments", start, end, 7) +
		usageRow("cus_a", "seats", "totals", start, end, 3)
	file := customersFile(t, rows)
	r := e.billonce("", "usage", "-file", file).want(t, exitOK)
	if !strings.Contains(r.stdout, "usage: 3 reports") || !strings.Contains(r.stdout, "sent                3") {
		t.Errorf("summary:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	for _, c := range []struct {
		customer, meter string
		value           float64
	}{{"cus_a", "api_calls", 120}, {"cus_b", "api_calls", 7}, {"cus_a", "seats", 3}} {
		if n := e.fake.MeterEvents(c.meter, c.customer); n != 1 {
			t.Errorf("%s on %s: %d meter events, want 1", c.customer, c.meter, n)
		}
		if got := e.fake.MeterTotal(c.meter, c.customer, start, end); got != c.value {
			t.Errorf("%s on %s: the meter counts %v, want %v", c.customer, c.meter, got, c.value)
		}
	}
	r = e.billonce("", "usage", "-file", file, "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.Status != "complete" || s.AlreadyBilled != 3 || s.Created != 0 {
		t.Errorf("second run: %+v, want complete with 3 already sent", s)
	}
	if n := e.fake.MeterEvents("api_calls", "cus_a"); n != 1 {
		t.Errorf("after the second run: %d meter events, want 1", n)
	}

	// A usage claim reads as one: a value, no currency, and its own period.
	period := "usage api_calls " + start.Format(time.RFC3339) + " increment"
	r = e.billonce("", "inspect", "-customer", "cus_a", "-period", period).want(t, exitOK)
	if !strings.Contains(r.stdout, "state succeeded, value 120\n") || !strings.Contains(r.stdout, "key sent to meter_events") {
		t.Errorf("inspect:\n%s", r.stdout)
	}
	r = e.billonce("", "export", "-period", period, "-format", "json").want(t, exitOK)
	if rows := decode[[]exportRow](t, r.stdout); len(rows) != 2 || rows[0].Amount+rows[1].Amount != 127 || rows[0].Currency != "" || rows[0].Endpoint != "meter_events" {
		t.Errorf("export %+v", rows)
	}
	r = e.billonce("", "status", "-period", period).want(t, exitOK)
	if !strings.Contains(r.stdout, "succeeded       2") {
		t.Errorf("status:\n%s", r.stdout)
	}
	key := e.keyOf("cus_a", period, 1)
	r = e.billonce("", "resolve", "-key", key, "-payment", "none").want(t, exitUsage)
	if !strings.Contains(r.stderr, "not pending") {
		t.Errorf("resolve: %s", r.stderr)
	}
}

func TestUsageWrongKindOfMeterIsInvalidAndSendsNothingForIt(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.fake.CreateMeter("api_calls", "sum", "")
	start, end := lastHour()
	rows := usageRow("cus_a", "api_calls", "increments", start, end, 5) + usageRow("cus_b", "api_calls", "totals", start, end, 9)
	r := e.billonce(rows, "usage", "-json").want(t, exitIncomplete)
	s := decode[summaryJSON](t, r.stdout)
	if s.Created != 1 || s.Invalid != 1 || len(s.Failures) != 1 || s.Failures[0].Customer != "cus_b" || s.Failures[0].Kind != "invalid" ||
		!strings.Contains(s.Failures[0].Message, "overcount") {
		t.Errorf("summary %+v", s)
	}
	if a, b := e.fake.MeterEvents("api_calls", "cus_a"), e.fake.MeterEvents("api_calls", "cus_b"); a != 1 || b != 0 {
		t.Errorf("meter events: cus_a %d, cus_b %d; want 1 and 0", a, b)
	}
}

func TestUsageBadRowSendsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	start, end := lastHour()
	good := usageRow("cus_a", "api_calls", "increments", start, end, 5)
	for _, c := range []struct{ in, want string }{
		{good + "cus_b,api_calls,sum," + start.Format(time.RFC3339) + "," + end.Format(time.RFC3339) + ",5\n", "standard input:2: kind \"sum\""},
		{good + "cus_b,api_calls,increments,yesterday," + end.Format(time.RFC3339) + ",5\n", "standard input:2: start \"yesterday\""},
		{good + usageRow("cus_b", "api_calls", "increments", start, end, 0), "standard input:2: customer cus_b: Usage.Value 0"},
		{good + usageRow("cus_b", "api_calls", "increments", start.Add(-40*24*time.Hour), end, 1), "more than 34 days ago"},
		{good + usageRow("cus_b", "api_calls", "increments", start, end.Add(2*time.Hour), 1), "in the future"},
		{good + good, "standard input:2: customer cus_a, meter api_calls, " + start.Format(time.RFC3339) + " to " + end.Format(time.RFC3339) + " is reported again (first on line 1)"},
		{"cus_a,api_calls,increments\n", "standard input:1: 3 columns"},
	} {
		r := e.billonce(c.in, "usage").want(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) || !strings.Contains(r.stderr, "nothing was sent") {
			t.Errorf("input %q: stderr %q lacks %q", c.in, r.stderr, c.want)
		}
	}
	if n := e.fake.Stats().Requests; n != 0 {
		t.Errorf("%d requests to Stripe, want none", n)
	}
}

// Rows whose windows overlap for one customer and meter, in one file or
// in the files of two runs, would count the overlap twice: the row after
// the first is refused as invalid, naming the window claimed, the run is
// incomplete, and the meter counts each stretch of time once.
func TestUsageOverlappingWindowsAreInvalid(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.fake.CreateMeter("api_calls", "sum", "")
	start, end := lastHour()
	start, end = start.Add(-2*time.Hour), end.Add(-2*time.Hour)
	half := 30 * time.Minute
	claimed := start.Format(time.RFC3339) + " to " + end.Format(time.RFC3339)
	rows := usageRow("cus_a", "api_calls", "increments", start, end, 5) +
		usageRow("cus_a", "api_calls", "increments", start.Add(half), end.Add(half), 6) +
		usageRow("cus_a", "api_calls", "increments", end, end.Add(time.Hour), 7) // meets the first: counted
	r := e.billonce(rows, "usage", "-json").want(t, exitIncomplete)
	s := decode[summaryJSON](t, r.stdout)
	if s.Created != 2 || s.Invalid != 1 || len(s.Failures) != 1 || s.Failures[0].Kind != "invalid" || !strings.Contains(s.Failures[0].Message, claimed) {
		t.Errorf("summary %+v; want 2 sent and the overlapping row invalid, naming %s", s, claimed)
	}
	next := usageRow("cus_a", "api_calls", "increments", start.Add(-half), start.Add(half), 8)
	r = e.billonce(next, "usage").want(t, exitIncomplete)
	if !strings.Contains(r.stdout, claimed) {
		t.Errorf("a second file's overlapping row:\n%s\nwant it refused, naming %s", r.stdout, claimed)
	}
	if n := e.fake.MeterEvents("api_calls", "cus_a"); n != 2 {
		t.Errorf("%d meter events, want 2", n)
	}
	if got := e.fake.MeterTotal("api_calls", "cus_a", start.Add(-time.Hour), end.Add(time.Hour)); got != 5+7 {
		t.Errorf("the meter counts %v, want %d", got, 5+7)
	}
}
