package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// restoredPastTheWindow reports a counted window past WindowMargin (a
// backfill), lets the identifier window pass, and deletes every claim, as
// a restore from a backup older than the report does. It returns the
// counted report.
func restoredPastTheWindow(t *testing.T, e *env, base time.Time) billing.Usage {
	t.Helper()
	counted := window("cus_1", base, 60, 120, 7)
	if r, err := e.b.ReportUsage(context.Background(), counted); err != nil || r.Outcome != billing.Created {
		t.Fatalf("first report = %+v, %v; want created", r, err)
	}
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	e.exec("DELETE FROM billonce_claims") // the backup predates the report
	return counted
}

// A claim table restored from a backup older than a counted report, past
// the identifier window: a report whose window overlaps the counted one
// is not sent, since the meter would count the overlap twice. Before it
// is sent, the meter's summary is read over the report's whole window:
// the counted event, stamped with its own start, is counted there
// whenever the counted window starts inside the new one, and nothing but
// the report itself may count there (the claim table keeps live windows
// apart). A counted window that starts before the new one is not seen by
// that summary: its event is stamped before the new window, where the
// events of windows that end before it are stamped too.
func TestRestoredClaimTableNeverCountsAnOverlapTwice(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		from, to int // the new window, in minutes after base; the counted one is 60 to 120
		known    string
	}{
		{name: "counted window starts inside the new one", from: 30, to: 90},
		{name: "counted window inside the new one", from: 0, to: 180},
		{name: "new window inside the counted one, from its start", from: 60, to: 90},
		{name: "new window starts inside the counted one", from: 90, to: 150,
			known: "known: past WindowMargin, after a restore that lost a counted report's claim, a report whose window starts inside the counted one is sent, and the overlap counted twice: the counted event is stamped before the new window, and Stripe's summaries tell values by the minute they are stamped at, not by window, so no summary tells it from an event of a window that ended before the new one began"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.known != "" {
				t.Skip(tc.known)
			}
			t.Parallel()
			e := newEnv(t)
			e.srv.CreateMeter("api_calls", "sum", "")
			base := overlapBase().Add(-48 * time.Hour) // a backfill, past WindowMargin
			counted := restoredPastTheWindow(t, e, base)
			before := sends(e.srv)
			r, err := e.b.ReportUsage(context.Background(), window("cus_1", base, tc.from, tc.to, 3))
			if !errors.Is(err, billing.ErrNeedsReconciliation) {
				t.Errorf("report overlapping a counted window after a restore = %+v, %v; want ErrNeedsReconciliation", r, err)
			}
			if n := sends(e.srv) - before; n != 0 {
				t.Errorf("%d meter events sent after the restore, want 0: the meter counts %v from %s, where 7 was reported",
					n, e.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)), claimedWindow(counted))
			}
		})
	}
}

// Windows that meet a counted one, one ending where the next starts, do
// not overlap it: after the same restore, past WindowMargin, the summary
// of each (start inclusive, end exclusive) shows nothing, and each is
// sent and counted once.
func TestRestoredClaimTableSendsWindowsThatMeetACountedOne(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase().Add(-48 * time.Hour)
	restoredPastTheWindow(t, e, base)
	for _, u := range []billing.Usage{window("cus_1", base, 120, 180, 3), window("cus_1", base, 0, 60, 5)} {
		if r, err := e.b.ReportUsage(ctx, u); err != nil || r.Outcome != billing.Created {
			t.Errorf("report of %s after a restore = %+v, %v; want created", claimedWindow(u), r, err)
		}
		e.srv.AggregateNow()
		if got := e.srv.MeterTotal("api_calls", "cus_1", u.Start, u.End); got != float64(u.Value) {
			t.Errorf("the meter counts %v from %s, want %d", got, claimedWindow(u), u.Value)
		}
	}
	if n, total := e.srv.MeterEvents("api_calls", "cus_1"), e.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)); n != 3 || total != 15 {
		t.Errorf("the meter counts %d events, %v in all; want 3, 15", n, total)
	}
}

// Within the identifier window a restored claim table is trusted: only
// the same window again is caught, by Stripe's refusal of its identifier.
func TestRestoredClaimTableWithinTheIdentifierWindowNeverCountsAnOverlapTwice(t *testing.T) {
	t.Skip("known: within WindowMargin of a window's end no summary is read before a report's first send, so once a counted report's claim row is deleted or restored from an older backup, a report of another window that overlaps it is sent and the overlap counted twice; " +
		"not closed: a read before every first send would cost a round trip per report and prove nothing, since Stripe aggregates asynchronously (a report counted a moment ago may not show), " +
		"and here the new window starts inside the counted one, whose event is stamped before the new window, where no summary of it looks")
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase()
	counted := window("cus_1", base, 60, 120, 7)
	if r, err := e.b.ReportUsage(ctx, counted); err != nil || r.Outcome != billing.Created {
		t.Fatalf("first report = %+v, %v; want created", r, err)
	}
	e.srv.AggregateNow()
	e.exec("DELETE FROM billonce_claims") // the backup predates the report
	before := sends(e.srv)
	r, err := e.b.ReportUsage(ctx, window("cus_1", base, 90, 150, 3))
	if n := sends(e.srv) - before; n != 0 {
		t.Errorf("report overlapping a counted window after a restore = %+v, %v: %d meter events sent, want 0", r, err, n)
	}
}
