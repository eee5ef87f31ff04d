package main

import (
	"context"
	"encoding/csv"
	"encoding/json"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/billonce/billonce/claim"
)

// exportRow is one claim in an export.
type exportRow struct {
	Customer    string    `json:"customer"`
	Period      string    `json:"period"`
	Key         string    `json:"key"`
	Attempt     int       `json:"attempt"`
	State       string    `json:"state"`
	Amount      int64     `json:"amount"`
	Currency    string    `json:"currency"`
	StripeID    string    `json:"stripe_id"`
	Refunded    int64     `json:"refunded"`
	Dispute     string    `json:"dispute"`
	FailureCode string    `json:"failure_code"`
	LastError   string    `json:"last_error"`
	CreatedAt   time.Time `json:"created_at"`
	UpdatedAt   time.Time `json:"updated_at"`
	// Endpoint tells a charge (charges, payment_intents) from an invoice
	// (invoices, StripeID the invoice) and a usage report (meter_events,
	// Amount the quantity, no currency).
	Endpoint string `json:"endpoint"`
	// Kind is what the claim is for: charge, invoice, meter_event,
	// refund, credit_note (Amount what it refunded), transfer or payout
	// (Amount what it paid the account).
	Kind string `json:"kind"`
	// Account is the connected account the claim's key went to; "" for
	// the platform's own, where a transfer is made (its Customer is the
	// account it pays).
	Account string `json:"account"`
	// RefundOf is, for a refund or credit note, the key of the payment's
	// claim it refunds.
	RefundOf string `json:"refund_of"`
}

var exportHeader = []string{"customer", "period", "key", "attempt", "state", "amount", "currency", "stripe_id",
	"refunded", "dispute", "failure_code", "last_error", "created_at", "updated_at", "endpoint", "kind", "account", "refund_of"}

// record is r as a CSV row, every cell passed through inert.
func (r exportRow) record() []string {
	rec := []string{r.Customer, r.Period, r.Key, strconv.Itoa(r.Attempt), r.State, strconv.FormatInt(r.Amount, 10), r.Currency, r.StripeID,
		strconv.FormatInt(r.Refunded, 10), r.Dispute, r.FailureCode, r.LastError, r.CreatedAt.UTC().Format(time.RFC3339), r.UpdatedAt.UTC().Format(time.RFC3339), r.Endpoint,
		r.Kind, r.Account, r.RefundOf}
	for i, c := range rec {
		rec[i] = inert(c)
	}
	return rec
}

// inert returns a CSV cell that a spreadsheet shows as text: one that
// starts with =, +, -, @, a tab or a carriage return would be run as a
// formula (CSV injection), so it gets a ' before it, as OWASP advises.
// Customer IDs, Stripe's messages and dispute reasons come from outside;
// billonce's own cells (amounts, times, keys) never start so.
func inert(cell string) string {
	if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
		return "'" + cell
	}
	return cell
}

// cmdExport writes a period's claims, every attempt of every customer,
// with the refunds and credit notes of its payments and its transfers
// and payouts, each row with its kind, for accounting: amounts in the
// currency's smallest unit, times in UTC. With -account, only the claims
// on that connected account, and the transfers to it.
// In CSV a cell that a spreadsheet would run as a formula starts with a '
// (see inert); JSON has the values as they are.
func cmdExport(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "export", "export -period P [-account acct_…] [-format csv|json]")
	var c conn
	c.register(f)
	period := f.String("period", "", "billing period; required")
	format := f.String("format", "csv", "csv (with a header row; a cell that would start a spreadsheet formula, with = + - @ tab or carriage return, gets a ' before it) or json (an array, values as they are)")
	account := accountFlag(f, "only the claims on this connected account (acct_…), and the transfers to it")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := checkPeriod(*period, true); err != nil {
		return err
	}
	if err := checkAccount(f, *account); err != nil {
		return err
	}
	if *format != "csv" && *format != "json" {
		return usageError("-format %q: use csv or json", *format)
	}
	pool, store, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var rows []exportRow
	if err := c.read(ctx, func(ctx context.Context) (err error) {
		rows, err = exportRows(ctx, store, *period, *account)
		return err
	}); err != nil {
		return err
	}
	if *format == "json" {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rows)
	}
	return writeCSV(a.stdout, rows)
}

// writeCSV writes rows as CSV, with a header row.
func writeCSV(out io.Writer, rows []exportRow) error {
	w := csv.NewWriter(out)
	w.Write(exportHeader)
	for _, r := range rows {
		w.Write(r.record())
	}
	w.Flush()
	return w.Error()
}

// exportRows reads the claims of period and those made for it, of
// account when it is not "", in one query.
func exportRows(ctx context.Context, store *claim.Postgres, period, account string) ([]exportRow, error) {
	periods, prefixes := periodClaims(period)
	claims, err := store.ListPeriods(ctx, periods, prefixes, "")
	if err != nil {
		return nil, err
	}
	rows := make([]exportRow, 0, len(claims))
	for _, c := range claims {
		if !onAccount(c, account) {
			continue
		}
		rows = append(rows, exportRow{Customer: c.Customer, Period: c.Period, Key: c.Key, Attempt: c.Attempt, State: string(c.State),
			Amount: c.Amount, Currency: c.Currency, StripeID: c.StripeID, Refunded: c.Refunded, Dispute: c.Dispute,
			FailureCode: c.FailureCode, LastError: c.LastError, CreatedAt: c.CreatedAt.UTC(), UpdatedAt: c.UpdatedAt.UTC(), Endpoint: c.Endpoint,
			Kind: kindOf(c), Account: c.Account, RefundOf: c.RefundOf})
	}
	return rows, nil
}
