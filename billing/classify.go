package billing

import (
	"errors"
	"net/http"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/retry"
)

// Waits asked of the retry layer for answers that say "later".
const (
	// InFlightWait is the least wait after 409 idempotency_key_in_use: the
	// first request with the key is still running at Stripe.
	InFlightWait = time.Second
	// RateLimitWait is the least wait after 429 rate_limit: Stripe's rate
	// limiter runs before its idempotency layer, so nothing was stored and
	// only waiting helps.
	RateLimitWait = 2 * time.Second
)

// Classify decides whether a Stripe call may be retried with the same key.
// It is what [Biller] uses, and it is exported for teams that make their own
// stripe-go calls with [retry.Do]:
//
//	ch, err := retry.Do(ctx, key, retry.Policy{Classify: billing.Classify}, op)
//
// The decisions:
//
//	answer                                   decision
//	network error, timeout, connection reset retry (outcome unknown; the key makes it safe)
//	Stripe-Should-Retry: true / false        obeyed (except as noted below)
//	5xx                                      retry
//	409 idempotency_key_in_use               retry after InFlightWait
//	429 lock_timeout                         retry
//	429 rate_limit                           retry after RateLimitWait
//	400 idempotency_error                    stop: a bug, the key was used with other parameters
//	402 card_error                           stop: definitive
//	other 4xx                                stop
//	spend cap, vault key revoked, endpoint   stop (and a Run stops: see ErrSpendCapReached)
//	anything else                            retry.DefaultClassify
func Classify(err error) retry.Decision {
	if err == nil || stopsRun(err) {
		return retry.Stop()
	}
	var se *stripe.Error
	if !errors.As(err, &se) {
		return retry.DefaultClassify(err)
	}
	if se.Type == stripe.ErrorTypeIdempotency || se.Type == stripe.ErrorTypeCard {
		return retry.Stop()
	}
	wait := time.Duration(0)
	switch {
	case se.HTTPStatusCode == http.StatusConflict:
		wait = InFlightWait
	case se.HTTPStatusCode == http.StatusTooManyRequests && se.Code != stripe.ErrorCodeLockTimeout:
		wait = RateLimitWait
	}
	if se.LastResponse != nil {
		switch se.LastResponse.Header.Get("Stripe-Should-Retry") {
		case "true":
			return retry.After(wait)
		case "false":
			return retry.Stop()
		}
	}
	switch {
	case se.HTTPStatusCode == http.StatusConflict,
		se.HTTPStatusCode == http.StatusTooManyRequests,
		se.HTTPStatusCode >= 500:
		return retry.After(wait)
	}
	return retry.Stop()
}
