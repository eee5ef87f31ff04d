package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
)

// cmdUsage reports a file of usage to Stripe's meters, each row exactly
// once (billing.Biller.RunUsage), under the usage lock of the scope: one
// reporter at a time. Run it again after any stop: reports already
// delivered are skipped, pending ones resume with their keys.
func cmdUsage(ctx context.Context, a *app, args []string) (err error) {
	f := newFlags(a, "usage", "usage -file FILE [-account acct_…] [-json] [flags]")
	var b biller
	b.register(f)
	file := f.String("file", "-", "CSV of customer ID, meter event name, kind (increments or totals), window start and end (RFC 3339, whole minutes), value; - reads standard input")
	concurrency := f.Int("concurrency", billing.DefaultConcurrency, "reports sent at once")
	asJSON := f.Bool("json", false, "print one JSON object on standard output; progress and warnings stay on standard error")
	account := accountFlag(f, "report every row to the meters of this connected account (acct_…), with the Stripe-Account header; default the platform's own")
	if err := f.parse(args); err != nil {
		return err
	}
	started := false // see cmdRun
	defer func() {
		if !started {
			err = reportEarly(a, "usage", "", err, *asJSON)
		}
	}()
	if f.set("api") {
		return usageError("-api does not apply to usage: meter events have one endpoint")
	}
	if *concurrency <= 0 {
		return usageError("-concurrency %d: want at least 1", *concurrency)
	}
	if err := (billing.RunOptions{Concurrency: *concurrency}).Validate(); err != nil {
		return usageError("-concurrency: %s", reason(err))
	}
	if err := checkAccount(f, *account); err != nil {
		return err
	}
	in, name, done, err := openInput(a, "file", *file, "usage")
	if err != nil {
		return err
	}
	defer done()
	reports, err := readUsage(in, name)
	if err != nil {
		return usageError("%v; fix the input and run again; nothing was sent", err)
	}
	for i := range reports {
		reports[i].Account = *account
	}

	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	fmt.Fprintf(a.stderr, "reporting %d usage rows, scope %q\n", len(reports), b.scope)
	started = true
	sum, err := s.biller.RunUsage(ctx, func(yield func(billing.Usage, error) bool) {
		for _, u := range reports {
			if !yield(u, nil) {
				return
			}
		}
	}, &billing.RunOptions{
		Concurrency: *concurrency,
		Total:       len(reports),
		Progress:    newProgress(a.stderr, "reporting").update,
		Lock:        s.guard,
	})
	return report(a, "usage", "", sum, err, *asJSON)
}

// usageKinds are the kind column's words.
var usageKinds = map[string]billing.UsageKind{"increments": billing.Increments, "totals": billing.WindowTotals}

// readUsage reads the whole usage file: rows of customer ID, meter event
// name, kind, window start, window end and value. A first row whose first
// column is "customer" is a header; lines starting with # are comments.
// Every row is checked as billing checks it (but against its meter, which
// needs Stripe), and a window reported twice is refused, before anything
// is sent.
func readUsage(r io.Reader, name string) ([]billing.Usage, error) {
	var out []billing.Usage
	seen := map[[5]string]int{}
	err := readRows(r, name, func(line int, rec []string, first bool) error {
		if first && strings.EqualFold(rec[0], "customer") {
			return nil
		}
		u, msg := parseUsage(rec)
		if msg != "" {
			return errors.New(msg)
		}
		id := [5]string{u.Customer, u.Meter, rec[2], u.Start.UTC().Format(time.RFC3339), u.End.UTC().Format(time.RFC3339)}
		if prev, dup := seen[id]; dup {
			return fmt.Errorf("customer %s, meter %s, %s to %s is reported again (first on line %d): a window is reported once; merge the rows",
				u.Customer, u.Meter, id[3], id[4], prev)
		}
		seen[id] = line
		out = append(out, u)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no usage; want rows of customer ID, meter, increments or totals, start, end, value", name)
	}
	return out, nil
}

// parseUsage turns one record into a report, or says what is wrong with
// it.
func parseUsage(rec []string) (billing.Usage, string) {
	if len(rec) != 6 {
		return billing.Usage{}, fmt.Sprintf("%d columns; want customer ID, meter event name, kind (increments or totals), start, end (RFC 3339) and value", len(rec))
	}
	u := billing.Usage{Customer: rec[0], Meter: rec[1]}
	var ok bool
	if u.Kind, ok = usageKinds[rec[2]]; !ok {
		return u, fmt.Sprintf("kind %q: use increments (a meter that sums its events) or totals (a meter with an event_time_window, sent the window's running total)", rec[2])
	}
	for i, t := range []*time.Time{&u.Start, &u.End} {
		var err error
		if *t, err = time.Parse(time.RFC3339, rec[3+i]); err != nil {
			return u, fmt.Sprintf("%s %q is not an RFC 3339 time such as 2026-11-30T10:00:00Z", [2]string{"start", "end"}[i], rec[3+i])
		}
	}
	var err error
	if u.Value, err = strconv.ParseInt(rec[5], 10, 64); err != nil {
		return u, fmt.Sprintf("value %q is not a whole number", rec[5])
	}
	if err := u.Validate(); err != nil {
		return u, "customer " + u.Customer + ": " + reason(err)
	}
	return u, ""
}
