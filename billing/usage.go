package billing

import (
	"context"
	"errors"
	"fmt"
	"iter"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// UsageKind says what kind of Stripe meter a [Usage] report is for, and so
// what its Value means. The zero UsageKind is no kind: a report must say.
type UsageKind int

const (
	// Increments is for a meter that sums its events (default_aggregation
	// sum, no event_time_window): Value is the usage within the report's
	// window, added to the customer's total.
	Increments UsageKind = iota + 1
	// WindowTotals is for a pre-aggregated meter (event_time_window hour
	// or day), of which Stripe keeps only the newest event of each UTC
	// window: Value is the window's running total, and the report's window
	// is exactly one of the meter's. A window's totals are its attempts:
	// the first is attempt 1, each new total the next attempt, sent only
	// once the one before it is settled, so that Stripe never ends with
	// an older total; each is sent once. [Biller.RunUsage] given a
	// window's totals in order sends them all, one after the other; a
	// [Biller.ReportUsage] of a total whose total before it is not
	// reported or not settled yet sends nothing and returns ErrInProgress,
	// with ChargeError.Until a minute on. Once the window ended more than
	// Config.WindowMargin ago, a total is sent only if the meter's summary
	// shows nothing for the window (see [Biller.ReportUsage]).
	WindowTotals
)

// String returns "increments", "window totals", or "none" for the zero
// value.
func (k UsageKind) String() string {
	switch k {
	case 0:
		return "none"
	case Increments:
		return "increments"
	case WindowTotals:
		return "window totals"
	}
	return fmt.Sprintf("UsageKind(%d)", int(k))
}

// Usage is one report of a customer's usage on a Stripe meter for a window
// of time, sent once as one meter event.
type Usage struct {
	// Customer is the Stripe customer ("cus_…").
	Customer string
	// Meter is the meter's event_name ("api_calls"); an active meter with
	// this event name must exist on the account.
	Meter string
	// Kind says what kind of meter Meter is. The Biller reads the meter
	// from Stripe once and refuses a report whose kind does not match it,
	// as an ErrInvalid: increments sent to a pre-aggregated meter, or
	// totals to a summing one, would count the wrong usage.
	Kind UsageKind
	// Start and End bound the window the usage was measured in: Start
	// inclusive, End exclusive, both whole minutes (for WindowTotals, one
	// whole UTC hour or day, as the meter's event_time_window). The event
	// is stamped with Start. Start must be within the last 34 days (Stripe
	// takes events up to 35 days old; a day is left for retries and
	// resumes), and End no more than 5 minutes ahead. The windows of one
	// customer and meter never overlap, since the meter would count the
	// overlap twice: a report whose window overlaps one already claimed
	// in the claim table (by any run, replica, file or scope) is refused
	// with an ErrInvalid that names the claimed window, and nothing is
	// sent. The same window again is the same report (or, for
	// WindowTotals, the window's next total), and windows that meet, one
	// ending where the next starts, do not overlap. A window whose report
	// failed (Stripe rejected it) no longer holds its time.
	Start, End time.Time
	// Value is the quantity: the window's usage (Increments) or its
	// running total (WindowTotals). It must be positive, and at most
	// 2^53, the largest integer Stripe's summaries (float64) count exactly.
	Value int64
	// Attempt numbers reports of the same window: 0 or 1 for the first.
	// For Increments, after Stripe rejected a report (an ErrDeclined),
	// report it again with the next number; like a re-bill, it is a
	// person's decision. For WindowTotals, each new total of the window
	// is the next number (see WindowTotals); the same number with another
	// total is refused.
	Attempt int
	// Account, when set, reports the usage to the meter of this connected
	// account (see ChargeOptions.Account): the meter and the customer are
	// the account's.
	Account string
}

// Limits on usage reports.
const (
	// maxMeterName is the longest meter event name accepted, in bytes.
	maxMeterName = 100
	// usageMaxAge is how old a window's start may be: Stripe refuses
	// events older than 35 days; a day is left for retries and resumes.
	usageMaxAge = 34 * 24 * time.Hour
	// usageMaxAhead is how far ahead of now a window may end: Stripe
	// refuses events more than 5 minutes in the future.
	usageMaxAhead = 5 * time.Minute
	// maxExactValue is the largest Usage.Value accepted: Stripe's
	// summaries are float64, which holds every integer up to 2^53 and
	// rounds the next one, 2^53 + 1, to 2^53. Compared as integers: as
	// float64 the two are equal.
	maxExactValue = 1 << 53
	// endpointMeterEvents is the Endpoint of a usage claim.
	endpointMeterEvents = "meter_events"
)

// usageReport is the kind of a usage report: one meter event, whose
// identifier is its key. Stripe refuses an identifier it has seen, so a
// refusal saying so is the claim's own event where its key may have been
// sent before; past the identifier's window, the meter's summary for the
// customer and window finds what was counted.
type usageReport struct {
	Usage
	meter meterInfo
}

// meterInfo is what billonce needs of a Stripe meter.
type meterInfo struct {
	id, formula, window   string
	customerKey, valueKey string
}

// windowSize is the length of the meter's event_time_window, or a minute,
// the grain of Stripe's summaries, for a meter without one.
func (m meterInfo) windowSize() time.Duration {
	switch m.window {
	case "hour":
		return time.Hour
	case "day":
		return 24 * time.Hour
	}
	return time.Minute
}

// meters caches the Biller's meters by event name: a meter's aggregation
// and window never change once it is made.
type meters struct {
	mu sync.Mutex
	by map[string]meterInfo
}

// checkUsage checks u's fields that need no meter, and returns it with
// its defaults and its times in UTC.
func checkUsage(u Usage, now time.Time) (Usage, error) {
	if err := checkID("customer ID", u.Customer); err != nil {
		return u, err
	}
	if err := checkID("Usage.Meter", u.Meter); err != nil {
		return u, err
	}
	if len(u.Meter) > maxMeterName {
		return u, invalid("Usage.Meter is %d bytes long; Stripe's event names are at most %d", len(u.Meter), maxMeterName)
	}
	switch {
	case u.Kind != Increments && u.Kind != WindowTotals:
		return u, invalid("Usage.Kind %v: say which kind of meter %s is: billing.Increments (a sum meter) or billing.WindowTotals (a meter with event_time_window)", u.Kind, u.Meter)
	case u.Value <= 0:
		return u, invalid("Usage.Value %d: report a positive quantity (a window without usage needs no report)", u.Value)
	case u.Value > maxExactValue:
		return u, invalid("Usage.Value %d is above %d (2^53), the largest quantity Stripe's summaries count exactly (they are float64): split the usage over shorter windows", u.Value, int64(maxExactValue))
	case u.Attempt < 0 || u.Attempt > maxAttempt:
		return u, invalid("Usage.Attempt %d: use 0 or 1 for the first report, up to %d", u.Attempt, maxAttempt)
	case u.Start.IsZero() || u.End.IsZero():
		return u, invalid("Usage.Start and Usage.End must be set: the window the usage was measured in")
	}
	u.Attempt = max(u.Attempt, 1)
	u.Start, u.End = u.Start.UTC(), u.End.UTC()
	switch {
	case !u.End.After(u.Start):
		return u, invalid("Usage window %s to %s: End must be after Start", u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339))
	case !u.Start.Equal(u.Start.Truncate(time.Minute)) || !u.End.Equal(u.End.Truncate(time.Minute)):
		return u, invalid("Usage window %s to %s: Start and End must be whole minutes, as Stripe's summaries are", u.Start.Format(time.RFC3339Nano), u.End.Format(time.RFC3339Nano))
	case u.Start.Before(now.Add(-usageMaxAge)):
		return u, invalid("Usage window starts %s, more than 34 days ago: Stripe refuses meter events older than 35 days", u.Start.Format(time.RFC3339))
	case u.End.After(now.Add(usageMaxAhead)):
		return u, invalid("Usage window ends %s, in the future: report a window once it is over (Stripe refuses events more than 5 minutes ahead)", u.End.Format(time.RFC3339))
	}
	return u, nil
}

