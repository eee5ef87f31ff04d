package main

import (
	"context"
	"fmt"
	"io"
	"iter"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/lock"
)

// demoMeter is the event name of the meter the demo creates on its fake
// Stripe: it sums every event (no event_time_window), so each report is
// an increment.
const demoMeter = "demo_api_calls"

// demoCalls is how many API calls demo customer i made in the window.
func demoCalls(i int) int64 { return int64(i*37%500 + 1) }

// usageWindow is the last whole UTC hour before now: a window that is
// over, as Stripe wants.
func usageWindow(now time.Time) (start, end time.Time) {
	end = now.UTC().Truncate(time.Hour)
	return end.Add(-time.Hour), end
}

// demoUsage yields one report per demo customer: its calls in the window.
func demoUsage(n int, start, end time.Time) iter.Seq2[billing.Usage, error] {
	return func(yield func(billing.Usage, error) bool) {
		for i := 1; i <= n; i++ {
			u := billing.Usage{Customer: demoID(i, n), Meter: demoMeter, Kind: billing.Increments, Start: start, End: end, Value: demoCalls(i)}
			if !yield(u, nil) {
				return
			}
		}
	}
}

// usageStep is the demo's usage: reported, reported again, and counted
// at the fake.
type usageStep struct {
	start, end    time.Time
	first, second *billing.Summary
	// secondRequests is how many requests the second report sent.
	secondRequests int64
	meter          *meterCheck
}

// reportUsage creates the demo meter on the fake, reports every demo
// customer's usage of the last whole hour with RunUsage, then the same
// again (which sends nothing), and counts the meter's events. Its error
// is the one that stopped a report run.
func reportUsage(ctx context.Context, o *options, b *billing.Biller, fake *billingtest.Server, guard *lock.Advisory, stderr io.Writer) (*usageStep, error) {
	fake.CreateMeter(demoMeter, "sum", "")
	st := &usageStep{}
	st.start, st.end = usageWindow(time.Now())
	runOnce := func(label string) (*billing.Summary, error) {
		ro := &billing.RunOptions{Concurrency: o.concurrency, Total: o.customers, Progress: newProgress(stderr, label, "events").update}
		if o.useLock {
			ro.Lock = guard
		}
		s, err := b.RunUsage(ctx, demoUsage(o.customers, st.start, st.end), ro)
		return &s, err
	}
	var err error
	if st.first, err = runOnce("usage  "); err != nil {
		return st, err
	}
	reqs := fake.Stats().Requests
	if st.second, err = runOnce("again  "); err != nil {
		return st, err
	}
	st.secondRequests = fake.Stats().Requests - reqs
	st.meter = checkMeter(fake, o.customers, st.start, st.end)
	return st, nil
}

// meterCheck is what the fake Stripe's meter counts for the demo
// customers in the window.
type meterCheck struct {
	Customers    int  `json:"customers"`
	Once         int  `json:"counted_once"`
	MoreThanOnce int  `json:"counted_more_than_once"`
	NotCounted   int  `json:"not_counted"`
	WrongValue   int  `json:"wrong_value"`
	OK           bool `json:"ok"`
}

// checkMeter counts, for each demo customer, the meter events at the fake
// and the meter's total for the window: one event, of the customer's
// calls.
func checkMeter(fake *billingtest.Server, n int, start, end time.Time) *meterCheck {
	m := &meterCheck{Customers: n}
	for i := 1; i <= n; i++ {
		id := demoID(i, n)
		switch events := fake.MeterEvents(demoMeter, id); {
		case events == 0:
			m.NotCounted++
		case events > 1:
			m.MoreThanOnce++
		case fake.MeterTotal(demoMeter, id, start, end) != float64(demoCalls(i)):
			m.WrongValue++
		default:
			m.Once++
		}
	}
	m.OK = m.Once == n
	return m
}

// print writes the usage step for people.
func (u *usageStep) print(w io.Writer) {
	if s := u.first; s != nil {
		fmt.Fprintf(w, "usage: %d reports on meter %s for %s to %s in %s\n  sent %d, already sent %d, rejected %d, pending %d, invalid %d\n",
			s.Done, demoMeter, u.start.Format(time.RFC3339), u.end.Format(time.RFC3339), s.Elapsed.Round(10*time.Millisecond),
			s.Created, s.AlreadyBilled, s.Declined, s.Pending, s.Invalid)
	}
	if s := u.second; s != nil {
		fmt.Fprintf(w, "same usage again: sent %d, already sent %d, pending %d in %s; %d requests to Stripe\n",
			s.Created, s.AlreadyBilled, s.Pending, s.Elapsed.Round(10*time.Millisecond), u.secondRequests)
	}
	if m := u.meter; m != nil {
		verdict := "OK: no window counted twice"
		if !m.OK {
			verdict = "WRONG"
		}
		fmt.Fprintf(w, "meter check at the fake Stripe: %d customers: %d counted once, %d more than once, %d not counted, %d with a wrong total: %s\n",
			m.Customers, m.Once, m.MoreThanOnce, m.NotCounted, m.WrongValue, verdict)
	}
	if s := u.second; s != nil && len(s.Failures) > 0 {
		fmt.Fprintln(w, "not reported:")
		for _, err := range s.Failures[:min(len(s.Failures), maxListed)] {
			fmt.Fprintf(w, "  %v\n", err)
		}
	}
}
