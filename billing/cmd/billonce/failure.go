package main

import (
	"context"
	"errors"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// failure is one customer not billed, as every subcommand prints it in
// JSON.
type failure struct {
	Customer string `json:"customer"`
	Period   string `json:"period"`
	Key      string `json:"key"`
	Attempt  int    `json:"attempt"`
	// Kind is one word: declined, failed_after_settlement, in_progress,
	// outcome_unknown, needs_reconciliation, sent_elsewhere,
	// not_recorded, key_reused, mismatch, invalid, stripe_auth,
	// stripe_request, stripe_unreachable, spend_cap, interrupted or error.
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

// kinds maps billing's error kinds to failure kinds, first match wins.
var kinds = []struct {
	err  error
	kind string
}{
	{billing.ErrDeclined, "declined"},
	{billing.ErrInProgress, "in_progress"},
	{billing.ErrNeedsReconciliation, "needs_reconciliation"},
	{billing.ErrSentElsewhere, "sent_elsewhere"},
	{billing.ErrNotRecorded, "not_recorded"},
	{billing.ErrKeyReused, "key_reused"},
	{billing.ErrOutcomeUnknown, "outcome_unknown"},
	{billing.ErrStripeAuth, "stripe_auth"},
	{billing.ErrStripeRequest, "stripe_request"},
	{billing.ErrStripeUnreachable, "stripe_unreachable"},
	{spendcap.ErrSpendCapReached, "spend_cap"},
	{spendcap.ErrVaultKeyRevoked, "spend_cap"},
	{spendcap.ErrEndpointNotAllowed, "spend_cap"},
	{billing.ErrInvalid, "invalid"},
	{context.Canceled, "interrupted"},
	{context.DeadlineExceeded, "interrupted"},
}

// failureOf describes err, a run's or a charge's failure, for period.
func failureOf(period string, err error) failure {
	f := failure{Period: period, Kind: "error", Message: err.Error()}
	var ce *billing.ChargeError
	if errors.As(err, &ce) {
		f.Customer, f.Period, f.Key, f.Attempt = ce.Customer, ce.Period, ce.Key, ce.Attempt
		f.StripeCode, f.DeclineCode, f.StripeID, f.RequestID = ce.Code, ce.DeclineCode, ce.StripeID, ce.RequestID
		if !ce.Until.IsZero() {
			u := ce.Until.UTC()
			f.Until = &u
		}
	}
	var me *claim.MismatchError
	for _, k := range kinds {
		if errors.Is(err, k.err) {
			f.Kind = k.kind
			break
		}
	}
	switch {
	case errors.As(err, &me):
		f.Kind = "mismatch"
	case f.Kind == "declined" && ce != nil && ce.AfterProcessing:
		f.Kind = "failed_after_settlement"
	}
	return f
}

// claimFailure describes a claim that is not billed (failed, or pending
// with a recorded reason) as a failure.
func claimFailure(c claim.Claim) failure {
	f := failure{Customer: c.Customer, Period: c.Period, Key: c.Key, Attempt: c.Attempt, StripeID: c.StripeID, Message: c.LastError}
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