// Validate reports whether u is a report billonce can send, as far as can
// be told without its meter: a customer ID, a meter event name, a kind, a
// positive value and a window of whole minutes that Stripe still takes.
// Use it to check a whole input file before [Biller.RunUsage], which
// checks every report itself, against its meter too. Its errors wrap
// [ErrInvalid].
func (u Usage) Validate() error {
	_, err := checkUsage(u, time.Now())
	return err
}

// checkMeter checks u against its meter.
func checkMeter(u Usage, m meterInfo) error {
	switch {
	case m.formula != "sum":
		return invalid("meter %s (%s) aggregates by %s; billonce reports quantities to sum meters only", u.Meter, m.id, m.formula)
	case u.Kind == Increments && m.window != "":
		return invalid("meter %s (%s) has event_time_window %s: Stripe keeps only the newest event of each %s, so increments would be lost; report the window's running total with billing.WindowTotals", u.Meter, m.id, m.window, m.window)
	case u.Kind == WindowTotals && m.window == "":
		return invalid("meter %s (%s) sums every event: window totals would be added up and overcount; report increments with billing.Increments", u.Meter, m.id)
	}
	if u.Kind == WindowTotals {
		size := m.windowSize()
		if !u.Start.Equal(u.Start.Truncate(size)) || u.End.Sub(u.Start) != size {
			return invalid("meter %s keeps one total per UTC %s: the window must be exactly one %s, not %s to %s", u.Meter, m.window, m.window, u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339))
		}
	}
	return nil
}

