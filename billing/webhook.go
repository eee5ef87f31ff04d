package billing

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/webhook"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// Defaults for [WebhookConfig].
const (
	// DefaultWebhookTolerance is how old a signature may be: Stripe's
	// library default, five minutes.
	DefaultWebhookTolerance = webhook.DefaultTolerance
	// DefaultWebhookMaxBody is the largest event body read, in bytes.
	DefaultWebhookMaxBody = 1 << 20
)

// WebhookConfig configures [Biller.Webhook].
type WebhookConfig struct {
	// Secret is the webhook endpoint's signing secret ("whsec_…", from
	// the Stripe dashboard or `stripe listen`). Required. It never appears
	// in logs or errors.
	Secret string
	// Tolerance is how old a signature's timestamp may be; older
	// deliveries (replays of a captured request) are refused with 400.
	// Defaults to DefaultWebhookTolerance.
	Tolerance time.Duration
	// MaxBody is the largest body read, in bytes. Defaults to
	// DefaultWebhookMaxBody.
	MaxBody int64
}

// describe is what Format and LogValue show: the configuration without
// its secret.
func (c WebhookConfig) describe() string {
	secret := "(none)"
	if c.Secret != "" {
		secret = "****"
	}
	return fmt.Sprintf("billing.WebhookConfig{Secret: %s, Tolerance: %v, MaxBody: %d}", secret, c.Tolerance, c.MaxBody)
}

// Format prints the configuration without its secret, for every verb
// (%v, %+v, %#v, %s, %x, …).
func (c WebhookConfig) Format(f fmt.State, verb rune) { io.WriteString(f, c.describe()) }

// LogValue implements [slog.LogValuer]: what Format shows.
func (c WebhookConfig) LogValue() slog.Value { return slog.StringValue(c.describe()) }

// The events the handler applies; every other type is acknowledged and
// ignored.
var webhookTypes = map[string]bool{
	"charge.succeeded": true, "charge.failed": true, "charge.pending": true, "charge.refunded": true,
	"charge.dispute.created":   true,
	"payment_intent.succeeded": true, "payment_intent.payment_failed": true, "payment_intent.processing": true,
	"invoice.paid": true, "invoice.payment_failed": true, "invoice.voided": true, "invoice.marked_uncollectible": true,
	"invoice.finalized":     true,
	"charge.refund.updated": true, "refund.created": true, "refund.updated": true, "refund.failed": true,
	"credit_note.created": true, "credit_note.updated": true, "credit_note.voided": true,
	"payout.created": true, "payout.updated": true, "payout.paid": true, "payout.failed": true, "payout.canceled": true,
}

