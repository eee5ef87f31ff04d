package billingotel

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/stripe/stripe-go/v79"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
)

// ScopeName is the instrumentation scope of the meter and the tracer.
const ScopeName = "github.com/billonce/billonce/billing/billingotel"

// maxPending bounds the writes whose Stripe calls are kept until their
// outcome; maxCalls bounds the calls kept per write.
const (
	maxPending = 10_000
	maxCalls   = 64
)

// Config configures an [Observer]. The zero Config uses the global
// providers.
type Config struct {
	// MeterProvider makes the meter. Defaults to otel.GetMeterProvider().
	MeterProvider metric.MeterProvider
	// TracerProvider makes the tracer. Defaults to
	// otel.GetTracerProvider().
	TracerProvider trace.TracerProvider
	// API is the Biller's billing.Config.API, recorded as billonce.api on
	// every write metric and span (a billing.Event does not carry it).
	// Defaults to billing.Charges.
	API billing.API
	// Next, when set, is called with every event after the Observer has
	// recorded it: the Observe function you had before.
	Next func(billing.Event)
}

// Observer turns the events of a Biller into metrics and spans. Put its
// Observe method in billing.Config.Observe. It is safe for concurrent use.
type Observer struct {
	tracer trace.Tracer
	api    attribute.KeyValue
	next   func(billing.Event)

	writes       metric.Int64Counter
	callDuration metric.Float64Histogram
	retries      metric.Int64Counter
	updates      metric.Int64Counter
	webhook      metric.Int64Counter
	runs         metric.Int64Counter
	runDuration  metric.Float64Histogram
	runCustomers metric.Int64Counter
	proxy        metric.Int64Counter

	mu      sync.Mutex
	pending map[string]*write // by idempotency key
}

// write is what is known of a claim's write (a charge, a refund, a
// payout, …) between its first Stripe call and its outcome.
type write struct {
	customer, period string
	object           string // billing.Event.Object
	start            time.Time
	calls            []call
	dropped          int
}

type call struct {
	start time.Time
	e     billing.Event
}

// New returns an Observer that records to cfg's providers. It fails only
// when an instrument cannot be created.
func New(cfg Config) (*Observer, error) {
	mp, tp := cfg.MeterProvider, cfg.TracerProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	m := mp.Meter(ScopeName)
	o := &Observer{
		tracer:  tp.Tracer(ScopeName),
		api:     attribute.String("billonce.api", apiName(cfg.API)),
		next:    cfg.Next,
		pending: make(map[string]*write),
	}
	var errs [9]error
	o.writes, errs[0] = m.Int64Counter("billonce.writes", metric.WithUnit("{write}"),
		metric.WithDescription("Writes finished (charges, invoices, usage reports, refunds, transfers, payouts), by object, outcome and error kind."))
	o.callDuration, errs[1] = m.Float64Histogram("billonce.stripe.call.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 30),
		metric.WithDescription("Duration of the HTTP calls of writes to Stripe, by object."))
	o.retries, errs[2] = m.Int64Counter("billonce.stripe.retries", metric.WithUnit("{call}"),
		metric.WithDescription("HTTP calls to Stripe that retried an earlier one with the same key."))
	o.updates, errs[3] = m.Int64Counter("billonce.payment.updates", metric.WithUnit("{update}"),
		metric.WithDescription("Payments settled, refunded or disputed, learned from a webhook or Reconcile."))
	o.webhook, errs[4] = m.Int64Counter("billonce.webhook.events", metric.WithUnit("{event}"),
		metric.WithDescription("Webhook deliveries answered, by result."))
	o.runs, errs[5] = m.Int64Counter("billonce.runs", metric.WithUnit("{run}"),
		metric.WithDescription("Billing runs finished, by result."))
	o.runDuration, errs[6] = m.Float64Histogram("billonce.run.duration", metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(1, 10, 30, 60, 300, 600, 1800, 3600, 7200, 14400, 43200),
		metric.WithDescription("Duration of billing runs."))
	o.runCustomers, errs[7] = m.Int64Counter("billonce.run.customers", metric.WithUnit("{customer}"),
		metric.WithDescription("Customers settled by billing runs, by outcome."))
	o.proxy, errs[8] = m.Int64Counter("billonce.proxy.requests", metric.WithUnit("{request}"),
		metric.WithDescription("Requests to a spend-cap proxy, admitted or by refusal."))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("billingotel: %w", err)
	}
	return o, nil
}

// Observe records one event; use it as billing.Config.Observe. It then
// calls Config.Next, if set.
func (o *Observer) Observe(e billing.Event) {
	now := time.Now()
	ctx := context.Background()
	switch e.Kind {
	case billing.EventStripeCall:
		o.stripeCall(ctx, now, e)
	case billing.EventOutcome:
		o.outcome(ctx, now, e)
	case billing.EventSettled:
		o.updates.Add(ctx, 1, metric.WithAttributes(withObject(e, attribute.String("billonce.update", "settled"), attribute.String("billonce.state", e.State))...))
	case billing.EventRefunded:
		o.updates.Add(ctx, 1, metric.WithAttributes(withObject(e, attribute.String("billonce.update", "refunded"))...))
	case billing.EventDisputed:
		o.updates.Add(ctx, 1, metric.WithAttributes(withObject(e, attribute.String("billonce.update", "disputed"))...))
	case billing.EventWebhook:
		o.webhook.Add(ctx, 1, metric.WithAttributes(attribute.String("billonce.result", e.Result)))
	case billing.EventRun:
		o.run(ctx, now, e)
	}
	if o.next != nil {
		o.next(e)
	}
}