// usagePeriod is the claim's period of a report: the meter, the start of
// its window and its kind, and for a window total its attempt, the
// total's revision. The claim records the meter and window as columns of
// their own too (see usageReport.describe), and the table keeps the live
// windows of a customer and meter apart, so a report's own event is the
// only one of the table's that the meter's summary of its window can
// count (see meterTotal); the period keeps reports made before the table
// recorded windows from starting at the same minute.
func usagePeriod(u Usage) string {
	p := "usage " + u.Meter + " " + u.Start.Format(time.RFC3339)
	if u.Kind == WindowTotals {
		return p + " total " + strconv.Itoa(u.Attempt)
	}
	return p + " increment"
}

// usageFromClaim rebuilds the usage report a pending claim stands for,
// with the claim's own key: its meter and window are the claim's, its
// kind the meter's (a report's kind always matches its meter: see
// checkMeter). A claim made before the claim table recorded window ends
// has its End from the meter: one window of a pre-aggregated meter, a
// minute otherwise, which is all a resume needs of it.
func (b *Biller) usageFromClaim(ctx context.Context, c claim.Claim) (job, error) {
	if c.Meter == "" || c.WindowStart.IsZero() {
		return job{}, fmt.Errorf("billing: claim %s is sent to meter events but records no meter and window (period %q)", c.Key, c.Period)
	}
	key, err := idemkey.Parse(c.Key)
	if err != nil {
		return job{}, fmt.Errorf("billing: claim for customer %s, period %s has an unusable key: %w", c.Customer, c.Period, err)
	}
	m, err := b.meter(ctx, c.Meter)
	if err != nil {
		return job{}, err
	}
	u := Usage{Customer: c.Customer, Meter: c.Meter, Kind: Increments, Start: c.WindowStart.UTC(), End: c.WindowEnd.UTC(),
		Value: c.Amount, Attempt: max(c.Attempt, 1), Account: c.Account}
	if m.window != "" {
		u.Kind = WindowTotals
	}
	if c.WindowEnd.IsZero() {
		u.End = u.Start.Add(m.windowSize())
	}
	return job{kind: &usageReport{Usage: u, meter: m}, customer: c.Customer, period: c.Period, price: Price{Amount: c.Amount},
		key: key, attempt: u.Attempt, owner: b.newOwner()}, nil
}

// usageKey is the key, and the meter event's identifier, of a report.
func (b *Biller) usageKey(u Usage) (idemkey.Key, error) {
	parts := []string{"usage", u.Meter, u.Customer, u.Start.Format(time.RFC3339), u.End.Format(time.RFC3339), u.Kind.String()}
	return idemkey.For(b.cfg.Scope, onAccountParts(u.Account, append(parts, strconv.Itoa(u.Attempt))...)...)
}

