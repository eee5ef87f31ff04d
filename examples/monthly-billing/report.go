package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// reporter prints the outcome: text for people (stdout, or stderr with
// -json) and, with -json, one object on stdout.
type reporter struct {
	o              *options
	stdout, stderr io.Writer
	human          io.Writer

	run, second    *billing.Summary
	secondRequests int64
	ledger         *ledger
	settlement     *settlement
	usage          *usageStep
}

// runJSON is one run in the -json object.
type runJSON struct {
	Customers        int       `json:"customers"`
	Created          int       `json:"created"`
	AlreadyBilled    int       `json:"already_billed"`
	Declined         int       `json:"declined"`
	Processing       int       `json:"processing"`
	FailedAfter      int       `json:"failed_after_settlement"`
	Pending          int       `json:"pending"`
	Invalid          int       `json:"invalid"`
	ElapsedSeconds   float64   `json:"elapsed_seconds"`
	ChargesPerSecond float64   `json:"charges_per_second"`
	Complete         bool      `json:"complete"`
	Failures         []failure `json:"failures,omitempty"`
}

// failure is one customer not billed, with the fields and kinds billonce
// run prints (billing/cmd/billonce/README.md#exit-status).
type failure struct {
	Customer string `json:"customer"`
	Period   string `json:"period"`
	Key      string `json:"key"`
	Attempt  int    `json:"attempt"`
	// Kind is billing.ErrorKind of the error: one word, such as
	// declined, outcome_unknown or spend_cap_reached.
	Kind        string `json:"kind"`
	StripeCode  string `json:"stripe_code"`
	DeclineCode string `json:"decline_code,omitempty"`
	RequestID   string `json:"request_id"`
	Message     string `json:"message"`
}

// failureOf describes err, one of a run's Failures, for period.
func failureOf(period string, err error) failure {
	f := failure{Period: period, Message: err.Error()}
	var ce *billing.ChargeError
	if errors.As(err, &ce) {
		f.Customer, f.Period, f.Key, f.Attempt = ce.Customer, ce.Period, ce.Key, ce.Attempt
		f.StripeCode, f.DeclineCode, f.RequestID = ce.Code, ce.DeclineCode, ce.RequestID
	}
	f.Kind = billing.ErrorKind(err)
	return f
}

// reportJSON is what -json prints.
type reportJSON struct {
	// Status is complete, incomplete, stopped, lock_held, ledger_mismatch,
	// invalid_input or error.
	Status    string   `json:"status"`
	ExitCode  int      `json:"exit_code"`
	Period    string   `json:"period,omitempty"`
	API       string   `json:"api,omitempty"`
	Scope     string   `json:"scope,omitempty"`
	Error     string   `json:"error,omitempty"`
	Advice    []string `json:"advice,omitempty"`
	Run       *runJSON `json:"run,omitempty"`
	SecondRun *runJSON `json:"second_run,omitempty"`
	// SecondRunRequests is how many requests the second demo run sent to
	// Stripe.
	SecondRunRequests *int64      `json:"second_run_stripe_requests,omitempty"`
	Ledger            *ledger     `json:"ledger,omitempty"`
	Settlement        *settlement `json:"settlement,omitempty"`
	// Usage and UsageAgain are the demo's usage reports (-usage), with the
	// fields of a run: customers counts the reports, created those sent,
	// already_billed those found delivered.
	Usage              *runJSON    `json:"usage,omitempty"`
	UsageAgain         *runJSON    `json:"usage_again,omitempty"`
	UsageAgainRequests *int64      `json:"usage_again_stripe_requests,omitempty"`
	Meter              *meterCheck `json:"meter,omitempty"`
}

const maxListed = 5 // failures listed in the text output

// resume is what running again does after a stop.
const resume = "customers already charged are skipped, pending ones resume with their keys, and nobody is charged twice"

