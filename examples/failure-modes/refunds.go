package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/google/uuid"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/payout"
	"github.com/stripe/stripe-go/v79/refund"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// The refund rows charge the customer once, then refund part of it; the
// fake counts the refunds of the customer's payments that did not fail.
const refundAmount = 500

var postRefunds = billingtest.Match{Method: http.MethodPost, Path: "/v1/refunds"}

func countRefunds(fake *billingtest.Server, customer string) int {
	n := 0
	for _, m := range fake.Movements("refund") {
		if m.Customer == customer && m.Status != "failed" && m.Status != "canceled" {
			n++
		}
	}
	return n
}

func refundScenarios() []scenario {
	return []scenario{
		{
			id:        "refund-fresh-key",
			name:      "refund retried by a second click with a fresh key; answer lost",
			customers: []string{"cus_refund_click"},
			naive:     naiveRefundFreshKey,
			billonce:  billonceRefundFreshKey,
			count:     countRefunds,
		},
		{
			id:        "refund-amount-key",
			name:      "refund keyed by (payment, amount): two refunds of 5.00 merge",
			customers: []string{"cus_refund_merge"},
			want:      2,
			naive:     naiveRefundAmountKey,
			billonce:  billonceRefundAmountKey,
			count:     countRefunds,
		},
		{
			id:        "payout-25h",
			name:      "payout swept again after an unknown outcome, 25 hours later",
			customers: []string{"the account"},
			naive:     naivePayoutSweep,
			billonce:  billoncePayoutSweep,
			count:     countPayouts,
		},
	}
}

// refundClient is a plain stripe-go refunds client on the fake.
func (e *env) refundClient() *refund.Client {
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.stripe.URL),
		HTTPClient:        &http.Client{Transport: newTransport(), Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quiet{},
	})
	return &refund.Client{B: b, Key: secretKey}
}

// naivePaid charges customer once with the unsafe side's plain client and
// returns the charge: the payment the unsafe code refunds.
func naivePaid(ctx context.Context, e *env, customer string) (string, error) {
	ch, err := e.stripeClient(nil).New(chargeParams(ctx, customer, "charge-"+customer))
	if err != nil {
		return "", err
	}
	return ch.ID, nil
}

// ---- refund retried with a fresh key ----

// naiveRefundFreshKey refunds on an operator's click, with a key made per
// request, as an SDK does by default. Stripe refunds, the answer is lost,
// the screen shows an error, and the operator clicks again.
func naiveRefundFreshKey(ctx context.Context, e *env) error {
	pay, err := naivePaid(ctx, e, "cus_refund_click")
	if err != nil {
		return err
	}
	e.stripe.FailNext(postRefunds, billingtest.Fault{Kind: billingtest.FaultCut})
	click := func() error {
		p := &stripe.RefundParams{Charge: stripe.String(pay), Amount: stripe.Int64(refundAmount)}
		p.Context, p.IdempotencyKey = ctx, stripe.String(uuid.NewString())
		_, err := e.refundClient().New(p)
		return err
	}
	err = click()
	e.logf("unsafe code: refund click 1: err=%v", err)
	if err != nil {
		err = click()
		e.logf("unsafe code: refund click 2: err=%v", err)
	}
	return nil
}

func billonceRefundFreshKey(ctx context.Context, e *env) error {
	b, err := e.biller(ctx, "billing-0", nil)
	if err != nil {
		return err
	}
	if _, err := b.Charge(ctx, "cus_refund_click", period, nil); err != nil {
		return err
	}
	e.stripe.FailNext(postRefunds, billingtest.Fault{Kind: billingtest.FaultCut})
	for click := 1; click <= 2; click++ {
		r, err := b.Refund(ctx, "cus_refund_click", period, "rma-1001", refundAmount)
		e.logf("billonce: Refund(rma-1001) click %d: %s %s, err=%v", click, r.Outcome, r.StripeID, err)
	}
	return nil
}

// ---- refund keyed by payment and amount ----

// naiveRefundAmountKey keys each refund by its payment and amount, so that
// a retry of one refund is replayed. The customer returns two items of
// 5.00, one after the other: the second refund carries the first one's
// key and parameters, and Stripe replays the first.
func naiveRefundAmountKey(ctx context.Context, e *env) error {
	pay, err := naivePaid(ctx, e, "cus_refund_merge")
	if err != nil {
		return err
	}
	for _, rma := range []string{"rma-2001", "rma-2002"} {
		sum := sha256.Sum256([]byte(pay + "/" + strconv.Itoa(refundAmount)))
		p := &stripe.RefundParams{Charge: stripe.String(pay), Amount: stripe.Int64(refundAmount)}
		p.Context, p.IdempotencyKey = ctx, stripe.String(hex.EncodeToString(sum[:]))
		re, err := e.refundClient().New(p)
		if err != nil {
			return fmt.Errorf("refund %s: %w", rma, err)
		}
		e.logf("unsafe code: refund %s: %s", rma, re.ID)
	}
	return nil
}

