package billing

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptrace"
	"sync/atomic"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/retry"
	"github.com/stripe/stripe-go/v79"
)

// firstSendSafe returns the local time before which the first attempt of
// a claim a Run has just won may be sent without asking the store again,
// or the zero time if it must ask.
//
// The claim statement read the database clock after claimedAt: it made
// the row, so no request carried the key before, and leased it to this
// attempt for the lease c records. Until half that lease has passed on the
// local clock, no other runner can have taken the claim over (a takeover
// needs the lease to have ended on the database clock), so nothing else
// sends the key and this send is its first: the window, which starts at
// the claim, cannot be over. The time left in the window at the claim,
// less an attempt's longest duration, bounds it too, so a check reused
// here is always one that a fresh CheckSend would pass, with an attempt's
// whole duration to spare. Retries ask the store, as every send of a
// resumed claim does, and so does every send of a usage report: what a
// meter error report may be about is judged by the key's window on the
// store's clock (see claim's own-send rule), so no usage event may leave
// on the local clock's word alone, even if that clock stopped while the
// database's went on.
func (b *Biller) firstSendSafe(j job, c claim.Claim) time.Time {
	if !j.won || j.rec == nil || j.claimedAt.IsZero() || j.usage != nil {
		return time.Time{}
	}
	attempt := b.policy.AttemptTimeout
	if attempt <= 0 {
		attempt = retry.DefaultAttemptTimeout
	}
	within := min(c.LeaseUntil.Sub(c.UpdatedAt)/2, b.cfg.WindowMargin-c.SentAge-attempt)
	if within <= 0 {
		return time.Time{}
	}
	return j.claimedAt.Add(within)
}

// beforeOnBothClocks reports whether now is before t on the monotonic clock
// and on the wall clock: the monotonic clock stops while the machine
// sleeps, the wall clock does not.
func beforeOnBothClocks(t time.Time) bool {
	if t.IsZero() {
		return false
	}
	now := time.Now()
	return now.Before(t) && now.Round(0).Before(t.Round(0))
}

// wire is what one attempt did on the network.
type wire struct {
	// writes counts the requests written: 0 when nothing was sent (the
	// attempt never left, or net/http never got a connection for it), -1
	// when it cannot be told (a transport other than a *http.Transport, or
	// one that got a connection and wrote nothing that it reported).
	writes int
	// called is set when the request was handed to the HTTP client.
	called bool
	// answered is set when an HTTP answer came back, whatever its status.
	answered bool
}

