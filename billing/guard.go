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
	"github.com/billonce/billonce/internal/claimengine"
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
// resumed claim does, and so does every send of a kind whose writer says
// so (see writer.localFirstSend). So does the first attempt of each of an
// invoice's steps: their keys derive from the claim's, none was sent
// before the claim either, and their deadline runs from the claim.
func (b *Biller) firstSendSafe(j job, c claim.Claim) time.Time {
	if !j.won || j.rec == nil || j.claimedAt.IsZero() {
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

// attemptTrace is what one attempt did on the network.
type attemptTrace struct {
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

// guarded makes a write under retry with key, the one way any kind's
// write reaches Stripe. Each attempt passes the guard (see attempt);
// retries stop once Stripe is unreachable by Config.UnreachableAfter's
// rule, checked before each wait. already, if not nil, tells an answer
// that means the key's write exists already (see writer.alreadyThere):
// when the key may have been sent before, that is the write's success,
// replayed. guarded notes on j whether a write may have run at Stripe
// (j.ran), and so whether the claim is still one whose key never ran
// (j.won).
func (b *Biller) guarded(ctx context.Context, j *job, key idemkey.Key, already func(error) bool,
	call func(context.Context, idemkey.Key) (object, error)) (object, error) {
	n := 0 // retry.Do runs attempts one after the other
	// Stripe is unreachable, by the time rule, if the next attempt starts
	// at unreachableBy or later: a retry that cannot start before then
	// stops with unreachable, not after its wait.
	var unreachableBy time.Time
	var unreachable error
	policy := b.policyFor(ctx, *j)
	classify := policy.Classify
	policy.Classify = func(err error) retry.Decision {
		d := classify(err)
		if unreachable != nil {
			d = d.Until(unreachableBy, unreachable)
		}
		return d
	}
	out, err := retry.Do(ctx, key, policy, func(actx context.Context, key idemkey.Key) (object, error) {
		n++
		unreachableBy, unreachable = time.Time{}, nil
		start := time.Now()
		sentBefore := j.ran || !j.won && !j.reopened && !j.neverSent
		out, tr, err := b.attempt(actx, j, key, n, call)
		if already != nil && err != nil && already(err) && sentBefore {
			b.log.LogAttrs(ctx, slogInfo, "billonce: Stripe already has the key's write; recorded as delivered", attrs(*j)...)
			out, err = object{id: key.String(), status: "succeeded", replayed: true, requestID: out.requestID}, nil
		}
		// One write refused before execution ran nothing. Several writes
		// in one attempt (net/http resends a request with an
		// Idempotency-Key by itself when a reused connection closes, and
		// a caller's transport may retry) leave the earlier ones unknown;
		// so does a transport whose writes cannot be seen (-1).
		j.ran = j.ran || tr.writes != 0 && (tr.writes != 1 || !refusedBeforeExecution(err))
		// Whether Stripe answers at all, counted across the Biller's
		// calls; a stopped call's attempt says nothing about Stripe.
		switch {
		case !tr.called || ctx.Err() != nil:
		case tr.answered:
			b.reachability.answered()
		case err != nil:
			if by, uerr := b.reachability.missed(start, err); uerr != nil && by.IsZero() {
				err = uerr
			} else {
				unreachableBy, unreachable = by, uerr
			}
		}
		return out, err
	})
	j.won = j.won && !j.ran
	return out, err
}

// readRetried reads from Stripe under retry, with j's key in the retries'
// log lines: a read makes nothing, so only the retry policy bounds it.
func readRetried[T any](ctx context.Context, b *Biller, j job, read func(context.Context) (T, error)) (T, error) {
	return retry.Do(ctx, j.key, b.policyFor(ctx, j), func(ctx context.Context, _ idemkey.Key) (T, error) {
		return read(ctx)
	})
}

// attempt is the guard of one HTTP attempt of any write, in order: the
// rate limit; the last check before the key leaves, that the claim's
// deadline has not passed on the database clock (or, for the first send
// of a claim a Run just won, the claim's own statement: see
// firstSendSafe); a request context that a Run's own stop does not cancel
// in flight; the trace that tells whether the request was written; the
// call; and its report to Config.Observe. It never makes a key: call
// sends the one it is given.
func (b *Biller) attempt(ctx context.Context, j *job, key idemkey.Key, n int,
	call func(context.Context, idemkey.Key) (object, error)) (object, attemptTrace, error) {
	if err := b.limiter.Wait(ctx); err != nil {
		return object{}, attemptTrace{}, err
	}
	var err error
	switch {
	case n == 1 && beforeOnBothClocks(j.firstSendBy):
		// A stopped run sends nothing more, as the store would have
		// refused: a request cancelled before it is written may look
		// sent to the count below.
		err = ctx.Err()
	case j.rec != nil:
		err = j.rec.check(ctx, j.key.String(), j.owner)
	default:
		err = b.claims.CheckSend(ctx, j.key.String(), j.owner, b.cfg.WindowMargin)
	}
	if err != nil {
		return object{}, attemptTrace{}, err
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
	start := time.Now()
	out, err := call(idemkey.WithKey(ctx, key), key)
	rid := out.requestID
	var se *stripe.Error
	if errors.As(err, &se) {
		rid = se.RequestID
	}
	// The event names the claim's key, not the one this call sent (an
	// invoice's step, a PaymentIntent's cancel send keys of their own):
	// a call is the claim's, as its outcome is.
	b.observe(Event{Kind: EventStripeCall, Object: j.object(b), Customer: j.customer, Period: j.period, Key: j.key.String(), RequestID: rid,
		StripeID: j.holds, Attempt: n, Duration: time.Since(start), Err: err})
	tr := attemptTrace{writes: int(wrote.Load()), called: true, answered: err == nil || answered.Load() || httpAnswer(err)}
	if tr.writes == 0 && (!b.traced || !asked.Load() || connected.Load()) {
		tr.writes = -1
	}
	return out, tr, err
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

// policyFor is the retry policy for one charge: every retry is logged with
// the charge's key, customer and period.
func (b *Biller) policyFor(ctx context.Context, j job) retry.Policy {
	p := b.policy
	classify := p.Classify
	p.Classify = func(err error) retry.Decision {
		if errors.Is(err, claimengine.ErrWindowClosed) || errors.Is(err, claimengine.ErrLeaseLost) ||
			errors.Is(err, ErrStripeUnreachable) {
			return retry.Stop()
		}
		return classify(err)
	}
	user := p.Notify
	p.Notify = func(e retry.Event) {
		b.log.LogAttrs(ctx, slogInfo, "billonce: retrying with the same key",
			attrs(j, "http_attempt", e.Attempt, "wait", e.Wait, "error", e.Err)...)
		if user != nil {
			user(e)
		}
	}
	return p
}
