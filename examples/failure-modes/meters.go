package main

import (
	"context"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meterevent"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// The usage rows report one hour of API calls on a summing meter; the fake
// counts the meter events it accepted for the customer.
const meterName = "api_calls"

var postMeterEvents = billingtest.Match{Method: http.MethodPost, Path: "/v1/billing/meter_events"}

func countEvents(fake *billingtest.Server, customer string) int {
	return fake.MeterEvents(meterName, customer)
}

// usageHour is the last whole hour, the window every usage row reports.
func usageHour() (time.Time, time.Time) {
	start := time.Now().UTC().Truncate(time.Hour).Add(-time.Hour)
	return start, start.Add(time.Hour)
}

func meterScenarios() []scenario {
	return []scenario{
		{
			id:        "usage-crash",
			name:      "usage marked reported after the call; crash replays the hour",
			customers: []string{"cus_usage_crash"},
			naive:     naiveUsageCrash,
			billonce:  billonceUsageCrash,
			count:     countEvents,
		},
		{
			id:        "usage-duplicate",
			name:      "duplicate-identifier 400 treated as a failure",
			customers: []string{"cus_usage_dup"},
			naive:     naiveUsageDuplicate,
			billonce:  billonceUsageDuplicate,
			count:     countEvents,
		},
	}
}

// meterClient is a plain stripe-go meter events client on the fake.
func (e *env) meterClient() *meterevent.Client {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.stripe.URL),
		HTTPClient:        &http.Client{Transport: newTransport(), Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quiet{},
	})
	return &meterevent.Client{B: b, Key: secretKey}
}

func meterParams(ctx context.Context, customer, identifier, key string) *stripe.BillingMeterEventParams {
	start, _ := usageHour()
	p := &stripe.BillingMeterEventParams{
		EventName: stripe.String(meterName),
		Payload:   map[string]string{"stripe_customer_id": customer, "value": strconv.Itoa(1200)},
		Timestamp: stripe.Int64(start.Unix()),
	}
	if identifier != "" {
		p.Identifier = stripe.String(identifier)
	}
	p.Context, p.IdempotencyKey = ctx, stripe.String(key)
	return p
}

func usageOf(customer string) billing.Usage {
	start, end := usageHour()
	return billing.Usage{Customer: customer, Meter: meterName, Kind: billing.Increments, Start: start, End: end, Value: 1200}
}

// ---- usage: the mark is written after the call ----

// naiveUsageCrash is a reporter that sends no identifier and marks the
// hour reported after Stripe answers: it dies before the mark, and the
// restart reports the hour again.
func naiveUsageCrash(ctx context.Context, e *env) error {
	e.stripe.CreateMeter(meterName, "sum", "")
	if err := e.billedTable(ctx); err != nil {
		return err
	}
	report := func(crash bool) error {
		billed, err := e.alreadyBilled(ctx, e.pool, "cus_usage_crash")
		if err != nil || billed {
			return err
		}
		ev, err := e.meterClient().New(meterParams(ctx, "cus_usage_crash", "", uuid.NewString()))
		if err != nil || crash {
			e.logf("unsafe: reported, then died before marking the hour: %v", err)
			return nil
		}
		return e.markBilled(ctx, e.pool, "cus_usage_crash", ev.Identifier)
	}
	if err := report(true); err != nil {
		return err
	}
	e.logf("unsafe: restart finds the hour unmarked and reports it again")
	return report(false)
}

func billonceUsageCrash(ctx context.Context, e *env) error {
	e.stripe.CreateMeter(meterName, "sum", "")
	tune := func(c *billing.Config, cc *claim.Config) { cc.Lease = time.Second; c.Retry.MaxAttempts = 1 }
	b, err := e.biller(ctx, "usage-0", tune)
	if err != nil {
		return err
	}
	// The event is committed and the answer lost: as far as this process
	// knows, it died.
	e.stripe.FailNext(postMeterEvents, billingtest.Fault{Kind: billingtest.FaultCut})
	_, err = b.ReportUsage(ctx, usageOf("cus_usage_crash"))
	e.logf("billonce: first reporter lost the answer: %v", err)
	if b, err = e.biller(ctx, "usage-0-restarted", tune); err != nil {
		return err
	}
	r, err := b.ReportUsage(ctx, usageOf("cus_usage_crash"))
	e.logf("billonce: restart resumed the claim with its identifier: %s, err=%v", r.Outcome, err)
	return nil
}

// ---- usage: the duplicate-identifier answer ----

// naiveUsageDuplicate sends a stable identifier, but a fresh idempotency
// key per attempt. The answer of the first attempt is lost; the retry gets
// Stripe's 400 "An event already exists with identifier …", which the
// reporter takes for a failure: it retries (every 30 s, for ever, in the
// public reports), or, as here, gives up on the identifier and reports the
// hour under a new one.
func naiveUsageDuplicate(ctx context.Context, e *env) error {
	e.stripe.CreateMeter(meterName, "sum", "")
	id := "usage-cus_usage_dup-" + time.Now().UTC().Truncate(time.Hour).Format("2006010215")
	e.stripe.FailNext(postMeterEvents, billingtest.Fault{Kind: billingtest.FaultCut})
	events := e.meterClient()
	for attempt := 1; attempt <= 4; attempt++ {
		ident := id
		if attempt == 4 {
			ident = id + "-retry" // give up on the identifier
		}
		_, err := events.New(meterParams(ctx, "cus_usage_dup", ident, uuid.NewString()))
		e.logf("unsafe: attempt %d with identifier %s: %v", attempt, ident, err)
	}
	return nil
}

// billonceUsageDuplicate meets the same lost answer, then resends with a
// key Stripe has not seen: the duplicate-identifier answer is read as
// delivered, recorded, and not retried.
func billonceUsageDuplicate(ctx context.Context, e *env) error {
	e.stripe.CreateMeter(meterName, "sum", "")
	b, err := e.biller(ctx, "usage-0", func(c *billing.Config, _ *claim.Config) { c.Retry.MaxAttempts = 1 })
	if err != nil {
		return err
	}
	e.stripe.FailNext(postMeterEvents, billingtest.Fault{Kind: billingtest.FaultCut})
	_, err = b.ReportUsage(ctx, usageOf("cus_usage_dup"))
	e.logf("billonce: the answer was lost: %v", err)
	// The next reporter sends with a rotated secret key: Stripe keeps
	// idempotency keys per API key, so the key is new to it, and the
	// identifier is not.
	b, err = e.biller(ctx, "usage-1", func(c *billing.Config, _ *claim.Config) { c.SecretKey = secretKey + "_rotated" })
	if err != nil {
		return err
	}
	r, err := b.ReportUsage(ctx, usageOf("cus_usage_dup"))
	e.logf("billonce: Stripe answered the identifier exists: %s, err=%v", r.Outcome, err)
	return nil
}
