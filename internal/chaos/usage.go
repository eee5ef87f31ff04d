package chaos

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Meter is the event name of the meter usage runs report to, a sum meter
// Start does not create: call CreateMeter.
const Meter = "api_calls"

// CreateMeter creates Meter on the fake and returns the start of the first
// of windows hourly usage windows, all over before now: customer i's
// reports are Usage(i, w, base) for w from 0 to windows-1. Rejected
// customers (Declined) have every meter event they send rejected later,
// in a meter error report, instead of a card that declines.
func (e *Env) CreateMeter(windows int) (base time.Time) {
	e.Fake.CreateMeter(Meter, "sum", "")
	for c := range e.Declined {
		e.Fake.RejectUsage(c, "meter_event_customer_not_found")
	}
	return time.Now().UTC().Truncate(time.Hour).Add(-time.Duration(windows+1) * time.Hour)
}

// Usage is customer i's usage report for window w of the windows that
// start at base.
func Usage(i, w int, base time.Time) billing.Usage {
	start := base.Add(time.Duration(w) * time.Hour)
	return billing.Usage{Customer: CustomerID(i), Meter: Meter, Kind: billing.Increments,
		Start: start, End: start.Add(time.Hour), Value: Price(i).Amount/10 + int64(w) + 1}
}

// usagePeriod is the claim period of a report (see
// billing.Biller.ReportUsage): its meter and the minute its window starts.
func usagePeriod(u billing.Usage) string {
	return fmt.Sprintf("usage %s %s increment", u.Meter, u.Start.Format(time.RFC3339))
}

// DeliverWebhooks delivers the events the fake has emitted since the last
// call (invoice events, meter error reports), and those h refused before,
// to h, signed with secret, as Stripe would; it returns how many h refused
// this time.
func (e *Env) DeliverWebhooks(ctx context.Context, h http.Handler, secret string) (refused int) {
	evs := e.Fake.Events()
	todo := append(e.redeliver, evs[e.delivered:]...)
	e.delivered, e.redeliver = len(evs), nil
	for _, ev := range todo {
		req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/webhook", bytes.NewReader(ev.Body))
		req.Header.Set("Stripe-Signature", billingtest.Sign(ev.Body, secret, time.Now()))
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			refused++
			e.redeliver = append(e.redeliver, ev)
			e.Logf("webhook %s %s refused: %d %s", ev.ID, ev.Type, rec.Code, rec.Body.String())
		}
	}
	return refused
}

