package billing_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
)

// A claim table restored from a backup older than a counted report, past
// the identifier window: a report whose window overlaps the counted one
// but starts at another minute is not sent, since the meter would count
// the overlap twice. The meter's summary of the new report's first
// minute does not show the counted event, stamped with its own start.
func TestRestoredClaimTableNeverCountsAnOverlapTwice(t *testing.T) {
	t.Skip("known: past WindowMargin, after a restore that lost a counted report's claim, a report whose window overlaps it and starts at another minute is sent, since the meter's summary is read over its first minute only, and the overlap counted twice")
	t.Parallel()
	e := newEnv(t)
	e.srv.CreateMeter("api_calls", "sum", "")
	ctx := context.Background()
	base := overlapBase().Add(-48 * time.Hour) // a backfill, past WindowMargin
	counted := window("cus_1", base, 60, 120, 7)
	if r, err := e.b.ReportUsage(ctx, counted); err != nil || r.Outcome != billing.Created {
		t.Fatalf("first report = %+v, %v; want created", r, err)
	}
	e.advance(25 * time.Hour)
	e.srv.AggregateNow()
	e.exec("DELETE FROM billonce_claims") // the backup predates the report
	before := sends(e.srv)
	later := window("cus_1", base, 90, 150, 3)
	r, err := e.b.ReportUsage(ctx, later)
	if !errors.Is(err, billing.ErrNeedsReconciliation) {
		t.Errorf("report overlapping a counted window after a restore = %+v, %v; want ErrNeedsReconciliation", r, err)
	}
	if n := sends(e.srv) - before; n != 0 {
		t.Errorf("%d meter events sent after the restore, want 0: the meter counts %v from %s, where 7 was reported",
			n, e.srv.MeterTotal("api_calls", "cus_1", base, base.Add(3*time.Hour)), claimedWindow(counted))
	}
}

// Within the identifier window a restored claim table is trusted: only
// the same window again is caught, by Stripe's refusal of its identifier.
func TestRestoredClaimTableWithinTheIdentifierWindowNeverCountsAnOverlapTwice(t *testing.T) {
	t.Skip("known: within WindowMargin of a window's end, a report whose window overlaps a counted report whose claim row was deleted or restored from an older backup is sent, and the overlap counted twice")
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