func (o *Observer) stripeCall(ctx context.Context, now time.Time, e billing.Event) {
	attrs := withObject(e, o.api)
	if e.Err != nil {
		attrs = append(attrs, attribute.String("error.type", callErrorType(e.Err)))
	}
	if s := httpStatus(e.Err); s != 0 {
		attrs = append(attrs, attribute.Int("http.response.status_code", s))
	}
	o.callDuration.Record(ctx, e.Duration.Seconds(), metric.WithAttributes(attrs...))
	if e.Attempt > 1 {
		o.retries.Add(ctx, 1, metric.WithAttributes(withObject(e, o.api)...))
	}
	if e.Key == "" {
		return
	}
	start := now.Add(-e.Duration)
	var evictedKey string
	var evicted *write
	o.mu.Lock()
	c := o.pending[e.Key]
	if c == nil {
		if len(o.pending) >= maxPending {
			evictedKey, evicted = o.oldest()
			delete(o.pending, evictedKey)
		}
		c = &write{customer: e.Customer, period: e.Period, object: e.Object, start: start}
		o.pending[e.Key] = c
	}
	if len(c.calls) < maxCalls {
		c.calls = append(c.calls, call{start: start, e: e})
	} else {
		c.dropped++
	}
	o.mu.Unlock()
	if evicted != nil {
		o.span(evictedKey, evicted, evicted.start, now, nil, errNoOutcome)
	}
}

// oldest returns the write waiting longest for its outcome. o.mu is
// held and o.pending is not empty.
func (o *Observer) oldest() (string, *write) {
	var key string
	var oldest *write
	for k, c := range o.pending {
		if oldest == nil || c.start.Before(oldest.start) {
			key, oldest = k, c
		}
	}
	return key, oldest
}

// errNoOutcome is the status of a span ended without its outcome.
var errNoOutcome = errors.New("billingotel: no outcome reported for this write")

func (o *Observer) outcome(ctx context.Context, now time.Time, e billing.Event) {
	attrs := withObject(e, o.api, attribute.String("billonce.outcome", outcomeWord(e)))
	if e.Err != nil {
		attrs = append(attrs, attribute.String("error.type", billing.ErrorKind(e.Err)))
	}
	o.writes.Add(ctx, 1, metric.WithAttributes(attrs...))

	start := now.Add(-e.Duration)
	var c *write
	// ErrInProgress is another caller's write of the same key: its
	// calls are not this outcome's.
	if e.Key != "" && !errors.Is(e.Err, billing.ErrInProgress) {
		o.mu.Lock()
		c = o.pending[e.Key]
		delete(o.pending, e.Key)
		o.mu.Unlock()
	}
	if c == nil {
		c = &write{customer: e.Customer, period: e.Period, start: start}
	} else if start.Before(c.start) {
		c.start = start
	}
	if e.Object != "" {
		c.object = e.Object
	}
	o.span(e.Key, c, c.start, now, &e, e.Err)
}

