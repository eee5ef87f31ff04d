package billingotel_test

import (
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"time"

	"github.com/stripe/stripe-go/v79"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingotel"
)

// Wire an Observer to the stdout exporters. A program sets
// billing.Config.Observe to obs.Observe and lets the Biller report; here
// the events of one charge are handed over directly (a first call that
// Stripe answered 500, a second that made the charge, and its outcome),
// and timestamps and ids are fixed so that the output is the same on
// every run.
func Example() {
	ctx := context.Background()
	spans, _ := stdouttrace.New(stdouttrace.WithWriter(os.Stdout), stdouttrace.WithoutTimestamps())
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans), sdktrace.WithResource(resource.Empty()),
		sdktrace.WithIDGenerator(&fixedIDs{}))
	metrics, _ := stdoutmetric.New(stdoutmetric.WithWriter(os.Stdout), stdoutmetric.WithoutTimestamps())
	// The view keeps one attribute on the latency histogram, the kind of
	// write: a way to trade detail for fewer series.
	latency := sdkmetric.NewView(sdkmetric.Instrument{Name: "billonce.stripe.call.duration"},
		sdkmetric.Stream{AttributeFilter: attribute.NewAllowKeysFilter("billonce.object")})
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metrics)),
		sdkmetric.WithResource(resource.Empty()), sdkmetric.WithView(latency))

	obs, err := billingotel.New(billingotel.Config{MeterProvider: mp, TracerProvider: tp})
	if err != nil {
		fmt.Println(err)
		return
	}
	key := "billonce:v1:2026-09:cus_123:1:9f2c"
	obs.Observe(billing.Event{Kind: billing.EventStripeCall, Object: "charge", Customer: "cus_123", Period: "2026-09", Key: key,
		RequestID: "req_1", Attempt: 1, Duration: 250 * time.Millisecond, Err: errStripe500})
	obs.Observe(billing.Event{Kind: billing.EventStripeCall, Object: "charge", Customer: "cus_123", Period: "2026-09", Key: key,
		RequestID: "req_2", Attempt: 2, Duration: 500 * time.Millisecond})
	obs.Observe(billing.Event{Kind: billing.EventOutcome, Object: "charge", Customer: "cus_123", Period: "2026-09", Key: key,
		Duration: time.Second, Outcome: billing.Created})

	_ = mp.Shutdown(ctx) // exports the metrics
	_ = tp.Shutdown(ctx)
	// Output:
	// {"Name":"billonce.write","SpanContext":{"TraceID":"00000000000000000000000000000001","SpanID":"0000000000000001","TraceFlags":"01","TraceState":"","Remote":false},"Parent":{"TraceID":"00000000000000000000000000000000","SpanID":"0000000000000000","TraceFlags":"00","TraceState":"","Remote":false},"SpanKind":1,"StartTime":"0001-01-01T00:00:00Z","EndTime":"0001-01-01T00:00:00Z","Attributes":[{"Key":"billonce.api","Value":{"Type":"STRING","Value":"charges"}},{"Key":"billonce.object","Value":{"Type":"STRING","Value":"charge"}},{"Key":"billonce.customer","Value":{"Type":"STRING","Value":"cus_123"}},{"Key":"billonce.period","Value":{"Type":"STRING","Value":"2026-09"}},{"Key":"billonce.key","Value":{"Type":"STRING","Value":"billonce:v1:2026-09:cus_123:1:9f2c"}},{"Key":"billonce.outcome","Value":{"Type":"STRING","Value":"created"}}],"Events":[{"Name":"billonce.stripe.call","Attributes":[{"Key":"billonce.key","Value":{"Type":"STRING","Value":"billonce:v1:2026-09:cus_123:1:9f2c"}},{"Key":"billonce.http_attempt","Value":{"Type":"INT64","Value":1}},{"Key":"billonce.duration_s","Value":{"Type":"FLOAT64","Value":0.25}},{"Key":"http.response.status_code","Value":{"Type":"INT64","Value":500}},{"Key":"billonce.request_id","Value":{"Type":"STRING","Value":"req_1"}},{"Key":"error.type","Value":{"Type":"STRING","Value":"api_error"}}],"DroppedAttributeCount":0,"Time":"0001-01-01T00:00:00Z"},{"Name":"billonce.stripe.call","Attributes":[{"Key":"billonce.key","Value":{"Type":"STRING","Value":"billonce:v1:2026-09:cus_123:1:9f2c"}},{"Key":"billonce.http_attempt","Value":{"Type":"INT64","Value":2}},{"Key":"billonce.duration_s","Value":{"Type":"FLOAT64","Value":0.5}},{"Key":"billonce.request_id","Value":{"Type":"STRING","Value":"req_2"}}],"DroppedAttributeCount":0,"Time":"0001-01-01T00:00:00Z"}],"Links":null,"Status":{"Code":"Unset","Description":""},"DroppedAttributes":0,"DroppedEvents":0,"DroppedLinks":0,"ChildSpanCount":0,"Resource":null,"InstrumentationScope":{"Name":"github.com/billonce/billonce/billing/billingotel","Version":"","SchemaURL":"","Attributes":null},"InstrumentationLibrary":{"Name":"github.com/billonce/billonce/billing/billingotel","Version":"","SchemaURL":"","Attributes":null}}
	// {"Resource":null,"ScopeMetrics":[{"Scope":{"Name":"github.com/billonce/billonce/billing/billingotel","Version":"","SchemaURL":"","Attributes":null},"Metrics":[{"Name":"billonce.writes","Description":"Writes finished (charges, invoices, usage reports, refunds, transfers, payouts), by object, outcome and error kind.","Unit":"{write}","Data":{"DataPoints":[{"Attributes":[{"Key":"billonce.api","Value":{"Type":"STRING","Value":"charges"}},{"Key":"billonce.object","Value":{"Type":"STRING","Value":"charge"}},{"Key":"billonce.outcome","Value":{"Type":"STRING","Value":"created"}}],"StartTime":"0001-01-01T00:00:00Z","Time":"0001-01-01T00:00:00Z","Value":1}],"Temporality":"CumulativeTemporality","IsMonotonic":true}},{"Name":"billonce.stripe.call.duration","Description":"Duration of the HTTP calls of writes to Stripe, by object.","Unit":"s","Data":{"DataPoints":[{"Attributes":[{"Key":"billonce.object","Value":{"Type":"STRING","Value":"charge"}}],"StartTime":"0001-01-01T00:00:00Z","Time":"0001-01-01T00:00:00Z","Count":2,"Bounds":[0.005,0.01,0.025,0.05,0.075,0.1,0.25,0.5,0.75,1,2.5,5,7.5,10,30],"BucketCounts":[0,0,0,0,0,0,1,1,0,0,0,0,0,0,0,0],"Min":0.25,"Max":0.5,"Sum":0.75}],"Temporality":"CumulativeTemporality"}},{"Name":"billonce.stripe.retries","Description":"HTTP calls to Stripe that retried an earlier one with the same key.","Unit":"{call}","Data":{"DataPoints":[{"Attributes":[{"Key":"billonce.api","Value":{"Type":"STRING","Value":"charges"}},{"Key":"billonce.object","Value":{"Type":"STRING","Value":"charge"}}],"StartTime":"0001-01-01T00:00:00Z","Time":"0001-01-01T00:00:00Z","Value":1}],"Temporality":"CumulativeTemporality","IsMonotonic":true}}]}]}
}

// errStripe500 is the error of a call that Stripe answered 500.
var errStripe500 = &stripe.Error{HTTPStatusCode: 500, Type: stripe.ErrorTypeAPI, RequestID: "req_1", Msg: "An unknown error occurred"}

// fixedIDs numbers traces and spans from 1.
type fixedIDs struct{ n uint64 }

func (g *fixedIDs) NewIDs(context.Context) (trace.TraceID, trace.SpanID) {
	g.n++
	var t trace.TraceID
	binary.BigEndian.PutUint64(t[8:], g.n)
	return t, g.newSpanID()
}

func (g *fixedIDs) NewSpanID(context.Context, trace.TraceID) trace.SpanID {
	g.n++
	return g.newSpanID()
}

func (g *fixedIDs) newSpanID() trace.SpanID {
	var s trace.SpanID
	binary.BigEndian.PutUint64(s[:], g.n)
	return s
}