func toJSON(s *billing.Summary, period string) *runJSON {
	if s == nil {
		return nil
	}
	r := &runJSON{
		Customers: s.Done, Created: s.Created, AlreadyBilled: s.AlreadyBilled, Declined: s.Declined,
		Processing: s.Processing, FailedAfter: s.DeclinedAfterProcessing,
		Pending: s.Pending, Invalid: s.Invalid, ElapsedSeconds: s.Elapsed.Seconds(),
		ChargesPerSecond: chargesPerSecond(*s), Complete: s.Complete(),
	}
	for _, err := range s.Failures[:min(len(s.Failures), 20)] {
		r.Failures = append(r.Failures, failureOf(period, err))
	}
	return r
}

func chargesPerSecond(s billing.Summary) float64 {
	if s.Elapsed <= 0 {
		return 0
	}
	return float64(s.Created) / s.Elapsed.Seconds()
}

// fail reports an error that stopped the program before or outside a run.
func (r *reporter) fail(code int, status string, err error, advice string) int {
	fmt.Fprintf(r.stderr, "monthly-billing: %v\n", err)
	if advice != "" {
		fmt.Fprintf(r.stderr, "  %s\n", advice)
	}
	if r.o != nil && r.o.json {
		out := reportJSON{Status: status, ExitCode: code, Error: err.Error(), Period: r.o.period, API: string(r.o.api), Scope: r.o.scope}
		if advice != "" {
			out.Advice = []string{advice}
		}
		r.writeJSON(out)
	}
	return code
}