// prepareUsage checks a report and derives its job. Its errors are
// *ChargeError.
func (b *Biller) prepareUsage(ctx context.Context, u Usage) (job, error) {
	j := job{account: u.Account, customer: u.Customer, period: "usage " + u.Meter, attempt: u.Attempt}
	u, err := checkUsage(u, time.Now())
	if err == nil {
		err = checkAccount(u.Account)
	}
	if err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	ctx = onAccount(ctx, u.Account)
	j.period, j.attempt = usagePeriod(u), u.Attempt
	m, err := b.meter(ctx, u.Meter)
	if err != nil {
		return j, chargeErr(j, nil, "reading meter "+u.Meter, err)
	}
	if err := checkMeter(u, m); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	key, err := b.usageKey(u)
	if err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.price, j.key, j.owner = Price{Amount: u.Value}, key, b.newOwner()
	j.kind = &usageReport{Usage: u, meter: m}
	return j, nil
}

// meter returns the active meter whose event name is name, read from
// Stripe once per Biller. No such meter is an ErrInvalid.
func (b *Biller) meter(ctx context.Context, name string) (meterInfo, error) {
	b.usageClients.meters.mu.Lock()
	m, ok := b.usageClients.meters.by[accountOf(ctx)+" "+name]
	b.usageClients.meters.mu.Unlock()
	if ok {
		return m, nil
	}
	if err := b.limiter.Wait(ctx); err != nil {
		return m, err
	}
	params := &stripe.BillingMeterListParams{Status: stripe.String("active")}
	params.Context = ctx
	params.Limit = stripe.Int64(100)
	it := b.meterList.List(params)
	found := false
	for it.Next() {
		bm := it.BillingMeter()
		if bm.EventName != name {
			continue
		}
		m = meterInfo{id: bm.ID, formula: "sum", window: string(bm.EventTimeWindow), customerKey: "stripe_customer_id", valueKey: "value"}
		if bm.DefaultAggregation != nil {
			m.formula = string(bm.DefaultAggregation.Formula)
		}
		if bm.CustomerMapping != nil && bm.CustomerMapping.EventPayloadKey != "" {
			m.customerKey = bm.CustomerMapping.EventPayloadKey
		}
		if bm.ValueSettings != nil && bm.ValueSettings.EventPayloadKey != "" {
			m.valueKey = bm.ValueSettings.EventPayloadKey
		}
		found = true
		break
	}
	if err := it.Err(); err != nil {
		return m, err
	}
	if !found {
		return m, invalid("no active Stripe meter has the event name %q: create the meter first, or check Usage.Meter", name)
	}
	b.usageClients.meters.mu.Lock()
	b.usageClients.meters.by[accountOf(ctx)+" "+name] = m
	b.usageClients.meters.mu.Unlock()
	return m, nil
}