// Webhook returns an http.Handler for Stripe's webhook events, to mount on
// the endpoint registered with Stripe. It verifies each delivery's
// Stripe-Signature with cfg.Secret (a bad, expired or missing signature
// is answered 400 and changes nothing), then applies the event to the
// claim of the payment it is about, found by the billonce_key metadata
// every billonce payment carries:
//
//   - charge.pending, payment_intent.processing: the payment is processing;
//   - charge.succeeded, payment_intent.succeeded: it settled; a claim
//     failed by its own payment (a PaymentIntent declined off session with
//     authentication_required, which its customer then completes on
//     session, as Stripe advises) is succeeded by its success: the period
//     is paid. A re-bill of the period still pending is stopped (its
//     claim failed, with claim.FailureSuperseded, and the error logged:
//     a re-bill cancels the PaymentIntent before its key is sent, see
//     [Biller.Rebill], but one sent by an earlier version of billonce
//     may have paid, unrecorded); a claim that paid the period, or is
//     processing, keeps it, and the event is answered 200 and reported as
//     EventNotApplied, the period perhaps paid twice, for a person;
//   - charge.failed, payment_intent.payment_failed: it failed, with
//     Stripe's failure code; the claim is failed for its key and nobody is
//     billed again without a Rebill;
//   - charge.refunded, charge.dispute.created: the refunded amount or the
//     dispute is recorded on the claim, reported to Config.Observe and
//     logged. A refunded or disputed payment was billed: neither is a
//     reason to bill again, and billonce never does;
//   - invoice.paid: the invoice's claim succeeded; invoice.voided: it
//     failed; invoice.marked_uncollectible: it stays processing, since an
//     uncollectible invoice can still be paid (void it to bill the period
//     another way);
//   - invoice.payment_failed: reported as a payment failed after
//     processing is (an EventSettled whose Err is an [ErrDeclined]
//     *ChargeError with AfterProcessing), once per event; the claim stays
//     processing, since the invoice stays open and Stripe keeps
//     collecting it;
//   - invoice.finalized: recorded and nothing more: a resumed invoice
//     reads the invoice itself before a step it cannot replay.
//
// Each event is applied exactly once (the claim store records its id in
// the transaction that applies it): Stripe's redeliveries, and one event
// delivered to several replicas at once, are answered 200 and change
// nothing. States only move forward, so events arriving out of order
// leave the claim where the newest left it. Events of other types, and
// events about payments without billonce's metadata or without a claim
// (another product's, another environment's), are answered 200 and
// ignored.
//
// The metadata that names a claim is anyone's to write who has the
// account's API key (a support script copying it onto a payment of its
// own, say), so an event moves a claim only when it is shown to be about
// the claim's own send: its object is of the claim's kind and is the one
// the claim recorded from Stripe's answer to its key (a meter error
// report: see [Biller.ReportUsage]). An event about another payment is
// answered "other_payment" and logged as a warning. An event for a claim
// that has recorded no payment yet (its answer was lost, its runner
// crashed) is answered "unproven" and changes nothing: the next Charge,
// Run or Reconcile resumes the claim with its key and Stripe answers it
// again, or, past the key's window, a search that finds exactly one
// payment for the key settles it.
//
// A failure to reach the claim store is answered 500, and a
// failure to read a dispute's or refund's payment from Stripe 503, so
// that Stripe delivers the event again. An event that can never be
// applied (its payment does not exist on this account, or it names a key
// or an id the claim table does not take) is answered 200 so that Stripe
// does not deliver it again for days, logged as an error and reported to
// Config.Observe as EventNotApplied.
//
// Every delivery, whatever its answer, is then reported to Config.Observe
// as one EventWebhook whose Result says what came of it: "applied",
// "duplicate", "unchanged", "other_payment", "unproven", "ignored", "not_applied",
// "rejected" (a 4xx answer: not a POST, a body too large or unreadable, a
// bad signature) or "retry" (a 5xx answer, for Stripe to deliver again).
//
// The record of each applied event is kept for Config.EventRetention (90
// days by default, well past the 30 days for which Stripe can resend an
// event); Reconcile deletes older ones. An event delivered again after
// its record is gone is applied again and, claims only moving forward,
// changes nothing: it is answered "unchanged", is logged at debug level
// (an event about another payment than the claim's is warned about again,
// as the first time) and is reported to Observe only as an EventWebhook
// "unchanged".
//
// The event's API version is not checked against stripe-go's: the handler
// reads only fields that every version has (ids, status, metadata,
// failure codes, amount_refunded).
//
// The handler logs event ids, types, customers, keys and payment ids,
// never the body or the signature. It is safe for concurrent use, and any
// number of replicas may serve the same endpoint.
func (b *Biller) Webhook(cfg WebhookConfig) (http.Handler, error) {
	if cfg.Secret == "" {
		return nil, invalid("WebhookConfig.Secret is empty: set the endpoint's signing secret (whsec_…)")
	}
	if strings.ContainsFunc(cfg.Secret, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return nil, invalid("WebhookConfig.Secret contains white space or control characters: check how it is loaded")
	}
	if cfg.Tolerance < 0 {
		return nil, invalid("WebhookConfig.Tolerance %v must not be negative", cfg.Tolerance)
	}
	if cfg.Tolerance == 0 {
		cfg.Tolerance = DefaultWebhookTolerance
	}
	if cfg.MaxBody < 0 {
		return nil, invalid("WebhookConfig.MaxBody %d must not be negative", cfg.MaxBody)
	}
	if cfg.MaxBody == 0 {
		cfg.MaxBody = DefaultWebhookMaxBody
	}
	return &webhookHandler{b: b, cfg: cfg}, nil
}

