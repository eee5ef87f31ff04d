package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
)

// cmdRun bills a period: every customer of the list once, under the
// period's advisory lock (one runner per scope and period), with the
// library's guarantees. Run it again after any stop: customers already
// billed are skipped and pending ones resume with their own keys.
//
// With -vault-proxy-url it bills through a spendcap-proxy with a vault key
// of its own, issued from the proxy's admin API once the customers and
// the period's claims are read (cap: the prices of the customers still to
// bill, those without a claim or with a pending one, plus -vault-margin;
// endpoints: those the Biller calls; expiry: -vault-expires-in) and
// revoked when the run ends, however it ends.
//
// With -invoice every customer is billed by one Stripe invoice with one
// line of the file's amount (billing.Item.Invoice), charged to the
// customer's default payment method at once, or with -days-until-due N
// sent to the customer, due in N days.
func cmdRun(ctx context.Context, a *app, args []string) (err error) {
	f := newFlags(a, "run", "run -period P [-customers FILE] [-amount N -currency C] [-account acct_…] [-invoice [-days-until-due N] [-description TEXT]] [-vault-proxy-url URL -credential NAME] [flags]")
	var b biller
	b.register(f)
	period := f.String("period", "", "billing period: a month (2026-09) or a day (2026-09-15); required")
	file := f.String("customers", "-", "CSV of customer ID, amount in minor units, currency[, payment method]; or customer IDs alone with -amount and -currency; - reads standard input")
	amount := f.Int64("amount", 0, "flat price of every customer, in the currency's smallest unit (2500 is $25.00), for a list of IDs alone")
	currency := f.String("currency", "", "currency of -amount, three lowercase letters (usd)")
	concurrency := f.Int("concurrency", billing.DefaultConcurrency, "customers charged at once")
	asJSON := f.Bool("json", false, "print one JSON object on standard output; progress and warnings stay on standard error")
	byInvoice := f.Bool("invoice", false, "bill each customer by one Stripe invoice with one line of its amount, instead of a charge")
	daysUntilDue := f.Int("days-until-due", 0, "with -invoice: send the invoice to the customer, due in this many days (1 to 365); 0 charges it at once")
	description := f.String("description", "", "with -invoice: the invoice's memo, at most 500 bytes")
	account := accountFlag(f, "bill every customer of the run on this connected account (acct_…), with the Stripe-Account header; default the platform's own")
	var vault vaultFlags
	vault.register(f)
	if err := f.parse(args); err != nil {
		return err
	}
	// Whatever stops the command before it bills is reported as report
	// would, in JSON too.
	started := false
	defer func() {
		if !started {
			err = reportEarly(a, "run", *period, err, *asJSON)
		}
	}()
	if err := vault.check(f); err != nil {
		return err
	}
	if err := checkPeriod(*period, false); err != nil {
		return err
	}
	if err := checkAccount(f, *account); err != nil {
		return err
	}
	var fp *flat
	switch {
	case f.set("amount") != f.set("currency"):
		return usageError("-amount and -currency go together: a flat price for a list of customer IDs")
	case f.set("amount"):
		fp = &flat{amount: *amount, currency: *currency}
	}
	if *concurrency <= 0 {
		return usageError("-concurrency %d: want at least 1", *concurrency)
	}
	if err := (billing.RunOptions{Concurrency: *concurrency}).Validate(); err != nil {
		return usageError("-concurrency: %s", reason(err))
	}
	inv, err := invoiceTemplate(f, *byInvoice, *period, *daysUntilDue, *description, vault.proxyURL != "")
	if err != nil {
		return err
	}

	// The whole list is read and checked before anything else, so that a
	// bad row stops the command before a database or Stripe is touched.
	in, name, done, err := openInput(a, "customers", *file, "customers")
	if err != nil {
		return err
	}
	defer done()
	items, err := readCustomers(in, name, billing.API(b.api), fp, inv)
	if err != nil {
		return usageError("%v; fix the input and run again; nothing was charged", err)
	}
	for i := range items {
		items[i].Account = *account
	}

	if vault.proxyURL != "" {
		b.vault = &vaultRun{flags: &vault, period: *period, items: items}
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	if s.vault != nil {
		defer s.vault.end(ctx, a)
	}
	on := onText(*account)
	if inv != nil {
		fmt.Fprintf(a.stderr, "invoicing %d customers for %s%s, scope %q\n", len(items), *period, on, b.scope)
	} else {
		fmt.Fprintf(a.stderr, "billing %d customers for %s%s with the %s API, scope %q\n", len(items), *period, on, b.api, b.scope)
	}
	started = true
	sum, err := s.biller.Run(ctx, *period, func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}, &billing.RunOptions{
		Concurrency: *concurrency,
		Total:       len(items),
		Progress:    newProgress(a.stderr, "billing").update,
		Lock:        s.guard,
	})
	return report(a, "run", *period, sum, err, *asJSON)
}