// ReportUsage reports u to Stripe as one meter event, exactly once: call it
// as often as you like, from as many replicas as you like, for the same
// report; Stripe counts it once.
//
// The flow is a charge's: the key, which is also the meter event's
// identifier, is derived from (scope, meter, customer, window, kind,
// attempt) before anything else; a claim row is committed; only then is
// the event sent, inside retries that all carry that key and identifier;
// the outcome is recorded on the claim. The receipt's StripeID is the
// identifier, its Amount the value, and its Period the claim's period
// ("usage <meter> <start> increment", or "usage <meter> <start> total
// <attempt>"). A report whose window overlaps the window of another
// report of the customer and meter in the claim table is refused before
// anything is sent, with an [ErrInvalid] that names that window (see
// Usage.Start): the claim table refuses it, so that it holds across runs,
// replicas and processes.
//
// Stripe refuses an identifier it has seen in the last 24 hours or more
// with a 400 ("An event already exists with identifier …"). When this
// claim's key may have been sent before (a lost answer, a crashed
// runner), that answer means the event is there: the report is recorded
// as delivered, with Outcome Replayed, and never sent again. When it
// cannot have been (the claim is new), the identifier was used by an
// event this claim table never sent: [ErrNeedsReconciliation], the claim
// stays pending, and nothing is retried.
//
// Past the key's deadline (Config.WindowMargin) with an unknown outcome,
// nothing is sent blind: the meter's event summary for the customer
// decides, read over the report's whole window, Start to End. Every event
// is stamped with its report's Start, and the claim table keeps the live
// windows of a customer and meter apart, so nothing of the table's but
// this report can count there. A summary equal to the value records the
// report as delivered (Outcome Reconciled); a summary of zero reopens the
// key's window and sends; anything else is ErrNeedsReconciliation, and
// nothing is sent: another report whose window overlaps this one and
// starts inside it is counted (one whose claim was lost, or another
// writer's), or, for a window total, another total of the window, which
// Stripe, keeping the newest event, would replace with this one. This
// proves delivery only while nothing but this claim table reports to the
// meter for the customer in that window; Stripe has no lookup of one
// event by identifier. The summary decides the same way before every send
// (the first, or a resume) of any report whose window ended more than
// WindowMargin ago: Stripe may have taken its event (or, for a window
// total, a newer total) more than a day ago, from a claim table restored
// since from an older backup, and forgotten its identifier; and a resend
// after a reopening that got no answer cannot tell, from Stripe's refusal
// of the identifier, its own event from another writer's that took the
// identifier meanwhile. So a window's new total is sent
// by itself only within WindowMargin of the window's end; later, with an
// earlier total counted, it needs a person, who compares the window's
// summary with the records.
//
// What the claim table alone keeps apart, and no summary can show: a
// counted report whose window starts before this one's Start and reaches
// into it (its event is stamped before Start, where the events of windows
// that ended before Start are stamped too), and, within WindowMargin of
// the window's end, where no summary is read before the first send, any
// overlapping report of another window (Stripe's refusal of a repeated
// identifier catches only the same report again). A summary read before
// every first send would cost a round trip per report and prove nothing
// there: Stripe aggregates events asynchronously, so a report counted a
// moment ago may not show yet. Once a counted report's claim is deleted,
// or lost to a restore from an older backup, such an overlap is sent and
// counted twice.
//
// Stripe validates events again as it aggregates them and reports the
// ones it rejects later, in a meter error report (a
// v1.billing.meter.error_report_triggered event); [Biller.Webhook] fails
// the usage claims it names, and a report of the same window is then sent
// again only with the next Attempt. An identifier is whatever the event's
// sender chose, on any meter of any Stripe account, and Stripe takes it
// again once it has forgotten it, so a report fails only a usage report's
// claim that it can be about: on the claim's meter, named by the Stripe
// id (mtr_…) the claim recorded when it was made, which is one account's
// (so with one claim table for several accounts, a report on one never
// fails a report counted on another), with a validation window that
// reaches into the time the claim's key can be sent (from its claim to a
// day after; Stripe's clock and the database's are each read as ages, so
// they need not agree), and, for a claim whose window was reopened and its
// event sent again, that begins after the reopening (the report may be
// about the earlier send). A claim made before the claim table recorded
// meter ids (migration 7) is failed by no report. Any other report naming
// the identifier is logged and changes nothing.
// Error reports name a sample of the rejected events, not all: those not
// named stay delivered; compare the meter's summaries to find them.
//
// Every error is a [*ChargeError], as for charges.
func (b *Biller) ReportUsage(ctx context.Context, u Usage) (Receipt, error) {
	j, err := b.prepareUsage(ctx, u)
	if err != nil {
		return Receipt{}, err
	}
	return b.claimLoop(ctx, j, time.Now())
}

// RunUsage reports every usage report from reports, each exactly once, as
// [Biller.Run] bills customers: claimed in batches, sent with bounded
// concurrency under the Biller's rate limit, with Progress, a Summary
// (Created counts the events sent, AlreadyBilled the reports found
// delivered), and the lock of opts.Lock (named LockName, by default
// "billonce-usage:<scope>"). A report that is invalid, repeated within a
// batch, or whose window overlaps one already claimed (by this run or
// any other) is counted as Invalid; answers that stop a Run stop it.
//
// A window's totals ([WindowTotals]) may be given to one RunUsage, in
// order: each is sent once the one before it is settled, never two of a
// window at once, and the meter ends with the newest. A total whose total
// before it this run is sending waits for it, holding no worker; once
// that one is settled, the total is checked as ReportUsage checks it:
// after a total delivered, or one Stripe refused (a window's failed total
// no longer holds it), it is sent; after one left pending (an unknown
// outcome, or ErrNeedsReconciliation) it is counted Pending, with
// ErrInProgress, and its claim is handed back for a later run. A total
// given before the one it follows is Pending in the same way: RunUsage
// does not reorder reports. A run that stops hands back, unsent, the
// totals waiting in it.
func (b *Biller) RunUsage(ctx context.Context, reports iter.Seq2[Usage, error], opts *RunOptions) (Summary, error) {
	var bad error
	if reports == nil {
		bad = invalid("RunUsage needs an iterator of usage reports")
	}
	preps := func(yield func(prepareFunc, error) bool) {
		for u, err := range reports {
			if !yield(func(ctx context.Context) (job, error) { return b.prepareUsage(ctx, u) }, err) {
				return
			}
		}
	}
	return b.runReported(ctx, "usage", "billonce-usage:"+b.cfg.Scope, preps, bad, opts)
}

