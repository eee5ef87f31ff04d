package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/retry"
)

// cmdResolve settles a pending claim that Stripe's search could not
// (billing.ErrNeedsReconciliation: the search failed, or found several
// payments), with the outcome a person verified:
//
//   - -payment pi_… or ch_…: the payment is read from Stripe and must be
//     for the claim's customer, amount and currency, and carry the claim's
//     key in its billonce_key metadata; its state (succeeded, processing,
//     failed) is then recorded on the claim, as a run would record it.
//     A failed one is recorded only when Stripe's search shows no other
//     payment carrying the key that succeeded or is processing.
//   - -payment none: no payment exists for the key, and Stripe's search
//     finds none carrying it. Accepted only once
//     the key's 24-hour window has passed since it was first sent (Stripe
//     may still hold a request carrying it before then, and the next run
//     settles it itself); the claim's window is then reopened, as
//     reconciliation does after a search that finds nothing, and its
//     lease released, so the next run or reconcile sends the same key
//     again.
//
// It is for payments: an invoice's, a usage report's, a refund's, a
// transfer's or a payout's claim is refused with what to do instead.
//
// It holds the claim's lease while it works, so no runner sends the key
// meanwhile, and refuses anything it cannot verify.
func cmdResolve(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "resolve", "resolve -key K -payment (pi_…|ch_…|none) [flags]")
	var b biller
	b.register(f)
	sr := &stripeReader{biller: &b}
	sr.timeout.register(f, "stripe-timeout", "Stripe: each read of a payment, or a search for those of the key")
	key := f.String("key", "", "the pending claim's idempotency key; required")
	payment := f.String("payment", "", "the payment a person found for the key in Stripe (pi_… or ch_…), or none; required")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := required("key", *key, "payment", *payment); err != nil {
		return err
	}
	if err := sr.timeout.check(); err != nil {
		return err
	}
	if *payment != "none" && !strings.HasPrefix(*payment, "pi_") && !strings.HasPrefix(*payment, "ch_") {
		return usageError("-payment %q: want a PaymentIntent (pi_…) or charge (ch_…) id, or none", *payment)
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	eng := claimengine.Of[claim.Claim](s.store)
	// db bounds each of the command's own statements.
	db := b.bounded
	var c claim.Claim
	err = db(ctx, func(ctx context.Context) (err error) {
		c, err = s.store.Get(ctx, *key)
		return err
	})
	if errors.Is(err, claim.ErrNotFound) {
		return usageError("no claim has the key %s", *key)
	}
	if err != nil {
		return err
	}
	if c.State != claim.StatePending {
		return usageError("the claim is %s (Stripe %s), not pending: there is nothing to resolve", c.State, orUnknown(c.StripeID))
	}
	switch c.Endpoint {
	case endpointInvoices:
		return usageError("the claim is an invoice's (%s), not a payment's: run the same billonce run -invoice again, which finds the invoice at Stripe and resumes it at its next step with the same keys; or void the invoice at Stripe, and the next run (or the invoice.voided event) fails the claim", orUnknown(c.StripeID))
	case endpointMeterEvents:
		return usageError("the claim is a usage report's, not a payment's: run billonce usage with the same row again, which resumes it with its key, or settles it from the meter's summary once the key's window has passed")
	}
	switch k := kindOf(c); k {
	case kindRefund, kindCreditNote, kindTransfer, kindPayout:
		return usageError("the claim is a %s's, not a payment's (Stripe's search does not find %ss): run billonce reconcile, which looks it up by listing them and records what it finds; nothing was recorded",
			strings.ReplaceAll(k, "_", " "), strings.ReplaceAll(k, "_", " "))
	}
	if *payment == "none" && c.SentAge < retry.KeyWindow {
		return usageError("the key was first sent %s ago; \"none\" is accepted only after %s, once Stripe can no longer replay a request that carried it: until then the next run sends the key again and Stripe replays any payment it made",
			c.SentAge.Round(time.Minute), retry.KeyWindow)
	}

	// A payment on a connected account is read there.
	sr.account = c.Account

	// Take the claim's lease, as a runner resuming it would.
	host, _ := os.Hostname()
	owner := fmt.Sprintf("billonce-resolve/%s/%d/%d", host, os.Getpid(), time.Now().UnixNano())
	var res claimengine.Result[claim.Claim]
	err = db(ctx, func(ctx context.Context) (err error) {
		res, err = eng.Claim(ctx, claimengine.Request{Customer: c.Customer, Period: c.Period, Key: c.Key, Amount: c.Amount,
			Currency: c.Currency, Owner: owner, Scope: c.Scope, Attempt: c.Attempt, Endpoint: c.Endpoint, Credential: c.Credential, Account: c.Account})
		return err
	})
	if err != nil {
		return err
	}
	if res.Outcome != claimengine.Resumed {
		return usageError("the claim is %s now (held by %q until %s): run status again, and resolve it once no runner holds it",
			res.Outcome, res.Claim.Owner, res.Claim.LeaseUntil.Local().Format(time.DateTime))
	}
	release := func(cause error) error {
		if rerr := db(context.WithoutCancel(ctx), func(ctx context.Context) error { return eng.Release(ctx, c.Key, owner, "", c.LastError) }); rerr != nil {
			return errors.Join(cause, rerr)
		}
		return cause
	}

	if *payment == "none" {
		// Reopening sends the key again after Stripe forgot it: a new
		// charge if any payment carries it.
		kind := cmp.Or(c.Endpoint, string(billing.Charges))
		found, err := keyPayments(ctx, sr, kind, c.Key)
		if err != nil {
			return release(fmt.Errorf("%w; \"none\" is accepted only once Stripe's search shows no payment carrying the key", err))
		}
		if len(found) > 0 {
			return release(usageError("%s carries the key (%s): resolve the claim with it, not with none; nothing was recorded", found[0].ID, orUnknown(found[0].Status)))
		}
		if err := db(ctx, func(ctx context.Context) error { return eng.Reopen(ctx, c.Key, owner, c.Endpoint, c.Credential) }); err != nil {
			return release(err)
		}
		if err := db(context.WithoutCancel(ctx), func(ctx context.Context) error {
			return eng.Release(ctx, c.Key, owner, "", "resolved: a person verified that no payment exists for the key; the next run sends it again")
		}); err != nil {
			return err
		}
		fmt.Fprintf(a.stdout, "resolved %s: no payment; the key's window is reopened and the next run (or reconcile) sends it again\n", c.Key)
		return nil
	}

	p, err := fetchPayment(ctx, sr, *payment)
	if err != nil {
		return release(err)
	}
	if err := p.matches(c); err != nil {
		return release(usageError("%s is not this claim's payment: %v; nothing was recorded", *payment, err))
	}
	if p.state() == "failed" {
		// Several payments may carry the key (the case resolve exists
		// for): a decline is the claim's outcome only if none of the
		// others moved money, or a re-bill would charge a customer who
		// paid.
		if err := noOtherPaid(ctx, sr, p, c.Key); err != nil {
			return release(err)
		}
	}
	var record func(context.Context) error
	switch p.state() {
	case "succeeded":
		record = func(ctx context.Context) error { return eng.Succeed(ctx, c.Key, p.ID) }
	case "processing":
		record = func(ctx context.Context) error { return eng.Process(ctx, c.Key, p.ID) }
	case "failed":
		record = func(ctx context.Context) error {
			return eng.Fail(ctx, c.Key, p.ID, "failed: "+p.failure()+" (resolved by a person from Stripe "+p.ID+")")
		}
	default:
		return release(usageError("%s has status %q, which is no outcome yet: resolve it once it has succeeded or failed", p.ID, p.Status))
	}
	err = db(ctx, record)
	if err != nil {
		return release(err)
	}
	fmt.Fprintf(a.stdout, "resolved %s: %s %s\n", c.Key, p.ID, p.state())
	return nil
}