// invoiceTemplate checks the invoice flags and returns the invoice every
// customer gets, but for its currency and its line's amount; nil without
// -invoice.
func invoiceTemplate(f *flags, byInvoice bool, period string, daysUntilDue int, description string, vault bool) (*billing.Invoice, error) {
	if !byInvoice {
		for _, name := range []string{"days-until-due", "description"} {
			if f.set(name) {
				return nil, usageError("-%s goes with -invoice", name)
			}
		}
		return nil, nil
	}
	switch {
	case f.set("api") && billing.API(f.Lookup("api").Value.String()) != billing.Charges:
		return nil, usageError("-invoice bills by Stripe invoices, which Stripe pays itself: drop -api")
	case vault:
		return nil, usageError("-invoice cannot go with -vault-proxy-url: a vault key allows the charge endpoints only")
	}
	inv := &billing.Invoice{Currency: "usd", DaysUntilDue: daysUntilDue, Description: description,
		Lines: []billing.InvoiceLine{{Description: "billing period " + period, Amount: 1}}}
	if err := (billing.Item{Customer: "c", Invoice: inv}).Validate(billing.Charges); err != nil {
		return nil, usageError("%s", strings.TrimPrefix(reason(err), "customer c: "))
	}
	return inv, nil
}

// summaryJSON is a run's or a reconciliation's outcome in JSON: the one
// object run, usage and reconcile print with -json, however they end.
type summaryJSON struct {
	// Status is complete, incomplete, stopped, lock_held, or usage_error
	// for bad flags or input (exit status 2, nothing sent).
	Status         string    `json:"status"`
	ExitCode       int       `json:"exit_code"`
	Period         string    `json:"period,omitempty"`
	Customers      int       `json:"customers"`
	Created        int       `json:"created"`
	AlreadyBilled  int       `json:"already_billed"`
	Declined       int       `json:"declined"`
	Processing     int       `json:"processing"`
	FailedAfter    int       `json:"failed_after_settlement"`
	Pending        int       `json:"pending"`
	Invalid        int       `json:"invalid"`
	ElapsedSeconds float64   `json:"elapsed_seconds"`
	Error          *failure  `json:"error,omitempty"`
	Failures       []failure `json:"failures"`
	Next           string    `json:"next,omitempty"`
}

const maxListed = 10 // failures listed in the text output

// reportEarly reports err, which ended a run, usage or reconcile before it
// billed anyone. With -json it prints the one JSON object those commands
// always print, with err in it, and err on standard error too; without,
// it returns err for run to print.
func reportEarly(a *app, what, period string, err error, asJSON bool) error {
	if err == nil || !asJSON {
		return err
	}
	code := exitCode(err)
	fe := failureOf(period, err)
	out := summaryJSON{Status: "stopped", ExitCode: code, Period: period, Error: &fe, Failures: []failure{},
		Next: "fix the cause above, then run the same command again; nothing was billed or sent before it stopped"}
	if code == exitUsage {
		out.Status = "usage_error"
		out.Next = "fix the flags or the input named above, then run the same command again; nothing was billed or sent"
	}
	enc := json.NewEncoder(a.stdout)
	enc.SetIndent("", "  ")
	enc.Encode(out)
	fmt.Fprintf(a.stderr, "billonce %s: %v\n", what, err)
	return &exitError{code: code, err: errReported}
}

