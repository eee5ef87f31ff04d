package billing

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/internal/redact"
	"github.com/billonce/billonce/internal/stripeanswer"
	"github.com/billonce/billonce/retry"
)

// Waits asked of the retry layer for answers that say "later".
const (
	// inFlightWait is the least wait after 409 idempotency_key_in_use: the
	// first request with the key is still running at Stripe.
	inFlightWait = time.Second
	// rateLimitWait is the least wait after 429 rate_limit: Stripe's rate
	// limiter runs before its idempotency layer, so nothing was stored and
	// only waiting helps.
	rateLimitWait = 2 * time.Second
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
//	409 idempotency_key_in_use               retry after at least 1s
//	429 lock_timeout                         retry
//	429 rate_limit                           retry after at least 2s
//	400 idempotency_error                    stop: a bug, the key was used with other parameters
//	402 card_error                           stop: definitive
//	other 4xx                                stop
//	spend cap, vault key revoked, endpoint   stop (and a Run stops: see spendcap.ErrSpendCapReached)
//	anything else                            retry.DefaultClassify
//
// A Biller stops retrying network errors, whatever Classify says, once
// Stripe has not answered at all for a while across its calls: see
// [ErrStripeUnreachable].
//
// A Biller's client puts an error answer that is not Stripe's (no Stripe
// Request-Id, a body that is not a Stripe error, such as a web server's or a
// load balancer's own page) in Stripe's error shape with its status, so the
// status decides as above: a 502 page is retried, a 404 page stops.
//
// What a Biller records for each refusal is the package documentation's
// table (see "What a refusal means").
func Classify(err error) retry.Decision {
	if err == nil || StopsRun(err) {
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
		wait = inFlightWait
	case se.HTTPStatusCode == http.StatusTooManyRequests && se.Code != stripe.ErrorCodeLockTimeout:
		wait = rateLimitWait
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

// refusedForItem reports whether Stripe's refusal se concerns only the
// item of the request, so that no customer's request but this one's is
// refused alike: the customer's card, payment method or bank account, or
// a value of the item's own that its claim fixes for its key (the price,
// a usage report's timestamp), which no resend can change. The claim is
// then failed, which is terminal for its key, and the run goes on. Any
// other refusal stops the run instead, with the claims left pending: see
// the table in Classify's documentation.
func refusedForItem(se *stripe.Error) bool {
	if se.Type == stripe.ErrorTypeCard || customerCodes[se.Code] || itemCodes[se.Code] != "" || refundCodes[se.Code] != "" || moneyOutCodes[se.Code] != "" {
		return true
	}
	return se.Code == stripe.ErrorCodeResourceMissing && customerParams[se.Param]
}

// customerCodes are Stripe's codes for a refusal caused by the customer's
// own card, payment method, bank account or mandate.
// https://docs.stripe.com/error-codes
var customerCodes = map[stripe.ErrorCode]bool{
	stripe.ErrorCodeMissing:                                true, // no such source on the customer
	stripe.ErrorCodeAccountClosed:                          true, // the customer's bank account
	stripe.ErrorCodeAuthenticationRequired:                 true,
	stripe.ErrorCodeBankAccountDeclined:                    true,
	stripe.ErrorCodeBankAccountRestricted:                  true,
	stripe.ErrorCodeBankAccountUnusable:                    true,
	stripe.ErrorCodeBankAccountUnverified:                  true,
	stripe.ErrorCodeBillingInvalidMandate:                  true,
	stripe.ErrorCodeCardDeclineRateLimitExceeded:           true,
	stripe.ErrorCodeCardDeclined:                           true,
	stripe.ErrorCodeChargeExceedsSourceLimit:               true,
	stripe.ErrorCodeDebitNotAuthorized:                     true,
	stripe.ErrorCodeExpiredCard:                            true,
	stripe.ErrorCodeIncorrectCVC:                           true,
	stripe.ErrorCodeIncorrectNumber:                        true,
	stripe.ErrorCodeIncorrectZip:                           true,
	stripe.ErrorCodeInsufficientFunds:                      true,
	stripe.ErrorCodeInvalidCVC:                             true,
	stripe.ErrorCodeInvalidExpiryMonth:                     true,
	stripe.ErrorCodeInvalidExpiryYear:                      true,
	stripe.ErrorCodeInvalidNumber:                          true,
	stripe.ErrorCodeInvalidSourceUsage:                     true,
	stripe.ErrorCodePaymentIntentAuthenticationFailure:     true,
	stripe.ErrorCodePaymentIntentIncompatiblePaymentMethod: true,
	stripe.ErrorCodePaymentIntentMandateInvalid:            true,
	stripe.ErrorCodePaymentIntentPaymentAttemptFailed:      true,
	stripe.ErrorCodePaymentMethodBankAccountBlocked:        true,
	stripe.ErrorCodePaymentMethodCurrencyMismatch:          true,
	stripe.ErrorCodePaymentMethodCustomerDecline:           true,
	stripe.ErrorCodePaymentMethodProviderDecline:           true,
	stripe.ErrorCodePaymentMethodUnexpectedState:           true,
	stripe.ErrorCodeReferToCustomer:                        true,
}

// itemCodes are Stripe's codes for a refusal of a value of the item's
// own that its claim records and never sends otherwise under its key, so
// that the key can never succeed, with what a person can do about it.
// Such a refusal is about this one request's data, not the way requests
// are made: it fails that claim and no other. (stripe-go v79 names no
// constant for the timestamp's code; Stripe's API lists it among the
// codes of meter event errors.)
var itemCodes = map[stripe.ErrorCode]string{
	stripe.ErrorCodeAmountTooSmall: "the amount is the period's price, recorded on the claim: bill the period again with Rebill and an amount Stripe takes",
	stripe.ErrorCodeAmountTooLarge: "the amount is the period's price, recorded on the claim: bill the period again with Rebill and an amount Stripe takes",
	"timestamp_too_far_in_past": "Stripe takes meter events up to 35 days old, and this report's event is stamped with its window's start, which only grows older: " +
		"the window's usage can no longer be reported to the meter; if it is owed, bill it another way (an invoice item)",
}

// customerParams are the parameters whose resource_missing names the
// customer's own object: no such customer, source or payment method.
var customerParams = map[string]bool{"customer": true, "source": true, "payment_method": true}

// refusedRequest is the run-stopping error for a refusal of the request
// itself: errors.Is matches kind ([ErrStripeAuth] or [ErrStripeRequest]),
// errors.As finds Stripe's *stripe.Error.
type refusedRequest struct {
	kind error
	se   *stripe.Error
}

func refused(se *stripe.Error) error {
	if se.HTTPStatusCode == http.StatusUnauthorized || se.HTTPStatusCode == http.StatusForbidden {
		return &refusedRequest{kind: ErrStripeAuth, se: se}
	}
	return &refusedRequest{kind: ErrStripeRequest, se: se}
}

func (e *refusedRequest) Error() string {
	what := string(e.se.Type)
	if e.se.Code != "" {
		what += " " + string(e.se.Code)
	}
	if e.se.Param != "" {
		what += ", param " + e.se.Param
	}
	fix := "check the key and its permissions"
	if e.kind == ErrStripeRequest {
		fix = "no customer can be billed this way; check Config.StripeURL, the key's mode and the API version; nothing is decided for any customer, and the next run bills them once it is fixed"
	}
	return fmt.Sprintf("%v (HTTP %d %s): %s: %s", e.kind, e.se.HTTPStatusCode, what, fix, e.se.Msg)
}

func (e *refusedRequest) Unwrap() []error { return []error{e.kind, e.se} }

// stripeShaped is an [http.RoundTripper] that turns an error answer which
// is not Stripe's (no Request-Id starting "req_", and a body that is not a
// Stripe error object: a web server's HTML 404 at a wrong Config.StripeURL,
// a load balancer's 502 page) into Stripe's error shape with the same
// status. stripe-go then returns a *stripe.Error judged by its status like
// any other: a 5xx is retried with the same key, a 4xx stops the run with
// [ErrStripeRequest] (it cannot be a customer's refusal). Without it
// stripe-go fails to decode the body and the answer looks like a network
// error of unknown outcome. Stripe's own answers, and a proxy's refusals in
// Stripe's shape, pass untouched.
//
// It also keeps the credential the request carried out of what stripe-go
// makes of the answer, which billing puts into errors, logs and events: a
// gateway that echoes the Authorization header into its Request-Id or an
// error body has each echo replaced by "[redacted]", and an error answer
// larger than [stripeanswer.MaxBody] (never Stripe's, and not read whole)
// is replaced like any answer that is not Stripe's.
type stripeShaped struct{ base http.RoundTripper }

func (t stripeShaped) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := t.base.RoundTrip(req)
	if err != nil {
		return resp, err
	}
	secret := sentCredential(req)
	if id := resp.Header.Get("Request-Id"); secret != "" && strings.Contains(id, secret) {
		resp.Header = resp.Header.Clone()
		resp.Header.Set("Request-Id", strings.ReplaceAll(id, secret, redacted))
	}
	if resp.StatusCode >= 300 && resp.StatusCode < 400 {
		return redirectRefused(req, resp), nil
	}
	if resp.StatusCode < 400 {
		return resp, nil
	}
	buf, err := stripeanswer.Peek(resp)
	if err != nil {
		resp.Body.Close()
		return nil, err
	}
	if len(buf) <= stripeanswer.MaxBody && secret != "" && bytes.Contains(buf, []byte(secret)) {
		resp.Body.Close()
		body := bytes.ReplaceAll(buf, []byte(secret), []byte(redacted))
		resp.Body, resp.ContentLength = io.NopCloser(bytes.NewReader(body)), int64(len(body))
		resp.Header = resp.Header.Clone()
		resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
		buf = body
	}
	if len(buf) <= stripeanswer.MaxBody && (stripeanswer.Stamped(resp) || stripeanswer.IsError(buf)) {
		return resp, nil
	}
	resp.Body.Close()
	msg := fmt.Sprintf("the answer from %s is not Stripe's: HTTP %d %s", req.URL.Host, resp.StatusCode, http.StatusText(resp.StatusCode))
	if len(buf) > stripeanswer.MaxBody {
		msg = fmt.Sprintf("the answer from %s is not Stripe's: HTTP %d %s with a body of more than %d bytes", req.URL.Host, resp.StatusCode, http.StatusText(resp.StatusCode), stripeanswer.MaxBody)
	}
	if ct := resp.Header.Get("Content-Type"); ct != "" {
		msg += " (" + ct + ")"
	}
	return stripeanswer.Rewrite(resp, resp.StatusCode, msg), nil
}

// redacted stands for a credential an answer echoed.
const redacted = "[redacted]"

// sentCredential is the credential req carried to Stripe: its bearer
// token (the secret key, or the credential a spend-cap proxy is sent), or
// "" without one.
func sentCredential(req *http.Request) string {
	auth := req.Header.Get("Authorization")
	if len(auth) > len("Bearer ") && strings.EqualFold(auth[:len("Bearer ")], "Bearer ") {
		return strings.TrimSpace(auth[len("Bearer "):])
	}
	return ""
}

// redirectRefused is the answer stripeShaped gives for a redirect: an
// error in Stripe's shape, HTTP 421 Misdirected Request, which stops the
// run with [ErrStripeRequest]. Stripe's API never redirects; the request
// was not executed where it was sent, and is sent nowhere else.
func redirectRefused(req *http.Request, resp *http.Response) *http.Response {
	resp.Body.Close()
	to := "no Location"
	if loc, err := resp.Location(); err == nil {
		to = redact.URL(loc)
	}
	msg := fmt.Sprintf("the answer from %s is a redirect (HTTP %d %s to %s), and Stripe's API never redirects: billonce follows no redirect, so the secret key is sent to Config.StripeURL only; set Config.StripeURL to the address that answers",
		req.URL.Host, resp.StatusCode, http.StatusText(resp.StatusCode), to)
	return stripeanswer.Rewrite(resp, http.StatusMisdirectedRequest, msg)
}

// refuseRedirect is the Biller's http.Client.CheckRedirect.
func refuseRedirect(req *http.Request, _ []*http.Request) error {
	return fmt.Errorf("billing: refusing to follow a redirect to %s: Stripe's API never redirects, and the secret key is sent to Config.StripeURL only", redact.URL(req.URL))
}

// notAPayment is the error for an answer stripe-go decoded without error
// that is not a payment: no id or no status (an empty object, a list, the
// answer to a GET). It is never recorded as a charge: the run stops with
// [ErrStripeRequest] and the claim stays pending, since whatever answered
// may have executed the request.
func notAPayment(r *stripe.APIResponse) error {
	return notStripes(r, "has no payment id or status, so it is not Stripe's answer to a charge")
}

// notASearchResult is the error for an answer to a search that stripe-go
// decoded without error but that is not a search result. Like
// [notAPayment], it stops the run with [ErrStripeRequest] and settles
// nothing: it is no evidence that Stripe holds no payment for the key.
func notASearchResult(r *stripe.APIResponse) error {
	return notStripes(r, "to a search or a listing is not a search result or a list, so it is not Stripe's")
}

// notStripes is the run-stopping error for a 2xx answer that is not the
// object Stripe answers with; what says what is wrong with it.
func notStripes(r *stripe.APIResponse, what string) error {
	status := 0
	if r != nil {
		status = r.StatusCode
	}
	return &refusedRequest{kind: ErrStripeRequest, se: &stripe.Error{
		HTTPStatusCode: status,
		Type:           stripe.ErrorTypeInvalidRequest,
		Msg:            fmt.Sprintf("the answer (HTTP %d) %s: check Config.StripeURL", status, what),
	}}
}