// span records one write's span, from start to end, with an event per
// Stripe call. out is the outcome event, nil for a span ended without
// one.
func (o *Observer) span(key string, c *write, start, end time.Time, out *billing.Event, err error) {
	attrs := []attribute.KeyValue{o.api}
	if c.object != "" {
		attrs = append(attrs, attribute.String("billonce.object", c.object))
	}
	attrs = append(attrs, attribute.String("billonce.customer", c.customer), attribute.String("billonce.period", c.period))
	if key != "" {
		attrs = append(attrs, attribute.String("billonce.key", key))
	}
	if out != nil {
		attrs = append(attrs, attribute.String("billonce.outcome", outcomeWord(*out)))
		if out.RequestID != "" {
			attrs = append(attrs, attribute.String("billonce.request_id", out.RequestID))
		}
		var ce *billing.ChargeError
		if errors.As(err, &ce) && ce.Attempt > 0 {
			attrs = append(attrs, attribute.Int("billonce.attempt", ce.Attempt))
		}
	}
	if c.dropped > 0 {
		attrs = append(attrs, attribute.Int("billonce.calls_dropped", c.dropped))
	}
	_, sp := o.tracer.Start(context.Background(), "billonce.write", trace.WithTimestamp(start),
		trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	for _, cl := range c.calls {
		ea := []attribute.KeyValue{attribute.String("billonce.key", cl.e.Key),
			attribute.Int("billonce.http_attempt", cl.e.Attempt),
			attribute.Float64("billonce.duration_s", cl.e.Duration.Seconds())}
		if s := httpStatus(cl.e.Err); s != 0 {
			ea = append(ea, attribute.Int("http.response.status_code", s))
		}
		if cl.e.RequestID != "" {
			ea = append(ea, attribute.String("billonce.request_id", cl.e.RequestID))
		}
		if cl.e.Err != nil {
			ea = append(ea, attribute.String("error.type", callErrorType(cl.e.Err)))
		}
		sp.AddEvent("billonce.stripe.call", trace.WithTimestamp(cl.start), trace.WithAttributes(ea...))
	}
	switch {
	case errors.Is(err, errNoOutcome):
		sp.SetStatus(codes.Error, err.Error())
	case err != nil:
		sp.SetAttributes(attribute.String("error.type", billing.ErrorKind(err)))
		sp.SetStatus(codes.Error, err.Error())
	}
	sp.End(trace.WithTimestamp(end))
}

// run records a finished [billing.Biller.Run] (an EventRun): its result
// ("complete", "incomplete", or "stopped" when it returned an error), its
// duration and its customers by outcome. It also ends, as spans without
// an outcome, the spans of the run's period still waiting for one (a Run
// reports every outcome before it returns).
func (o *Observer) run(ctx context.Context, now time.Time, e billing.Event) {
	var s billing.Summary
	if e.Summary != nil {
		s = *e.Summary
	}
	result := "complete"
	switch {
	case e.Err != nil:
		result = "stopped"
	case !s.Complete():
		result = "incomplete"
	}
	attrs := metric.WithAttributes(o.api, attribute.String("billonce.result", result))
	o.runs.Add(ctx, 1, attrs)
	o.runDuration.Record(ctx, e.Duration.Seconds(), attrs)
	for _, n := range []struct {
		outcome string
		n       int
	}{
		{"created", s.Created}, {"already_billed", s.AlreadyBilled}, {"declined", s.Declined},
		{"processing", s.Processing}, {"declined_after_processing", s.DeclinedAfterProcessing},
		{"pending", s.Pending}, {"invalid", s.Invalid},
	} {
		if n.n > 0 {
			o.runCustomers.Add(ctx, int64(n.n), metric.WithAttributes(o.api, attribute.String("billonce.outcome", n.outcome)))
		}
	}
	left := make(map[string]*write)
	o.mu.Lock()
	for k, c := range o.pending {
		if c.period == e.Period {
			delete(o.pending, k)
			left[k] = c
		}
	}
	o.mu.Unlock()
	for k, c := range left {
		o.span(k, c, c.start, now, nil, errNoOutcome)
	}
}

// ObserveProxy counts one request to a spend-cap proxy in
// billonce.proxy.requests: "admitted" (forwarded to Stripe and its
// answer passed back), or the word of its refusal (Entry.Refused: "cap",
// "endpoint", "revoked", …). Put it in spendcap.ProxyConfig.Observe.
// Config.Next is not called: an Entry is not a billing.Event.
func (o *Observer) ObserveProxy(e spendcap.Entry) {
	result := e.Refused
	if result == "" {
		result = "admitted"
	}
	o.proxy.Add(context.Background(), 1, metric.WithAttributes(attribute.String("billonce.result", result)))
}

// withObject is attrs with billonce.object, the kind of write e is about
// (billing.Event.Object, one of eight words), when e names one.
func withObject(e billing.Event, attrs ...attribute.KeyValue) []attribute.KeyValue {
	if e.Object == "" {
		return attrs
	}
	return append(attrs, attribute.String("billonce.object", e.Object))
}

// outcomeWord is an outcome as an attribute value: "created",
// "replayed", "already_billed", "reconciled", or "not_billed" for an
// outcome with an error.
func outcomeWord(e billing.Event) string {
	if e.Err != nil {
		return "not_billed"
	}
	return strings.ReplaceAll(e.Outcome.String(), " ", "_")
}

// callErrorType names the failure of one HTTP call: Stripe's error type
// when Stripe (or whatever answered) gave an error answer
// ("api_error", "card_error", "idempotency_error",
// "invalid_request_error"; "http_error" for an answer naming none of
// them, so that whatever answered cannot add series of its own words), a
// kind of billing's, or "transport" when no answer came.
func callErrorType(err error) string {
	var se *stripe.Error
	if errors.As(err, &se) && se.HTTPStatusCode != 0 {
		switch se.Type {
		case stripe.ErrorTypeAPI, stripe.ErrorTypeCard, stripe.ErrorTypeIdempotency, stripe.ErrorTypeInvalidRequest:
			return string(se.Type)
		}
		return "http_error"
	}
	if k := billing.ErrorKind(err); k != "other" {
		return k
	}
	return "transport"
}

// httpStatus is the HTTP status of Stripe's error answer in err, or 0.
// An event does not carry the status of a successful call.
func httpStatus(err error) int {
	var se *stripe.Error
	if errors.As(err, &se) {
		return se.HTTPStatusCode
	}
	return 0
}

// apiName is the billonce.api attribute: the zero API is Charges.
func apiName(api billing.API) string {
	if api == "" {
		return string(billing.Charges)
	}
	return string(api)
}