// write makes one HTTP attempt of a usage report: the meter event.
func (u *usageReport) write(ctx context.Context, b *Biller, _ job, key idemkey.Key) (object, error) {
	params := &stripe.BillingMeterEventParams{
		EventName:  stripe.String(u.Meter),
		Identifier: stripe.String(key.String()),
		Timestamp:  stripe.Int64(u.Start.Unix()),
		Payload: map[string]string{
			u.meter.customerKey: u.Customer,
			u.meter.valueKey:    strconv.FormatInt(u.Value, 10),
		},
	}
	params.Context, params.IdempotencyKey = ctx, stripe.String(key.String())
	ev, err := b.meterEvents.New(params)
	if err != nil {
		return object{}, err
	}
	out := object{id: ev.Identifier, status: "succeeded", replayed: replayed(ev.LastResponse), requestID: requestID(ev.LastResponse)}
	if out.id != key.String() {
		return object{}, notAPayment(ev.LastResponse)
	}
	return out, nil
}

// identifierTakenReason is the LastError of a usage claim released
// because Stripe refused its identifier although this claim never
// executed it: the event is another table's, or one Stripe took and did
// not count. The claim is marked Unsent, so that a resume never records
// the same refusal as delivered.
const identifierTakenReason = "identifier taken: Stripe already has a meter event with this report's identifier, and this claim never sent it (or sent it after the meter's summary showed nothing); nothing was counted twice and nothing more is sent: compare the meter's summary for the window with your records, then resolve the claim"

// duplicateIdentifier reports whether err is Stripe's refusal of a meter
// event whose identifier it has seen already.
func duplicateIdentifier(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == 400 && strings.Contains(se.Msg, "already exists with identifier")
}

// identifierMayBeForgotten reports whether u's claim, about to be
// sent, may stand for an event Stripe took more than a day ago and no
// longer knows by its identifier, although this claim never sent it: a
// claim table restored from a backup, or another table of the same scope.
// Sending it blind could count increments twice, or make a window total
// replace a newer one (Stripe keeps the newest event of a window). An
// event is sent once its window is over, or at most usageMaxAhead before
// (checkUsage refuses it earlier), so while the window ended less than
// WindowMargin ago Stripe still refuses the identifier of any earlier
// send of it, and of every other total of its window. A claim whose
// window was reopened after a summary read is read again too: the resend
// that followed may have got no answer, and Stripe's refusal of an
// identifier another writer took since is then what a replay of the
// claim's own event looks like.
func (b *Biller) identifierMayBeForgotten(u *usageReport) bool {
	return time.Since(u.End) > b.cfg.WindowMargin-usageMaxAhead
}

// checkRevision checks, before a window total of attempt 2 or more is
// sent, that the total before it is reported and settled: revisions of a
// window are sent one at a time, in order, so that Stripe, which keeps the
// newest event of a window, never ends with an older total. A total that
// comes before the one it follows waits for it (ErrInProgress), as one
// that comes while it is being sent does. Its errors are *ChargeError; the
// caller hands its claim back.
func (b *Biller) checkRevision(ctx context.Context, j job, u *usageReport) error {
	key, err := u.follows(b)
	switch {
	case err != nil:
		return chargeErr(j, nil, "", invalid("%v", err))
	case key.IsZero():
		return nil
	}
	prev := u.Attempt - 1
	c, err := b.claims.Get(ctx, key.String())
	switch {
	case errors.Is(err, claim.ErrNotFound):
		// Not reported yet: a queue does not keep a window's totals in
		// order, nor does a Run given them out of order. This one waits
		// for it.
		e := chargeErr(j, ErrInProgress, fmt.Sprintf("this window has no total of attempt %d yet; a window's totals are numbered one after the other, from 1, and each is sent after the one before it", prev), nil)
		e.Until = time.Now().Add(time.Minute)
		return e
	case err != nil:
		return chargeErr(j, nil, fmt.Sprintf("looking up the total of attempt %d", prev), err)
	case c.State == claim.StatePending:
		e := chargeErr(j, ErrInProgress, fmt.Sprintf("the total of attempt %d (%d) is not settled yet; this one is sent after it, so that Stripe keeps the newest", prev, c.Amount), nil)
		e.Until = time.Now().Add(time.Minute)
		return e
	}
	return nil
}