// payment is what resolve reads of a charge or a PaymentIntent.
type payment struct {
	ID       string            `json:"id"`
	Object   string            `json:"object"`
	Amount   int64             `json:"amount"`
	Currency string            `json:"currency"`
	Customer string            `json:"customer"`
	Status   string            `json:"status"`
	Metadata map[string]string `json:"metadata"`
	// Charges: why it failed. PaymentIntents: the last payment error.
	FailureCode      string `json:"failure_code"`
	LastPaymentError *struct {
		Code        string `json:"code"`
		DeclineCode string `json:"decline_code"`
	} `json:"last_payment_error"`
}

// matches reports how p differs from c's charge, or nil.
func (p *payment) matches(c claim.Claim) error {
	var diffs []string
	for _, d := range []struct{ what, have, want string }{
		{"customer", p.Customer, c.Customer},
		{"amount", fmt.Sprint(p.Amount), fmt.Sprint(c.Amount)},
		{"currency", p.Currency, c.Currency},
		{"metadata " + billing.MetaKey, p.Metadata[billing.MetaKey], c.Key},
	} {
		if d.have != d.want {
			diffs = append(diffs, fmt.Sprintf("%s is %q, the claim's is %q", d.what, d.have, d.want))
		}
	}
	if diffs != nil {
		return errors.New(strings.Join(diffs, "; "))
	}
	return nil
}

// state is p's status in claim's words, or "" if it has no outcome yet.
func (p *payment) state() string {
	switch {
	case p.Status == "succeeded":
		return "succeeded"
	case p.Object == "charge" && p.Status == "pending", p.Object == "payment_intent" && p.Status == "processing":
		return "processing"
	case p.Object == "charge" && p.Status == "failed", p.Object == "payment_intent" && p.Status == "canceled":
		return "failed"
	}
	return ""
}