type webhookHandler struct {
	b   *Biller
	cfg WebhookConfig
}

// Format prints the handler without its secret, whatever the verb.
func (h *webhookHandler) Format(f fmt.State, verb rune) {
	fmt.Fprintf(f, "billing webhook handler for %v, %v", h.b, h.cfg)
}

// answer writes a short plain-text answer. Nothing from the request is
// echoed.
func answer(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	io.WriteString(w, msg+"\n")
}

func (h *webhookHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	e := h.serve(w, r)
	e.Kind = EventWebhook
	h.b.observe(e)
}

// serve answers one delivery and returns what it did, for the
// EventWebhook that ServeHTTP reports: Result and what is known of the
// event.
func (h *webhookHandler) serve(w http.ResponseWriter, r *http.Request) Event {
	ctx := r.Context()
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		answer(w, http.StatusMethodNotAllowed, "billonce webhook: use POST")
		return Event{Result: resultRejected, Err: errors.New("billing: webhook delivery refused: method " + clip(r.Method) + " is not POST")}
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, h.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			answer(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("billonce webhook: body larger than %d bytes", h.cfg.MaxBody))
			return Event{Result: resultRejected, Err: fmt.Errorf("billing: webhook delivery refused: body larger than %d bytes", h.cfg.MaxBody)}
		}
		answer(w, http.StatusBadRequest, "billonce webhook: could not read the body")
		return Event{Result: resultRejected, Err: fmt.Errorf("billing: webhook delivery refused: could not read the body: %w", err)}
	}
	err = webhook.ValidatePayloadWithTolerance(body, r.Header.Get("Stripe-Signature"), h.cfg.Secret, h.cfg.Tolerance)
	var ev stripe.Event
	if err == nil {
		var env thinEvent
		if json.Unmarshal(body, &env) == nil && env.Object == "v2.core.event" {
			return h.thin(ctx, w, env)
		}
		if jerr := json.Unmarshal(body, &ev); jerr != nil {
			err = errors.New("not a Stripe event")
		}
	}
	if err != nil {
		msg := signatureProblem(err)
		h.b.log.LogAttrs(ctx, slogWarn, "billonce: webhook refused", slog.String("reason", msg), slog.String("remote", r.RemoteAddr))
		answer(w, http.StatusBadRequest, "billonce webhook: "+msg)
		return Event{Result: resultRejected, Err: errors.New("billing: webhook delivery refused: " + msg)}
	}
	log := []slog.Attr{slog.String("event", ev.ID), slog.String("type", string(ev.Type))}
	if !webhookTypes[string(ev.Type)] {
		answer(w, http.StatusOK, "ignored: event type not handled")
		return Event{Result: resultIgnored, EventID: ev.ID}
	}
	if ev.Data == nil || len(ev.Data.Raw) == 0 || string(ev.Data.Raw) == "null" {
		return h.notApplied(ctx, w, ev, "", "", log, "the event carries no data object", errNoEventData)
	}
	// The event's objects, and any read of them, are on its account.
	ctx = onAccount(ctx, ev.Account)
	u, err := h.update(ctx, ev)
	if err != nil {
		if missingPayment(err) {
			return h.notApplied(ctx, w, ev, "", "", log, "its payment does not exist on this Stripe account (check that Config.SecretKey is of the account and mode the endpoint is registered in)", err)
		}
		// Reading the payment from Stripe failed for now: let Stripe
		// deliver the event again.
		h.b.log.LogAttrs(ctx, slogWarn, "billonce: webhook could not read the event's payment; Stripe will deliver the event again", append(log, slog.Any("error", err))...)
		answer(w, http.StatusServiceUnavailable, "billonce webhook: could not read the event's payment from Stripe; deliver again")
		return Event{Result: resultRetry, EventID: ev.ID, Err: fmt.Errorf("billing: webhook event %s: reading its payment from Stripe: %w", ev.ID, err)}
	}
	if u.Key == "" {
		h.b.log.LogAttrs(ctx, slogDebug, "billonce: webhook event is not about a billonce payment", log...)
		answer(w, http.StatusOK, "ignored: not a billonce payment")
		return Event{Result: resultIgnored, EventID: ev.ID, StripeID: u.StripeID}
	}
	u.EventID, u.EventType, u.Created, u.Account = ev.ID, string(ev.Type), time.Unix(ev.Created, 0).UTC(), ev.Account
	log = append(log, slog.String("key", u.Key), slog.String("stripe_id", u.StripeID))
	a, err := h.b.claims.Apply(ctx, u)
	switch {
	case errors.Is(err, claim.ErrNotFound):
		h.b.log.LogAttrs(ctx, slogInfo, "billonce: webhook event for a payment without a claim in this table; ignored", log...)
		answer(w, http.StatusOK, "ignored: no claim for this payment")
		return Event{Result: resultIgnored, EventID: ev.ID, Key: u.Key, StripeID: u.StripeID}
	case errors.Is(err, claim.ErrInvalid):
		// What the claim table refuses is the event's content, which a
		// redelivery repeats: no answer but 200 stops them.
		return h.notApplied(ctx, w, ev, u.StripeID, "", log, strings.TrimPrefix(err.Error(), claim.ErrInvalid.Error()+": "), err)
	case err != nil:
		h.b.log.LogAttrs(ctx, slogError, "billonce: webhook event not applied; Stripe will deliver it again", append(log, slog.Any("error", err))...)
		answer(w, http.StatusInternalServerError, "billonce webhook: the claim store failed; deliver again")
		return Event{Result: resultRetry, EventID: ev.ID, Key: u.Key, StripeID: u.StripeID,
			Err: fmt.Errorf("billing: webhook event %s: applying it to the claim store: %w", ev.ID, err)}
	}
	log = append(log, slog.String("customer", a.Claim.Customer), slog.String("period", a.Claim.Period), slog.String("outcome", a.Outcome.String()))
	e := Event{EventID: ev.ID, Object: objectOf(a.Claim.Endpoint), Key: u.Key, StripeID: u.StripeID, Customer: a.Claim.Customer, Period: a.Claim.Period}
	switch a.Outcome {
	case claimengine.Changed:
		h.b.applied(ctx, ev.ID, a)
		e.Result = resultApplied
	case claimengine.OtherPayment:
		h.b.log.LogAttrs(ctx, slogWarn, "billonce: webhook event names another payment than the claim's; nothing changed", append(log, slog.String("reason", a.Reason))...)
		e.Result = resultOtherPayment
	case claimengine.PaidTwice:
		return h.notApplied(ctx, w, ev, u.StripeID, e.Object, log, a.Reason+"; a person decides what to refund (billonce bills nobody again for it)", errPaidTwice)
	case claimengine.Unproven:
		h.b.log.LogAttrs(ctx, slogInfo, "billonce: webhook event is not shown to be about the claim's own send; nothing changed, and the claim's own resume settles it with its key", append(log, slog.String("reason", a.Reason))...)
		e.Result = resultUnproven
	case claimengine.Duplicate:
		h.b.log.LogAttrs(ctx, slogDebug, "billonce: webhook event changed nothing", append(log, slog.String("reason", a.Reason))...)
		e.Result = resultDuplicate
	default:
		h.b.log.LogAttrs(ctx, slogDebug, "billonce: webhook event changed nothing", append(log, slog.String("reason", a.Reason))...)
		e.Result = resultUnchanged
	}
	if ev.Type == "invoice.payment_failed" && (a.Outcome == claimengine.Changed || a.Outcome == claimengine.Unchanged) &&
		a.Claim.State == claim.StateProcessing {
		// Each failed attempt to collect an open invoice is reported once,
		// as a failed payment is; the claim stays processing.
		c := a.Claim
		d := failedFrom(c)
		d.Err = &kindError{kind: ErrDeclined, msg: "invoice " + u.StripeID + " stays open: a payment failed; Stripe keeps collecting it"}
		d.AfterProcessing, d.StripeID = true, u.StripeID
		h.b.invoiceDeclined(ctx, c.Key, d)
	}
	answer(w, http.StatusOK, strings.ToLower(a.Outcome.String()))
	return e
}