// report prints a run's or reconciliation's summary, on standard output,
// and returns the error that gives the exit status.
func report(a *app, what, period string, sum billing.Summary, runErr error, asJSON bool) error {
	out := summaryJSON{Period: period, Customers: sum.Done, Created: sum.Created, AlreadyBilled: sum.AlreadyBilled,
		Declined: sum.Declined, Processing: sum.Processing, FailedAfter: sum.DeclinedAfterProcessing,
		Pending: sum.Pending, Invalid: sum.Invalid, ElapsedSeconds: sum.Elapsed.Seconds(), Failures: []failure{}}
	for _, err := range sum.Failures {
		out.Failures = append(out.Failures, failureOf(period, err))
	}
	var ret error
	switch {
	case errors.Is(runErr, billing.ErrRunHeldElsewhere):
		out.Status, out.ExitCode = "lock_held", exitLockHeld
		out.Next = "another runner holds the lock and is working now; nothing was done here. If no runner is alive, its lock went with its database connection: run again"
		ret = &exitError{code: exitLockHeld, err: errReported}
	case runErr != nil:
		out.Status, out.ExitCode = "stopped", exitStopped
		fe := failureOf(period, runErr)
		out.Error = &fe
		out.Next = "fix the cause above, then run the same command again: customers already billed are skipped, pending ones resume with their keys, and nobody is charged twice"
		if what == "usage" {
			out.Next = "fix the cause above, then run the same command again: reports already delivered are skipped, pending ones resume with their keys, and no window is counted twice"
		}
		if billing.StopsRun(runErr) {
			out.Next = "an answer that stops every run (a refused key or request, a spend cap): " + out.Next
		}
		ret = &exitError{code: exitStopped, err: errReported}
	case !sum.Complete():
		out.Status, out.ExitCode = "incomplete", exitIncomplete
		out.Next = "see billonce status -period " + cmp.Or(period, "P") + "; pending customers resume with their keys on the next run; declined ones are billed again only by billonce rebill"
		if what == "usage" {
			out.Next = "run the same command again: pending reports resume with their keys; fix invalid rows first; billonce inspect -key K shows one report's claim"
		}
		ret = errIncomplete
	default:
		out.Status = "complete"
	}
	if asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		enc.Encode(out)
		if runErr != nil {
			fmt.Fprintf(a.stderr, "billonce %s: %v\n", what, runErr)
		}
	} else {
		w := a.stdout
		if what == "usage" {
			// A report moves no money: it is sent, or found delivered.
			fmt.Fprintf(w, "%s: %d reports in %s: %s\n", what, sum.Done, sum.Elapsed.Round(10*time.Millisecond), out.Status)
			fmt.Fprintf(w, "  sent           %6d\n  already sent   %6d\n  rejected       %6d\n  pending        %6d\n  invalid        %6d\n",
				sum.Created, sum.AlreadyBilled, sum.Declined, sum.Pending, sum.Invalid)
		} else {
			fmt.Fprintf(w, "%s: %d customers in %s: %s\n", what, sum.Done, sum.Elapsed.Round(10*time.Millisecond), out.Status)
			fmt.Fprintf(w, "  created        %6d\n  already billed %6d\n  declined       %6d\n  processing     %6d\n  failed after settlement %d\n  pending        %6d\n  invalid        %6d\n",
				sum.Created, sum.AlreadyBilled, sum.Declined, sum.Processing, sum.DeclinedAfterProcessing, sum.Pending, sum.Invalid)
		}
		if len(out.Failures) > 0 {
			if what == "usage" {
				fmt.Fprintln(w, "not reported:")
			} else {
				fmt.Fprintln(w, "not billed:")
			}
			for _, fl := range out.Failures[:min(len(out.Failures), maxListed)] {
				fmt.Fprintf(w, "  %s %s attempt %d: %s", fl.Customer, fl.Period, fl.Attempt, fl.Kind)
				if fl.StripeCode != "" {
					fmt.Fprintf(w, " (%s)", fl.StripeCode)
				}
				fmt.Fprintf(w, ": %s\n", fl.Message)
			}
			if n := len(out.Failures) - maxListed; n > 0 {
				fmt.Fprintf(w, "  ... and %d more (billonce status -period %s)\n", n, cmp.Or(period, "P"))
			}
		}
		if runErr != nil {
			fmt.Fprintf(a.stderr, "billonce %s: %v\n", what, runErr)
		}
		if out.Next != "" {
			fmt.Fprintf(a.stderr, "billonce %s: %s\n", what, out.Next)
		}
	}
	return ret
}