// create makes one HTTP attempt. It never makes a key: it sends the one it
// is given, in the header and in the metadata.
func (b *Biller) create(ctx context.Context, j job, key idemkey.Key, attempt int) (_ created, _ wire, _ error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return created{}, wire{}, err
	}
	// The last check before the key leaves: the deadline, on the database
	// clock, after any wait.
	var err error
	switch {
	case attempt == 1 && beforeOnBothClocks(j.firstSendBy):
		// The claim's own statement made this check (see firstSendSafe).
		// A stopped run sends nothing more, as the store would have
		// refused: a request cancelled before it is written may look
		// sent to the count below.
		err = ctx.Err()
	case j.rec != nil:
		err = j.rec.check(ctx, key.String(), j.owner)
	default:
		err = b.claims.CheckSend(ctx, key.String(), j.owner, b.cfg.WindowMargin)
	}
	if err != nil {
		return created{}, wire{}, err
	}
	if j.caller != nil {
		var cancel context.CancelFunc
		if dl, ok := ctx.Deadline(); ok {
			ctx, cancel = context.WithDeadline(context.WithoutCancel(ctx), dl)
		} else {
			ctx, cancel = context.WithCancel(context.WithoutCancel(ctx))
		}
		defer cancel()
		defer context.AfterFunc(j.caller, cancel)()
	}
	// A request is written only on a connection net/http got for it
	// (GotConn comes before any write, in the caller's goroutine): one
	// that asked for a connection (GetConn) and got none was never sent.
	// Only a *http.Transport is known to send every request it is given
	// that way; any other transport may send it where these hooks do not
	// see (see Biller.traced).
	var wrote atomic.Int32
	var asked, connected, answered atomic.Bool
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GetConn:              func(string) { asked.Store(true) },
		GotConn:              func(httptrace.GotConnInfo) { connected.Store(true) },
		WroteRequest:         func(httptrace.WroteRequestInfo) { wrote.Add(1) },
		GotFirstResponseByte: func() { answered.Store(true) },
	})
	ctx = idemkey.WithKey(ctx, key)
	meta := map[string]string{MetaKey: key.String(), MetaCustomer: j.customer, MetaPeriod: j.period}
	start := time.Now()
	var out created
	switch {
	case j.usage != nil:
		out, err = b.sendUsage(ctx, j, key)
	case b.cfg.API == PaymentIntents:
		params := &stripe.PaymentIntentParams{
			Amount:        stripe.Int64(j.price.Amount),
			Currency:      stripe.String(j.price.Currency),
			Customer:      stripe.String(j.customer),
			PaymentMethod: stripe.String(j.price.PaymentMethod),
			Confirm:       stripe.Bool(true),
			OffSession:    stripe.Bool(true),
		}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		var pi *stripe.PaymentIntent
		if pi, err = b.intents.New(params); err == nil {
			out = created{id: pi.ID, status: string(pi.Status), replayed: replayed(pi.LastResponse), requestID: requestID(pi.LastResponse)}
			if out.id == "" || out.status == "" {
				err = notAPayment(pi.LastResponse)
			}
		}
	default:
		params := &stripe.ChargeParams{
			Amount:   stripe.Int64(j.price.Amount),
			Currency: stripe.String(j.price.Currency),
			Customer: stripe.String(j.customer),
		}
		params.Context, params.IdempotencyKey, params.Metadata = ctx, stripe.String(key.String()), meta
		var ch *stripe.Charge
		if ch, err = b.charges.New(params); err == nil {
			out = created{id: ch.ID, status: string(ch.Status), replayed: replayed(ch.LastResponse), requestID: requestID(ch.LastResponse)}
			if out.id == "" || out.status == "" {
				err = notAPayment(ch.LastResponse)
			}
		}
	}
	rid := out.requestID
	var se *stripe.Error
	if errors.As(err, &se) {
		rid = se.RequestID
	}
	b.observe(Event{Kind: EventStripeCall, Customer: j.customer, Period: j.period, Key: key.String(), RequestID: rid,
		Attempt: attempt, Duration: time.Since(start), Err: err})
	w := wire{writes: int(wrote.Load()), called: true, answered: err == nil || answered.Load() || httpAnswer(err)}
	if w.writes == 0 && (!b.traced || !asked.Load() || connected.Load()) {
		w.writes = -1
	}
	return out, w, err
}

// httpAnswer reports whether err comes from an HTTP answer: Stripe's error,
// any other status put in its shape, or a spend-cap proxy's refusal.
func httpAnswer(err error) bool {
	var se *stripe.Error
	return proxyRefused(err) || errors.As(err, &se) && se.HTTPStatusCode != 0
}

func replayed(r *stripe.APIResponse) bool {
	return r != nil && r.Header.Get("Idempotent-Replayed") == "true"
}

func requestID(r *stripe.APIResponse) string {
	if r == nil {
		return ""
	}
	return r.RequestID
}

// refusedBeforeExecution reports whether err is an answer given before
// Stripe executed the request, so that nothing is stored under its key: a
// spend-cap proxy's refusal, an authentication failure, a rate limit, or a
// refusal of the request itself (Stripe saves no result for a request that
// fails validation).
func refusedBeforeExecution(err error) bool {
	if err == nil {
		return false
	}
	if proxyRefused(err) {
		return true
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return false
	}
	switch c := se.HTTPStatusCode; {
	case c == http.StatusUnauthorized, c == http.StatusForbidden:
		return true
	case c == http.StatusTooManyRequests:
		return se.Code != stripe.ErrorCodeLockTimeout
	case c >= 400 && c < 500 && c != http.StatusConflict && c != http.StatusPaymentRequired:
		return se.Type != stripe.ErrorTypeCard && se.Type != stripe.ErrorTypeIdempotency && !refusedForItem(se)
	}
	return false
}