// notApplied acknowledges a signed event that cannot be applied, now or
// on any redelivery: 200, so that Stripe does not deliver it again for
// days (and disable the endpoint), an error in the log and an
// EventNotApplied to Config.Observe, saying why. object is the Object of
// the event's claim, "" when no claim is known.
func (h *webhookHandler) notApplied(ctx context.Context, w http.ResponseWriter, ev stripe.Event, stripeID, object string, log []slog.Attr, why string, err error) Event {
	h.b.log.LogAttrs(ctx, slogError, "billonce: webhook event not applied and acknowledged; Stripe will not deliver it again",
		append(log, slog.String("reason", why), slog.Any("error", err))...)
	e := Event{Kind: EventNotApplied, EventID: ev.ID, StripeID: stripeID, Object: object,
		Err: fmt.Errorf("billing: webhook event %s (%s) not applied: %s: %w", ev.ID, ev.Type, why, err)}
	h.b.observe(e)
	answer(w, http.StatusOK, "not applied: "+why)
	e.Result = resultNotApplied
	return e
}

// The results of a delivery, in EventWebhook's Result.
const (
	resultApplied      = "applied"
	resultDuplicate    = "duplicate"
	resultUnchanged    = "unchanged"
	resultOtherPayment = "other_payment"
	resultUnproven     = "unproven"
	resultIgnored      = "ignored"
	resultNotApplied   = "not_applied"
	resultRejected     = "rejected"
	resultRetry        = "retry"
)

