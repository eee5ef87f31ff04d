package riverbilling

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/billonce/billonce/billing"
)

const kindUsage = "billonce_usage"

// UsageArgs asks for one usage report to be sent to its Stripe meter, once
// (see [billing.Biller.ReportUsage]). Like [ChargeArgs] it carries identity
// only: the meter event's identifier and idempotency key are derived from
// the report by the Biller, the same on every run.
//
// In River's job table the report is a JSON object with the window in UTC
// (RFC 3339) and the kind by name ("increments" or "window_totals"), so
// that one report is one set of arguments whatever the time zone of the
// times it was made with. Attempt 0 and 1 are both written as the first
// report. Inserting a report without a known Kind fails.
//
// Jobs are unique by these arguments in the same states as charge jobs:
// while a report's job is kept, the same report inserted again is skipped
// as a duplicate, a rejected one included. Once River has cleaned jobs
// away, a report inserted again costs a claim lookup, not a second event.
type UsageArgs struct {
	Usage billing.Usage
}

// Kind is "billonce_usage".
func (UsageArgs) Kind() string { return kindUsage }

// InsertOpts puts usage jobs in DefaultQueue, with DefaultMaxAttempts,
// unique by their arguments.
func (UsageArgs) InsertOpts() river.InsertOpts {
	return ChargeArgs{}.InsertOpts()
}

// usageJSON is UsageArgs in River's job table.
type usageJSON struct {
	Customer string    `json:"customer"`
	Meter    string    `json:"meter"`
	Kind     string    `json:"kind"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Value    int64     `json:"value"`
	Attempt  int       `json:"attempt,omitempty"`
}

var usageKinds = map[billing.UsageKind]string{billing.Increments: "increments", billing.WindowTotals: "window_totals"}

// MarshalJSON writes the report as River stores it.
func (a UsageArgs) MarshalJSON() ([]byte, error) {
	u := a.Usage
	kind, ok := usageKinds[u.Kind]
	if !ok {
		return nil, fmt.Errorf("%w: Usage.Kind %v: say which kind of meter %s is: billing.Increments or billing.WindowTotals", billing.ErrInvalid, u.Kind, u.Meter)
	}
	attempt := u.Attempt
	if attempt == 1 {
		attempt = 0 // the first report, as 0 is
	}
	return json.Marshal(usageJSON{Customer: u.Customer, Meter: u.Meter, Kind: kind,
		Start: u.Start.UTC(), End: u.End.UTC(), Value: u.Value, Attempt: attempt})
}

// UnmarshalJSON reads the report as River stores it.
func (a *UsageArgs) UnmarshalJSON(data []byte) error {
	var j usageJSON
	if err := json.Unmarshal(data, &j); err != nil {
		return err
	}
	u := billing.Usage{Customer: j.Customer, Meter: j.Meter, Start: j.Start, End: j.End, Value: j.Value, Attempt: j.Attempt}
	for k, name := range usageKinds {
		if name == j.Kind {
			u.Kind = k
		}
	}
	if u.Kind == 0 {
		return fmt.Errorf("riverbilling: usage job of unknown kind %q", j.Kind)
	}
	a.Usage = u
	return nil
}

// UsageWorker is the River worker of [UsageArgs]: it reports one usage
// report through a [billing.Biller] and tells River what became of it,
// as [Worker] does for a charge, with the same [WorkerConfig] and retry
// schedule:
//
//   - Delivered, now or before (found delivered, replayed, or settled from
//     the meter's summary past the key's deadline): the job completes.
//   - Rejected by Stripe (its meter error report reached the Biller's
//     webhook), invalid, of the wrong kind for its meter, another value
//     for a window already reported, or a window that overlaps one
//     already claimed for the customer and meter (the reason names it):
//     the job is cancelled with the reason and never retried. Report a
//     rejected window again with the next Usage.Attempt.
//   - Another runner holds the report's claim: the job is snoozed until
//     that claim's lease ends.
//   - A window total whose total before it is not reported or not settled
//     yet (its job not run, or being sent): the job is snoozed for a
//     minute at a time, without using up attempts, and sends nothing until
//     that total is settled.
//   - Outcome unknown, or a report that needs reconciliation
//     (ErrNeedsReconciliation): the job fails and River retries it after
//     [UsageWorker.NextRetry], as a charge job, with the same identifier.
//   - A spend cap, a revoked key, Stripe refusing the API key or the
//     request itself: the job is cancelled and its queue paused.
type UsageWorker struct {
	river.WorkerDefaults[UsageArgs]
	runner
}

// NewUsageWorker returns a UsageWorker that reports through b.
func NewUsageWorker(b *billing.Biller, cfg WorkerConfig) (*UsageWorker, error) {
	r, err := newRunner("NewUsageWorker", b, cfg)
	if err != nil {
		return nil, err
	}
	return &UsageWorker{runner: r}, nil
}

// Timeout is WorkerConfig.JobTimeout.
func (w *UsageWorker) Timeout(*river.Job[UsageArgs]) time.Duration { return w.cfg.JobTimeout }

// NextRetry schedules the retry after a run whose outcome was unknown, as
// [Worker.NextRetry] does.
func (w *UsageWorker) NextRetry(job *river.Job[UsageArgs]) time.Time {
	return time.Now().Add(w.retryWait(job.Attempt))
}

// Work reports the job's usage.
func (w *UsageWorker) Work(ctx context.Context, job *river.Job[UsageArgs]) error {
	u := job.Args.Usage
	_, err := w.biller.ReportUsage(ctx, u)
	return w.finish(ctx, job.JobRow, err, "usage",
		"customer", u.Customer, "meter", u.Meter, "start", u.Start, "end", u.End, "attempt", u.Attempt)
}