// CheckUsage is Check for a usage run: it closes the fake and checks its
// meter against the claim table. Each window of each customer but the
// rejected must be counted exactly once, at its value, by one event, with
// a succeeded claim; a rejected customer's windows must count nothing and
// their claims be failed (by the error reports delivered to the webhook).
// Any other claim is a mismatch. Paid counts the customers whose every
// window counted once, Declined the rejected customers, Reports the
// windows counted once.
func (e *Env) CheckUsage(ctx context.Context, base time.Time, windows int) (Ledger, error) {
	e.Fake.Close()
	st := e.Fake.Stats()
	l := Ledger{Faults: st.Faults, Requests: st.Requests, Replays: st.Replays}
	claims, err := loadClaims(ctx, e.Pool, &l)
	if err != nil {
		return l, e.Errorf("reading claims: %w", err)
	}
	for i := range e.s.Customers {
		c := CustomerID(i)
		rejected := e.Declined[c]
		counted, extra := 0, 0
		for w := range windows {
			u := Usage(i, w, base)
			k := key{usagePeriod(u), c}
			cl, ok := claims[k]
			delete(claims, k)
			at := fmt.Sprintf("customer %s, window %s", c, u.Start.Format("15:04"))
			total, value := e.Fake.MeterTotal(Meter, c, u.Start, u.End), float64(u.Value)
			switch {
			case rejected && total != 0:
				l.problem(&l.Mismatches, "%s: rejected, yet counted %v", at, total)
			case rejected && cl.state != string(claim.StateFailed):
				l.problem(&l.Mismatches, "%s: rejected by Stripe, but its claim is %q, want failed", at, cl.state)
			case rejected:
			case total == value:
				counted++
				if !ok || cl.state != string(claim.StateSucceeded) {
					l.problem(&l.Mismatches, "%s: counted once, but its claim is %q, want succeeded", at, cl.state)
				}
			case total == 0:
				l.problem(&l.Missing, "%s: never counted; claim state %q", at, cl.state)
			case total > value && total == float64(int64(total/value))*value:
				n := int(total / value)
				extra += n - 1
				l.Duplicates += n - 1
				l.note("%s: counted %d times (total %v, value %v); claim state %q", at, n, total, value, cl.state)
			default:
				l.problem(&l.Mismatches, "%s: total %v, want %v", at, total, value)
			}
		}
		l.Reports += counted
		switch {
		case rejected:
			l.Declined++
		case counted == windows:
			l.Paid++
		}
		want := counted + extra
		if rejected {
			want = 0
		}
		if n := e.Fake.MeterEvents(Meter, c); n > want {
			l.Duplicates += n - want
			l.note("customer %s: %d meter events counted, %d expected", c, n, want)
		}
	}
	for k, c := range claims {
		l.problem(&l.Mismatches, "claim for unknown customer %s, period %q (state %q)", k.customer, k.period, c.state)
	}
	if !l.OK() {
		l.Evidence = evidence(l.Problems, e.Fake.Log(), e.LogDir)
	}
	return l, nil
}

// PassTime moves time forward by d for billonce and the fake alike: every
// timestamp of the claim tables moves back by d (the database clock
// stays), then the fake's clock moves on by d, so keys and identifiers
// expire at the fake as their claims age. A usage report's window is its
// identity, not a reading of the clock, and stays.
func (e *Env) PassTime(ctx context.Context, d time.Duration) error {
	rows, err := e.Pool.Query(ctx, `SELECT table_name::text, column_name::text FROM information_schema.columns
		WHERE table_schema = current_schema() AND data_type = 'timestamp with time zone'
			AND column_name NOT IN ('window_start', 'window_end')
			AND (table_name = 'billonce_claims' OR starts_with(table_name, 'billonce_claims_'))`)
	if err != nil {
		return err
	}
	cols, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ Table, Column string }])
	if err != nil {
		return err
	}
	// One UPDATE per table moves all its columns: each row is written
	// once, and its indexes (the windows' exclusion constraints among
	// them) take one new version of it, not one per column.
	var tables []string
	sets := map[string][]string{}
	for _, c := range cols {
		if sets[c.Table] == nil {
			tables = append(tables, c.Table)
		}
		col := pgx.Identifier{c.Column}.Sanitize()
		sets[c.Table] = append(sets[c.Table], col+" = "+col+" - $1::bigint * interval '1 microsecond'")
	}
	// One transaction moves every column or none, so that it can be tried
	// again when a restart of PostgreSQL (another harness's, on the same
	// cluster) ends its connection.
	move := func(tx pgx.Tx) error {
		for _, t := range tables {
			if _, err := tx.Exec(ctx, "UPDATE "+pgx.Identifier{t}.Sanitize()+" SET "+strings.Join(sets[t], ", "), d.Microseconds()); err != nil {
				return err
			}
		}
		return nil
	}
	for try := 1; ; try++ {
		err := pgx.BeginFunc(ctx, e.Pool, move)
		if err == nil {
			break
		}
		if try == 5 || ctx.Err() != nil {
			return e.Errorf("moving time: %w", err)
		}
		e.Logf("moving time: %v; trying again", err)
		time.Sleep(time.Second) // PostgreSQL is down for a moment at most
	}
	e.Fake.Advance(d)
	e.Logf("time passed: %v on the claims' and the fake's clocks", d)
	return nil
}