// errNoEventData is the cause reported for a signed event without data.
var errNoEventData = errors.New("billing: webhook event without data")

// errPaidTwice is the cause reported for a claim's own payment that
// succeeded after the claim failed, once another payment holds its period.
var errPaidTwice = errors.New("billing: the period may be paid twice")

// missingPayment tells whether reading an event's payment failed because
// Stripe has no such payment on this account: a redelivery finds none
// either. Every other failure (the network, a 5xx, a rate limit, a
// refused key that an operator can fix) may pass.
func missingPayment(err error) bool {
	var se *stripe.Error
	return errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound && se.Code == stripe.ErrorCodeResourceMissing
}

// signatureProblem says what is wrong with a delivery, in words that
// carry nothing of the body, the header or the secret.
func signatureProblem(err error) string {
	switch {
	case errors.Is(err, webhook.ErrNotSigned):
		return "no Stripe-Signature header"
	case errors.Is(err, webhook.ErrInvalidHeader):
		return "malformed Stripe-Signature header"
	case errors.Is(err, webhook.ErrTooOld):
		return "signature timestamp outside the tolerance (an old or replayed delivery, or a clock far off)"
	case errors.Is(err, webhook.ErrNoValidSignature):
		return "no valid signature: the body was altered, or it was signed with another secret (check WebhookConfig.Secret)"
	}
	return "the signed body is not a Stripe event"
}