func (r *reporter) writeJSON(v reportJSON) {
	enc := json.NewEncoder(r.stdout)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// finish prints the runs and decides the exit status from the last run.
func (r *reporter) finish(last billing.Summary, runErr error) int {
	w := r.human
	held := errors.Is(runErr, billing.ErrRunHeldElsewhere)
	if r.run != nil && (!held || r.second != nil) {
		s := r.run
		unit := "charges/s"
		if r.o.by == "invoice" {
			unit = "invoices/s"
		}
		fmt.Fprintf(w, "run: %d customers in %s (%.0f %s)\n", s.Done, s.Elapsed.Round(10*time.Millisecond), chargesPerSecond(*s), unit)
		fmt.Fprintf(w, "  created        %6d\n  already billed %6d\n  declined       %6d\n  pending        %6d\n  invalid        %6d\n",
			s.Created, s.AlreadyBilled, s.Declined, s.Pending, s.Invalid)
		switch {
		case s.Processing > 0 && r.o.by == "invoice":
			fmt.Fprintf(w, "  processing     %6d  (invoices left open by a declined payment: Stripe keeps collecting them; never invoiced again)\n", s.Processing)
		case s.Processing+s.DeclinedAfterProcessing > 0:
			fmt.Fprintf(w, "  processing     %6d  (bank debits: sent, not settled yet; never sent again)\n", s.Processing)
			fmt.Fprintf(w, "  failed after settlement %d\n", s.DeclinedAfterProcessing)
		}
	}
	if st := r.settlement; st != nil {
		st.print(w)
	}
	if s := r.second; s != nil && !held {
		fmt.Fprintf(w, "same run again: created %d, already billed %d, declined %d, processing %d, failed after settlement %d, pending %d in %s; %d requests to Stripe\n",
			s.Created, s.AlreadyBilled, s.Declined, s.Processing, s.DeclinedAfterProcessing, s.Pending, s.Elapsed.Round(10*time.Millisecond), r.secondRequests)
	}
	if l := r.ledger; l != nil {
		verdict := "OK: nobody charged twice"
		if !l.OK {
			verdict = "WRONG"
		}
		if r.o.by == "invoice" {
			if l.OK {
				verdict = "OK: nobody invoiced twice"
			}
			fmt.Fprintf(w, "ledger check at the fake Stripe: %d customers: %d with one invoice, paid or open, each line once; %d with more than one, %d with none, %d with wrong lines: %s\n",
				l.Customers, l.Once, l.MoreThanOnce, l.NotCharged, l.WrongLines, verdict)
		} else {
			fmt.Fprintf(w, "ledger check at the fake Stripe: %d customers: %d charged exactly once, %d more than once, %d not charged: %s\n",
				l.Customers, l.Once, l.MoreThanOnce, l.NotCharged, verdict)
		}
	}
	if u := r.usage; u != nil {
		u.print(w)
	}

	code, status, advice := r.verdict(last, runErr)
	if len(last.Failures) > 0 {
		fmt.Fprintln(w, "not billed:")
		for _, err := range last.Failures[:min(len(last.Failures), maxListed)] {
			fmt.Fprintf(w, "  %v\n", err)
		}
		if n := max(len(last.Failures), last.Done-last.Created-last.AlreadyBilled-last.Processing) - maxListed; n > 0 {
			fmt.Fprintf(w, "  ... and %d more\n", n)
		}
	}
	if code == exitOK {
		fmt.Fprintf(w, "every customer is billed for %s\n", r.o.period)
	} else {
		if runErr != nil {
			fmt.Fprintf(r.stderr, "monthly-billing: %v\n", runErr)
		}
		for _, a := range advice {
			fmt.Fprintf(r.stderr, "monthly-billing: %s\n", a)
		}
	}
	if r.o.json {
		out := reportJSON{Status: status, ExitCode: code, Period: r.o.period, API: string(r.o.api), Scope: r.o.scope,
			Advice: advice, Run: toJSON(r.run, r.o.period), SecondRun: toJSON(r.second, r.o.period), Ledger: r.ledger, Settlement: r.settlement}
		if runErr != nil {
			out.Error = runErr.Error()
		}
		if r.second != nil {
			out.SecondRunRequests = &r.secondRequests
		}
		if u := r.usage; u != nil {
			out.Usage, out.UsageAgain, out.Meter = toJSON(u.first, r.o.period), toJSON(u.second, r.o.period), u.meter
			if u.meter != nil {
				out.UsageAgainRequests = &u.secondRequests
			}
		}
		r.writeJSON(out)
	}
	return code
}

// stopAdvice says what to fix after an answer that stops runs
// (billing.StopsRun).
func (r *reporter) stopAdvice(err error) string {
	switch {
	case errors.Is(err, billing.ErrStripeAuth) && r.o.vault():
		return "Stripe refused the key the spend-cap proxy sent for this vault key: fix the Stripe secret the proxy holds, then run again"
	case errors.Is(err, billing.ErrStripeAuth):
		return "Stripe refused the key: check -stripe-key (or STRIPE_SECRET_KEY) and its permissions, then run again"
	case errors.Is(err, billing.ErrStripeRequest) && r.o.vault():
		return "Stripe (or the spend-cap proxy) refused the request itself, for any customer: check -vault-proxy-url, and the mode and API version of the Stripe secret the proxy holds, then run again"
	case errors.Is(err, billing.ErrStripeRequest):
		return "Stripe refused the request itself, for any customer: check -stripe-url, the key's mode (test or live) and the API version, then run again"
	case errors.Is(err, billing.ErrStripeUnreachable) && r.o.vault():
		return "the spend-cap proxy gave no answer at all (connection refused, DNS, TLS or timeouts): check -vault-proxy-url and the network, then run the same command again; customers whose request may have left are pending and resumed with their keys"
	case errors.Is(err, billing.ErrStripeUnreachable):
		return "Stripe gave no answer at all (connection refused, DNS, TLS or timeouts): check -stripe-url and the network, then run the same command again; customers whose request may have left are pending and resumed with their keys"
	case errors.Is(err, spendcap.ErrSpendCapReached):
		return "the spend cap of the vault key is reached, so the proxy sent nothing more to Stripe. " +
			"Check that the amounts charged so far are what you expect; then raise the cap (or issue a new vault key) and run the same command again"
	case errors.Is(err, spendcap.ErrVaultKeyRevoked):
		return "the spend-cap proxy no longer accepts the vault key (revoked, unknown, or its kill switch is on): " +
			"issue a new key, pass it with -vault-key (or VAULT_KEY) and run again"
	case errors.Is(err, spendcap.ErrEndpointNotAllowed):
		ep := "/v1/charges"
		if r.o.api == billing.PaymentIntents {
			ep = "/v1/payment_intents"
		}
		return fmt.Sprintf("the vault key's allowlist lacks an endpoint billonce uses: allow POST %s and GET %s/search, then run again", ep, ep)
	}
	return "an answer that stops every run: fix its cause (see the error above), then run again"
}

// verdict turns the last run's outcome into an exit status, a status word
// and what to do next.
func (r *reporter) verdict(s billing.Summary, runErr error) (int, string, []string) {
	p := r.o.period
	switch {
	case errors.Is(runErr, billing.ErrRunHeldElsewhere):
		return exitLockHeld, "lock_held", []string{fmt.Sprintf(
			"another runner holds the lock for %s (scope %q) and is billing now; nothing to do here. "+
				"If no runner is alive, its lock went with its database connection: run again.", p, r.o.scope)}
	case billing.StopsRun(runErr):
		return exitStopped, "stopped", []string{r.stopAdvice(runErr) + "; " + resume}
	case errors.Is(runErr, context.Canceled), errors.Is(runErr, context.DeadlineExceeded):
		return exitStopped, "stopped", []string{"interrupted: run the same command again to finish; " + resume}
	case runErr != nil:
		return exitStopped, "stopped", []string{"run the same command again once the cause is fixed; " + resume}
	case r.ledger != nil && !r.ledger.OK, r.usage != nil && r.usage.meter != nil && !r.usage.meter.OK:
		return exitStopped, "ledger_mismatch", []string{"the fake Stripe's ledger does not match the runs: this is a bug in billonce; please report it with this output"}
	case r.usage != nil && !r.usage.second.Complete():
		return exitIncomplete, "incomplete", []string{"not every usage report was sent: " + strings.TrimSpace(summaryLine(*r.usage.second)) + "; run again: pending reports resume with their keys"}
	case s.Complete():
		return exitOK, "complete", nil
	}

	var advice []string
	if s.DeclinedAfterProcessing > 0 {
		advice = append(advice, fmt.Sprintf("%d bank debits failed after settlement (failure codes listed above): their claims are failed and later runs will not charge them again; "+
			"this is not a card decline: ask the customer for another payment method, then bill again deliberately, as a re-bill (billing.Biller.Rebill, attempt 2)", s.DeclinedAfterProcessing))
	}
	if s.Declined > 0 {
		advice = append(advice, fmt.Sprintf("%d declined: their claims are recorded as failed and later runs will not charge them again; "+
			"see the payments in the Stripe dashboard, and bill one again only deliberately, as a re-bill (billing.Biller.Rebill, attempt 2)", s.Declined))
	}
	var held, mismatch int
	var until time.Time
	for _, err := range s.Failures {
		var ce *billing.ChargeError
		var me *claim.MismatchError
		switch {
		case errors.Is(err, billing.ErrInProgress) && errors.As(err, &ce):
			held++
			if ce.Until.After(until) {
				until = ce.Until
			}
		case errors.As(err, &me):
			mismatch++
		}
	}
	if held > 0 {
		advice = append(advice, fmt.Sprintf("%d customers are claimed by another runner: run again once it is done; "+
			"if it died, its claims are free at %s (the claim lease, -lease) and the next run resumes them with the same keys", held, until.Local().Format(time.TimeOnly)))
	}
	if mismatch > 0 {
		advice = append(advice, fmt.Sprintf("%d customers have an amount or currency that differs from the claim recorded earlier for %s: "+
			"billonce never charges a different amount under the same key; correct the input or investigate before billing them", mismatch, p))
	}
	if unknown := s.Pending - held; unknown > 0 {
		advice = append(advice, fmt.Sprintf("%d outcomes are unknown: run the same command again; it resumes them with the same keys, and Stripe replays any charge that was made", unknown))
	}
	if bad := s.Invalid - mismatch; bad > 0 {
		advice = append(advice, fmt.Sprintf("%d customers had bad input (listed above): fix it and run again", bad))
	}
	return exitIncomplete, "incomplete", append(advice, "not every customer is billed for "+p+": "+strings.TrimSpace(summaryLine(s)))
}

func summaryLine(s billing.Summary) string {
	return fmt.Sprintf("created %d, already billed %d, declined %d, processing %d, failed after settlement %d, pending %d, invalid %d",
		s.Created, s.AlreadyBilled, s.Declined, s.Processing, s.DeclinedAfterProcessing, s.Pending, s.Invalid)
}