func (p *payment) failure() string {
	if p.LastPaymentError != nil && p.LastPaymentError.Code != "" {
		return p.LastPaymentError.Code
	}
	return p.FailureCode
}

// noOtherPaid searches Stripe for the payments (of p's kind) carrying key
// and returns a usage error naming one that succeeded or is processing,
// other than p; an error too when the search fails, since a decline is
// then not shown to be the key's outcome.
func noOtherPaid(ctx context.Context, sr *stripeReader, p *payment, key string) error {
	kind := "charges"
	if p.Object == "payment_intent" {
		kind = "payment_intents"
	}
	found, err := keyPayments(ctx, sr, kind, key)
	if err != nil {
		return fmt.Errorf("%w; a decline is recorded only once Stripe's search shows no other payment of the key succeeded", err)
	}
	for _, o := range found {
		if o.ID != p.ID && o.Metadata[billing.MetaKey] == key && (o.state() == "succeeded" || o.state() == "processing") {
			return usageError("%s carries the key too and is %s: resolve the claim with %s, not with the decline %s; nothing was recorded", o.ID, o.state(), o.ID, p.ID)
		}
	}
	return nil
}

// keyPayments returns the payments of kind (charges or payment_intents)
// that Stripe's search finds carrying key.
func keyPayments(ctx context.Context, sr *stripeReader, kind, key string) ([]payment, error) {
	q := url.Values{"query": {fmt.Sprintf("metadata['%s']:'%s'", billing.MetaKey, key)}, "limit": {"100"}}
	body, err := sr.get(ctx, "/v1/"+kind+"/search?"+q.Encode(), "the payments carrying "+key)
	if err != nil {
		return nil, err
	}
	var found struct {
		Data []payment `json:"data"`
	}
	if err := json.Unmarshal(body, &found); err != nil {
		return nil, fmt.Errorf("the answer from Stripe's search for %s is not a list of payments; nothing was recorded", key)
	}
	var out []payment
	for _, o := range found.Data {
		if o.Metadata[billing.MetaKey] == key {
			out = append(out, o)
		}
	}
	return out, nil
}

// fetchPayment reads a charge or PaymentIntent from Stripe, with the key
// of STRIPE_SECRET_KEY, following no redirect.
func fetchPayment(ctx context.Context, sr *stripeReader, id string) (*payment, error) {
	path := "/v1/charges/"
	if strings.HasPrefix(id, "pi_") {
		path = "/v1/payment_intents/"
	}
	body, err := sr.get(ctx, path+url.PathEscape(id), id)
	if err != nil {
		return nil, err
	}
	var p payment
	if err := json.Unmarshal(body, &p); err != nil || p.ID != id || p.Status == "" {
		return nil, fmt.Errorf("the answer from Stripe for %s is not that payment; nothing was recorded", id)
	}
	return &p, nil
}

// stripeReader reads payments from Stripe for resolve, each read within
// -stripe-timeout.
type stripeReader struct {
	*biller
	timeout bound
	// account is the connected account the claim's payment is on, read
	// with the Stripe-Account header; "" for the platform's own.
	account string
}

// get reads path (with its query) from Stripe, with the key of
// STRIPE_SECRET_KEY, following no redirect, and returns the body of a 200
// answer; what names what is read in errors.
func (sr *stripeReader) get(ctx context.Context, path, what string) ([]byte, error) {
	b := sr.biller
	base := b.stripeURL
	if base == "" {
		base = b.a.getenv("STRIPE_URL")
	}
	if base == "" {
		base = billing.DefaultStripeURL
	}
	req, err := http.NewRequest(http.MethodGet, strings.TrimRight(base, "/")+path, nil)
	if err != nil {
		return nil, usageError("the Stripe URL does not parse: want an absolute URL such as https://api.stripe.com")
	}
	req.Header.Set("Authorization", "Bearer "+b.a.getenv("STRIPE_SECRET_KEY"))
	if sr.account != "" {
		req.Header.Set("Stripe-Account", sr.account)
	}
	hc := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	var body []byte
	var status int
	var requestID string
	err = sr.timeout.run(ctx, "Stripe", func(ctx context.Context) error {
		resp, err := hc.Do(req.WithContext(ctx))
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		status, requestID = resp.StatusCode, resp.Header.Get("Request-Id")
		body, err = io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("reading %s from Stripe: %w", what, err)
	}
	if status != http.StatusOK {
		var e struct {
			Error struct{ Code, Message string }
		}
		json.Unmarshal(body, &e)
		msg := fmt.Sprintf("Stripe answered %d to reading %s: %s %s; request id %q; nothing was recorded",
			status, what, e.Error.Code, e.Error.Message, requestID)
		if status == http.StatusNotFound {
			return nil, usageError("%s", msg)
		}
		return nil, errors.New(msg)
	}
	return body, nil
}