// update reads what an event says about its payment.
func (h *webhookHandler) update(ctx context.Context, ev stripe.Event) (claimengine.Update, error) {
	raw := ev.Data.Raw
	switch {
	case ev.Type == "charge.dispute.created":
		var d stripe.Dispute
		if err := json.Unmarshal(raw, &d); err != nil {
			return claimengine.Update{}, nil
		}
		return h.disputed(ctx, &d)
	case strings.HasPrefix(string(ev.Type), "invoice."):
		var in stripe.Invoice
		if err := json.Unmarshal(raw, &in); err != nil {
			return claimengine.Update{}, nil
		}
		return updateFromInvoice(string(ev.Type), &in), nil
	case strings.HasPrefix(string(ev.Type), "payout."):
		var po stripe.Payout
		if err := json.Unmarshal(raw, &po); err != nil {
			return claimengine.Update{}, nil
		}
		return updateFromPayout(&po), nil
	case strings.HasPrefix(string(ev.Type), "credit_note."):
		var cn stripe.CreditNote
		if err := json.Unmarshal(raw, &cn); err != nil {
			return claimengine.Update{}, nil
		}
		return updateFromCreditNote(&cn), nil
	case ev.Type == "charge.refund.updated" || strings.HasPrefix(string(ev.Type), "refund."):
		var re stripe.Refund
		if err := json.Unmarshal(raw, &re); err != nil {
			return claimengine.Update{}, nil
		}
		return updateFromRefund(&re), nil
	case strings.HasPrefix(string(ev.Type), "payment_intent."):
		var pi stripe.PaymentIntent
		if err := json.Unmarshal(raw, &pi); err != nil {
			return claimengine.Update{}, nil
		}
		u := updateFromIntent(&pi)
		if ev.Type == "payment_intent.payment_failed" && u.State != string(claim.StateFailed) {
			u.State = "" // confirmed again by someone else; its own events tell
		}
		return u, nil
	default:
		var ch stripe.Charge
		if err := json.Unmarshal(raw, &ch); err != nil {
			return claimengine.Update{}, nil
		}
		u := updateFromCharge(&ch)
		if u.Key == "" && ev.Type == "charge.refunded" && ch.PaymentIntent != nil && ch.PaymentIntent.ID != "" {
			// A PaymentIntent's charge need not carry its metadata.
			return h.intentUpdate(ctx, ch.PaymentIntent.ID, u)
		}
		return u, nil
	}
}

// disputed reads the disputed payment, whose metadata names the claim: a
// dispute carries only its ids.
func (h *webhookHandler) disputed(ctx context.Context, d *stripe.Dispute) (claimengine.Update, error) {
	u := claimengine.Update{Dispute: d.ID + " (" + string(d.Reason) + ")"}
	if d.PaymentIntent != nil && d.PaymentIntent.ID != "" {
		return h.intentUpdate(ctx, d.PaymentIntent.ID, u)
	}
	if d.Charge == nil || d.Charge.ID == "" {
		return claimengine.Update{}, nil
	}
	if err := h.b.limiter.Wait(ctx); err != nil {
		return claimengine.Update{}, err
	}
	ch, err := h.b.charges.Get(d.Charge.ID, &stripe.ChargeParams{Params: stripe.Params{Context: ctx}})
	if err != nil {
		return claimengine.Update{}, err
	}
	u.Key, u.StripeID = ch.Metadata[MetaKey], ch.ID
	if ch.PaymentIntent != nil && ch.PaymentIntent.ID != "" {
		u.StripeID = ch.PaymentIntent.ID
	}
	return u, nil
}

// intentUpdate fills in u's key and payment from PaymentIntent id, read
// from Stripe. State stays as u has it: only the metadata is wanted.
func (h *webhookHandler) intentUpdate(ctx context.Context, id string, u claimengine.Update) (claimengine.Update, error) {
	if err := h.b.limiter.Wait(ctx); err != nil {
		return claimengine.Update{}, err
	}
	pi, err := h.b.intents.Get(id, &stripe.PaymentIntentParams{Params: stripe.Params{Context: ctx}})
	if err != nil {
		return claimengine.Update{}, err
	}
	u.Key, u.StripeID = pi.Metadata[MetaKey], pi.ID
	return u, nil
}

// thinEvent is the envelope of a v2 ("thin") event, as Stripe delivers it
// to an event destination: its data must be read from Stripe.
type thinEvent struct {
	ID      string    `json:"id"`
	Object  string    `json:"object"`
	Type    string    `json:"type"`
	Created time.Time `json:"created"`
	// Context is the connected account the event happened on; "" for
	// the platform's own.
	Context string `json:"context"`
}