// follows is the key of the window's total before this one, for a window
// total of attempt 2 or more; any other report follows nothing.
func (u *usageReport) follows(b *Biller) (idemkey.Key, error) {
	if u.Kind != WindowTotals || u.Attempt < 2 {
		return idemkey.Key{}, nil
	}
	prev := u.Usage
	prev.Attempt--
	return b.usageKey(prev)
}

// reconcileUsage settles a pending usage claim from the meter's event
// summary for the customer and window (see ReportUsage): one whose key's
// deadline has passed, or one that may stand for an event Stripe no
// longer knows by its identifier.
func (b *Biller) reconcileUsage(ctx context.Context, j job, c claim.Claim, u *usageReport) (Receipt, error) {
	level := slogWarn
	if j.won {
		level = slogInfo // a first send of an old window: nothing went wrong
	}
	b.log.LogAttrs(ctx, level, "billonce: reading the meter's summary before sending a usage report",
		attrs(j, "age", c.Age.Round(time.Minute), "sent_age", c.SentAge.Round(time.Minute))...)
	total, err := readRetried(ctx, b, j, func(ctx context.Context) (float64, error) {
		return b.meterTotal(ctx, u)
	})
	needs := func(reason string) (Receipt, error) {
		return Receipt{}, b.needs(ctx, j, reason, nil)
	}
	counted, whole := countOf(total)
	switch {
	case err != nil:
		return needs("reading the meter's summary failed: " + err.Error())
	case whole && counted == u.Value:
		r, err := b.record(ctx, j, object{id: j.key.String(), status: "succeeded"})
		if err == nil {
			r.Outcome = Reconciled
		}
		return r, err
	case whole && counted == 0:
		// Nothing counted: the event never arrived, and no other event
		// counts where this one would.
		if err := b.claims.Reopen(ctx, j.key.String(), j.owner, endpointMeterEvents, b.credential); err != nil {
			return Receipt{}, chargeErr(j, nil, "reopening the key's window", err)
		}
		j.reopened = true
		c.SentAge = 0
		return b.sendOnce(ctx, u, j, c)
	}
	return needs(fmt.Sprintf("the meter's summary is %v, neither nothing nor the report's value %d: another event counts in this window "+
		"(another report, or, for a window total, another total of the window, which this one would replace, Stripe keeping the newest); "+
		"nothing was sent: compare the summary with your records", total, u.Value))
}

// countOf returns a summary's aggregated value as an integer, and whether
// it is one that a report's Value can equal: a whole number from 0 to
// maxExactValue. Compared as integers, not as float64, in which 2^53 + 1
// is 2^53.
func countOf(total float64) (int64, bool) {
	if total < 0 || total > maxExactValue || total != math.Trunc(total) {
		return 0, false
	}
	return int64(total), true
}

// meterTotal reads the meter's aggregated value for the report's customer
// over its whole window, one summary from Start (inclusive) to End
// (exclusive; for a pre-aggregated meter, the meter's window). Every
// event is stamped with its report's Start, and the claim table keeps the
// live windows of a customer and meter apart, so the report's own event
// is the only one of the claim table's that may count there: anything
// else is another report's whose window overlaps this one (its claim lost
// or deleted, or another writer's). The event of a report whose window
// starts before Start and reaches into this one is not read: it is
// stamped before Start, and a summary tells values by the minute they are
// stamped at, not by window, so it cannot tell that event from one of a
// window that ended before Start. Adjacent windows, one ending where the
// next starts, are not counted: End is exclusive.
func (b *Biller) meterTotal(ctx context.Context, u *usageReport) (float64, error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return 0, err
	}
	params := &stripe.BillingMeterEventSummaryListParams{
		ID:        stripe.String(u.meter.id),
		Customer:  stripe.String(u.Customer),
		StartTime: stripe.Int64(u.Start.Unix()),
		EndTime:   stripe.Int64(u.End.Unix()),
	}
	params.Context = ctx
	it := b.meterSummaries.List(params)
	var total float64
	for it.Next() {
		s := it.BillingMeterEventSummary()
		if s.ID == "" || math.IsNaN(s.AggregatedValue) {
			return 0, notAPayment(it.BillingMeterEventSummaryList().LastResponse)
		}
		total += s.AggregatedValue
	}
	return total, it.Err()
}

