package main

import (
	"errors"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// failure is one customer not billed, as every subcommand prints it in
// JSON.
type failure struct {
	Customer string `json:"customer"`
	// Account is the connected account the claim is on; "" for the
	// platform's own.
	Account string `json:"account,omitempty"`
	Period  string `json:"period"`
	Key     string `json:"key"`
	Attempt int    `json:"attempt"`
	// Kind is billing.ErrorKind of the error: one word, such as
	// declined, outcome_unknown or spend_cap_reached.
	Kind string `json:"kind"`
	// StripeCode is Stripe's error code (or a payment's failure code),
	// DeclineCode its decline code.
	StripeCode  string `json:"stripe_code"`
	DeclineCode string `json:"decline_code,omitempty"`
	// RequestID is Stripe's request id of the answer, when the error
	// carries it.
	RequestID string `json:"request_id"`
	// StripeID is a payment that exists (not_recorded) or that the claim
	// records.
	StripeID string `json:"stripe_id,omitempty"`
	// Until is when another runner's lease ends (in_progress), or when a
	// search may settle the claim (sent_elsewhere).
	Until   *time.Time `json:"until,omitempty"`
	Message string     `json:"message"`
}

// failureOf describes err, a run's or a charge's failure, for period.
func failureOf(period string, err error) failure {
	f := failure{Period: period, Message: err.Error()}
	var ce *billing.ChargeError
	if errors.As(err, &ce) {
		f.Customer, f.Account, f.Period, f.Key, f.Attempt = ce.Customer, ce.Account, ce.Period, ce.Key, ce.Attempt
		f.StripeCode, f.DeclineCode, f.StripeID, f.RequestID = ce.Code, ce.DeclineCode, ce.StripeID, ce.RequestID
		if !ce.Until.IsZero() {
			u := ce.Until.UTC()
			f.Until = &u
		}
	}
	f.Kind = billing.ErrorKind(err)
	return f
}

// claimFailure describes a claim that is not billed (failed, or pending
// with a recorded reason) as a failure.
func claimFailure(c claim.Claim) failure {
	f := failure{Customer: c.Customer, Account: c.Account, Period: c.Period, Key: c.Key, Attempt: c.Attempt, StripeID: c.StripeID, Message: c.LastError}
	switch {
	case c.State == claim.StateFailed && !c.ProcessingAt.IsZero():
		f.Kind, f.StripeCode = "failed_after_settlement", c.FailureCode
	case c.State == claim.StateFailed:
		// billing records a decline as "code (decline code): message".
		f.Kind = "declined"
		head, _, _ := strings.Cut(c.LastError, ": ")
		code, decline, ok := strings.Cut(head, " (")
		if !strings.ContainsAny(code, " ") {
			f.StripeCode = code
			if ok {
				f.DeclineCode = strings.TrimSuffix(decline, ")")
			}
		}
	case strings.HasPrefix(c.LastError, "reconciliation:"):
		f.Kind = "needs_reconciliation"
	default:
		f.Kind = "outcome_unknown"
	}
	return f
}