// meterErrorReport is the type of the event that reports meter events
// Stripe rejected after accepting them.
const meterErrorReport = "v1.billing.meter.error_report_triggered"

// v2Version is the API version of the request that reads a v2 event:
// Stripe serves /v2 under its 2024-09-30 versions and later.
const v2Version = "2024-09-30.acacia"

// errorReport is the part of a meter error report billonce reads.
type errorReport struct {
	stripe.APIResource
	ID     string `json:"id"`
	Object string `json:"object"`
	// RelatedObject is the meter whose events the report is about.
	RelatedObject *struct {
		ID   string `json:"id"`
		Type string `json:"type"`
	} `json:"related_object"`
	Data struct {
		Reason struct {
			ErrorCount int64 `json:"error_count"`
			ErrorTypes []struct {
				Code         string `json:"code"`
				ErrorCount   int64  `json:"error_count"`
				SampleErrors []struct {
					ErrorMessage string `json:"error_message"`
					Request      struct {
						Identifier string `json:"identifier"`
					} `json:"request"`
				} `json:"sample_errors"`
			} `json:"error_types"`
		} `json:"reason"`
		// ValidationStart and ValidationEnd bound the window in which
		// Stripe validated the events the report is about.
		ValidationStart time.Time `json:"validation_start"`
		ValidationEnd   time.Time `json:"validation_end"`
	} `json:"data"`
}