// usageClients are the Stripe clients of usage reports.
type usageClients struct {
	meterList      *meter.Client
	meterEvents    *meterevent.Client
	meterSummaries *metereventsummary.Client
	meters         *meters
}

func (*usageReport) endpoint(*Biller) string { return endpointMeterEvents }

// localFirstSend is false: a report's deadline runs from its window's
// opening, not from its claim, so a claim made near the end of it leaves
// no time that the claim statement's reading could vouch for; every send
// asks the store (TestSimulationUsage seeds 41, 237 and 278 report
// windows past their deadline otherwise).
func (*usageReport) localFirstSend() bool { return false }

// describe records the report's meter and window on its claim, which
// keeps the live windows of a customer and meter apart, and the meter's
// Stripe id, which tells a meter error report about this account's meter
// from one about another account's meter of the same event name.
func (u *usageReport) describe(r *claimengine.Request) {
	r.Meter, r.WindowStart, r.WindowEnd, r.MeterID = u.Meter, u.Start, u.End, u.meter.id
}

func (*usageReport) alreadyThere(err error) bool { return duplicateIdentifier(err) }

// ready checks that a window's earlier total is settled (see
// checkRevision), and reads the meter's summary first where Stripe may
// have forgotten the identifier (see identifierMayBeForgotten). A usage
// report is identified at Stripe by its identifier whatever the
// credential, so a key that went with another one needs no lookup.
func (u *usageReport) ready(ctx context.Context, b *Biller, j *job, c claim.Claim) (Receipt, bool, error) {
	if err := b.checkRevision(ctx, *j, u); err != nil {
		b.giveUp(context.WithoutCancel(ctx), *j, err)
		return Receipt{}, true, err
	}
	if b.identifierMayBeForgotten(u) {
		r, err := b.reconcileUsage(ctx, *j, c, u)
		return r, true, err
	}
	j.neverSent = !j.won && c.Unsent
	return Receipt{}, false, nil
}

func (u *usageReport) send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.sendOnce(ctx, u, j, c)
}

// failed: Stripe rejected the report; the window is reported again only
// with the next Attempt.
func (*usageReport) failed(_ context.Context, _ *Biller, _ job, c claim.Claim) (Receipt, error) {
	return Receipt{}, failedFrom(c)
}

func (u *usageReport) lookup(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.reconcileUsage(ctx, j, c, u)
}

// findOwn finds nothing: Stripe has no lookup of one meter event, and
// the meter's summary is read only past the identifier's window, when
// nothing else can land for it.
func (*usageReport) findOwn(context.Context, *Biller, job) (object, bool) { return object{}, false }

// refused: an identifier taken by an event this claim never sent (another
// claim table, or one restored from an old backup) needs a person. The
// claim records that reason, so that a resume knows it still never sent
// its key, and answers the same.
func (*usageReport) refused(ctx context.Context, b *Biller, j job, err error) (Receipt, bool, error) {
	if !duplicateIdentifier(err) {
		return Receipt{}, false, nil
	}
	if rerr := b.claims.ReleaseUnsent(context.WithoutCancel(ctx), j.key.String(), j.owner, identifierTakenReason); rerr != nil {
		b.log.LogAttrs(ctx, slogWarn, "billonce: could not release claim; it is resumed once its lease expires", attrs(j, "error", rerr)...)
	}
	b.log.LogAttrs(ctx, slogWarn, "billonce: usage report needs reconciliation: its identifier is taken", attrs(j)...)
	return Receipt{}, true, chargeErr(j, ErrNeedsReconciliation, identifierTakenReason, err)
}