func billonceRefundAmountKey(ctx context.Context, e *env) error {
	b, err := e.biller(ctx, "billing-0", nil)
	if err != nil {
		return err
	}
	if _, err := b.Charge(ctx, "cus_refund_merge", period, nil); err != nil {
		return err
	}
	for _, rma := range []string{"rma-2001", "rma-2002"} {
		r, err := b.Refund(ctx, "cus_refund_merge", period, rma, refundAmount)
		e.logf("billonce: Refund(%s): %s %s, err=%v", rma, r.Outcome, r.StripeID, err)
	}
	return nil
}

// ---- payout swept again past 24 hours ----

// payoutAccount makes the connected account the payout rows pay out of,
// with a balance of two payouts, and returns its id.
func payoutAccount(e *env) string {
	acct := e.stripe.CreateAccount()
	e.stripe.SetBalance(acct, currency, 2*payoutAmount)
	return acct
}

const payoutAmount = 9000

var postPayouts = billingtest.Match{Method: http.MethodPost, Path: "/v1/payouts"}

func countPayouts(fake *billingtest.Server, account string) int {
	n := 0
	for _, m := range fake.Movements("payout") {
		if m.Status != "failed" && m.Status != "canceled" {
			n++
		}
	}
	return n
}

// naivePayoutSweep pays each account out once a day with a stable key per
// account and period. The first night Stripe makes the payout and the
// answer is lost, then Stripe fails; the sweep marks the payout failed and
// releases it. The next night's sweep sends the same key, which Stripe has
// forgotten: a second payout.
func naivePayoutSweep(ctx context.Context, e *env) error {
	acct := payoutAccount(e)
	e.stripe.FailNext(postPayouts, billingtest.Fault{Kind: billingtest.FaultCut}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.stripe.URL),
		HTTPClient:        &http.Client{Transport: newTransport(), Timeout: 30 * time.Second},
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quiet{},
	})
	payouts := payout.Client{B: b, Key: secretKey}
	key := "payout-" + acct + "-" + period // stable, and reused the next night
	pay := func() error {
		p := &stripe.PayoutParams{Amount: stripe.Int64(payoutAmount), Currency: stripe.String(currency)}
		p.Context, p.IdempotencyKey = ctx, stripe.String(key)
		p.SetStripeAccount(acct)
		_, err := payouts.New(p)
		return err
	}
	for attempt := 1; attempt <= 2; attempt++ {
		e.logf("unsafe code: night 1, attempt %d: %v", attempt, pay())
	}
	e.stripe.Advance(day)
	e.logf("unsafe code: night 2, same key: %v", pay())
	return nil
}

func billoncePayoutSweep(ctx context.Context, e *env) error {
	acct := payoutAccount(e)
	e.stripe.FailNext(postPayouts, billingtest.Fault{Kind: billingtest.FaultCut}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	// The listing before the send passes; the one after the unknown
	// outcome fails too.
	e.stripe.FailNext(billingtest.Match{Method: http.MethodGet, Path: "/v1/payouts"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	b, err := e.biller(ctx, "sweep-night-1", func(c *billing.Config, _ *claim.Config) { c.Retry.MaxAttempts = 2 })
	if err != nil {
		return err
	}
	p := billing.Price{Amount: payoutAmount, Currency: currency}
	_, err = b.Payout(ctx, acct, period, p, nil)
	e.logf("billonce: night 1: %v", err)
	e.stripe.Advance(day)
	if _, err := e.pool.Exec(ctx, "UPDATE "+e.schema+"."+claim.DefaultTable+" SET created_at = created_at - make_interval(secs => $1), first_sent_at = first_sent_at - make_interval(secs => $1)", day.Seconds()); err != nil {
		return err
	}
	if b, err = e.biller(ctx, "sweep-night-2", nil); err != nil {
		return err
	}
	r, err := b.Payout(ctx, acct, period, p, nil)
	e.logf("billonce: night 2: %s %s, err=%v", r.Outcome, r.StripeID, err)
	return nil
}