// thin applies a v2 event. A meter error report fails the claims of the
// usage events it names (their identifiers are the claims' keys) that it
// can be about: its meter's id and its validation window go with each
// update, for the claim store's rule; every other v2 event is
// acknowledged and ignored.
func (h *webhookHandler) thin(ctx context.Context, w http.ResponseWriter, env thinEvent) Event {
	log := []slog.Attr{slog.String("event", env.ID), slog.String("type", env.Type)}
	if env.Type != meterErrorReport || env.ID == "" {
		answer(w, http.StatusOK, "ignored: event type not handled")
		return Event{Result: resultIgnored, EventID: env.ID}
	}
	// The report, and the meter and events it names, are its account's.
	ctx = onAccount(ctx, env.Context)
	rep, err := h.readReport(ctx, env.ID)
	if err != nil {
		if missingPayment(err) {
			h.b.log.LogAttrs(ctx, slogError, "billonce: meter error report not found on this Stripe account; acknowledged", append(log, slog.Any("error", err))...)
			answer(w, http.StatusOK, "not applied: the event does not exist on this Stripe account")
			e := Event{Kind: EventNotApplied, EventID: env.ID, Err: fmt.Errorf("billing: webhook event %s (%s) not applied: %w", env.ID, env.Type, err)}
			h.b.observe(e)
			e.Result = resultNotApplied
			return e
		}
		h.b.log.LogAttrs(ctx, slogWarn, "billonce: webhook could not read the meter error report; Stripe will deliver it again", append(log, slog.Any("error", err))...)
		answer(w, http.StatusServiceUnavailable, "billonce webhook: could not read the event from Stripe; deliver again")
		return Event{Result: resultRetry, EventID: env.ID, Err: fmt.Errorf("billing: webhook event %s: reading it from Stripe: %w", env.ID, err)}
	}
	// An identifier is whatever the event's sender chose, on any meter of
	// any Stripe account: the report fails a claim only if it can be about
	// the claim's own event, on the meter the claim recorded (by its
	// Stripe id, one account's) and within the time its key can be sent
	// (the claim store's rule for every update).
	var meterID string
	if m := rep.RelatedObject; m != nil {
		meterID = m.ID
	}
	named, failed := 0, 0
	for _, t := range rep.Data.Reason.ErrorTypes {
		for _, s := range t.SampleErrors {
			id := s.Request.Identifier
			if _, err := idemkey.Parse(id); err != nil || !strings.HasPrefix(id, "bo1_") {
				continue // not an identifier billonce made
			}
			named++
			u := claimengine.Update{EventID: env.ID + "/" + id, EventType: env.Type, Key: id, StripeID: id,
				Created: cmp.Or(env.Created, time.Now()), State: string(claim.StateFailed), FailureCode: t.Code, Endpoint: endpointMeterEvents,
				MeterID: meterID, SentFrom: rep.Data.ValidationStart, SentTo: cmp.Or(rep.Data.ValidationEnd, rep.Data.ValidationStart), ReadAt: stripeNow(rep.LastResponse),
				Account: env.Context}
			a, err := h.b.claims.Apply(ctx, u)
			switch {
			case errors.Is(err, claim.ErrNotFound), errors.Is(err, claim.ErrInvalid):
				continue
			case err != nil:
				h.b.log.LogAttrs(ctx, slogError, "billonce: meter error report not applied; Stripe will deliver it again", append(log, slog.Any("error", err))...)
				answer(w, http.StatusInternalServerError, "billonce webhook: the claim store failed; deliver again")
				return Event{Result: resultRetry, EventID: env.ID, Err: fmt.Errorf("billing: webhook event %s: applying it to the claim store: %w", env.ID, err)}
			case a.Outcome == claimengine.Changed:
				failed++
				h.b.applied(ctx, env.ID, a)
			case a.Outcome == claimengine.OtherPayment && a.Claim.Endpoint == endpointMeterEvents:
				h.b.log.LogAttrs(ctx, slogWarn, "billonce: meter error report names a usage report's identifier but cannot be about this claim's usage event; the claim is left as it is (another writer sends events with billonce's identifiers)",
					append(log, slog.String("key", id), slog.String("customer", a.Claim.Customer), slog.String("period", a.Claim.Period), slog.String("reason", a.Reason))...)
			case a.Outcome == claimengine.Unproven && a.Claim.Endpoint == endpointMeterEvents:
				h.b.log.LogAttrs(ctx, slogWarn, "billonce: meter error report names a usage report's identifier but is not shown to be about this claim's usage event; the claim is left as it is: compare the meter's summary for its window with your records",
					append(log, slog.String("key", id), slog.String("customer", a.Claim.Customer), slog.String("period", a.Claim.Period), slog.String("reason", a.Reason))...)
			}
		}
	}
	if n := rep.Data.Reason.ErrorCount; n > int64(named) {
		h.b.log.LogAttrs(ctx, slogWarn, "billonce: Stripe rejected more usage events than its error report names; compare the meter's summaries with your records to find the others",
			append(log, slog.Int64("rejected", n), slog.Int("named", named))...)
	}
	if failed == 0 {
		answer(w, http.StatusOK, "unchanged")
		return Event{Result: resultUnchanged, EventID: env.ID}
	}
	answer(w, http.StatusOK, fmt.Sprintf("applied: %d usage reports failed", failed))
	return Event{Result: resultApplied, EventID: env.ID, Object: objectOf(endpointMeterEvents)}
}

// stripeNow is the time on Stripe's clock when it answered r, from the
// answer's Date header, or this process's time if it has none.
func stripeNow(r *stripe.APIResponse) time.Time {
	if r != nil {
		if t, err := http.ParseTime(r.Header.Get("Date")); err == nil {
			return t
		}
	}
	return time.Now()
}

// readReport reads a v2 event whole from Stripe.
func (h *webhookHandler) readReport(ctx context.Context, id string) (*errorReport, error) {
	if err := h.b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	params := &stripe.Params{Context: ctx, Headers: http.Header{"Stripe-Version": {v2Version}}}
	var rep errorReport
	if err := h.b.meterList.B.Call(http.MethodGet, "/v2/core/events/"+url.PathEscape(id), h.b.meterList.Key, params, &rep); err != nil {
		return nil, err
	}
	if rep.ID != id {
		return nil, notAPayment(rep.LastResponse)
	}
	return &rep, nil
}
