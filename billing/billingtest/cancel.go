package billingtest

import (
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// cancelParams are the parameters POST /v1/payment_intents/{id}/cancel
// takes.
var cancelParams = map[string]bool{"cancellation_reason": true}

// cancellationReasons are the values Stripe takes for cancellation_reason.
var cancellationReasons = map[string]bool{"duplicate": true, "fraudulent": true, "requested_by_customer": true, "abandoned": true}

// cancelIntent validates POST /v1/payment_intents/{id}/cancel and returns
// how to run it, by Stripe's rules: a PaymentIntent that requires a
// payment method, a confirmation, an action or a capture is canceled (it
// emits payment_intent.canceled, and no confirmation moves it again); any
// other (succeeded, processing, canceled already) is refused with 400
// payment_intent_unexpected_state, which stores nothing under the key.
// Stripe cancels a processing PaymentIntent in rare cases; the fake never
// does.
func (s *Server) cancelIntent(acct, id string, form url.Values) (*apiErr, func(time.Time) (result, bool)) {
	if bad := unknownParam(form, cancelParams); bad != nil {
		return bad, nil
	}
	if r := form.Get("cancellation_reason"); r != "" && !cancellationReasons[r] {
		return invalid("cancellation_reason", "parameter_invalid_string",
			"Invalid cancellation_reason: use duplicate, fraudulent, requested_by_customer or abandoned."), nil
	}
	return nil, func(now time.Time) (result, bool) {
		p := s.payment(acct, id, "payment_intent")
		if p == nil {
			return errResult(http.StatusNotFound, *invalid("intent", "resource_missing", fmt.Sprintf("No such payment_intent: '%s'", id))), false
		}
		switch p.Status {
		case "requires_payment_method", "requires_confirmation", "requires_action", "requires_capture":
		default:
			return errResult(http.StatusBadRequest, *invalid("", "payment_intent_unexpected_state", fmt.Sprintf(
				"You cannot cancel this PaymentIntent because it has a status of %s. Only a PaymentIntent with one of the following statuses may be canceled: requires_payment_method, requires_capture, requires_confirmation, requires_action, processing.", p.Status))), false
		}
		p.Status, p.settleAt = "canceled", time.Time{}
		s.emit("payment_intent.canceled", p, now)
		res := ok(render(p))
		res.objectID = p.ID
		return res, true
	}
}
