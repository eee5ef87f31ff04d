package main

import (
	"bufio"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/billonce/billonce/billing"
)

// flat is the price of every customer when the input lists IDs only.
type flat struct {
	amount   int64
	currency string
}

// readCustomers reads the whole customer list: rows of customer ID,
// amount in the currency's smallest unit, currency and an optional payment
// method (testdata/customers.csv), or, with a flat price, customer IDs
// alone. A first row whose second column is "amount", or whose only column
// is "customer", is a header. Lines starting with # are comments. Every row
// is checked as billing checks it, and a customer listed twice is refused,
// before anything is charged. With inv, each row is billed by a copy of
// inv in its currency, whose one line is its amount.
func readCustomers(r io.Reader, name string, api billing.API, fp *flat, inv *billing.Invoice) ([]billing.Item, error) {
	var items []billing.Item
	seen := map[string]int{}
	err := readRows(r, name, func(line int, rec []string, first bool) error {
		if first && isHeader(rec) {
			return nil
		}
		it, msg := parseRow(rec, api, fp)
		if msg == "" && inv != nil {
			it, msg = invoiceItem(it, inv)
		}
		if msg != "" {
			return errors.New(msg)
		}
		if prev, dup := seen[it.Customer]; dup {
			return fmt.Errorf("customer %s is listed again (first on line %d): a customer is billed once per period; merge the rows", it.Customer, prev)
		}
		seen[it.Customer] = line
		items = append(items, it)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s: no customers; want rows of customer ID, amount, currency[, payment method], or IDs with -amount and -currency", name)
	}
	return items, nil
}

// openInput opens the input file of flag (path "-" is standard input),
// holding what kind of rows, and returns it with its name for errors and
// the function that closes it. On a terminal, standard input is announced
// on standard error, so that a command given no file does not wait in
// silence.
func openInput(a *app, flag, path, kind string) (io.Reader, string, func(), error) {
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return nil, "", nil, usageError("cannot open the %s file: %v", kind, errors.Unwrap(err))
		}
		return fh, path, func() { fh.Close() }, nil
	}
	if f, ok := a.stdin.(*os.File); ok {
		if fi, err := f.Stat(); err == nil && fi.Mode()&os.ModeCharDevice != 0 {
			fmt.Fprintf(a.stderr, "billonce: reading the %s from standard input (no -%s FILE given): type one row a line, as in the file, and end with Ctrl-D\n", kind, flag)
		}
	}
	return a.stdin, "standard input", func() {}, nil
}

// readRows reads the CSV file r, named name in errors, and hands row by
// row to fn with its line number, its cells trimmed of white space, and
// whether it is the first row (perhaps a header). Lines starting with #
// are comments. A byte-order mark before the first row, as a spreadsheet
// writes when it saves "CSV UTF-8", is not part of the first cell. An
// error of fn is returned with the file's name and the line.
func readRows(r io.Reader, name string, fn func(line int, rec []string, first bool) error) error {
	br := bufio.NewReader(r)
	if b, err := br.Peek(len(byteOrderMark)); err == nil && string(b) == byteOrderMark {
		br.Discard(len(byteOrderMark))
	}
	cr := csv.NewReader(br)
	cr.FieldsPerRecord = -1
	cr.TrimLeadingSpace = true
	cr.Comment = '#'
	for first := true; ; first = false {
		rec, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			var pe *csv.ParseError
			if errors.As(err, &pe) {
				return fmt.Errorf("%s:%d: malformed CSV: %v", name, pe.Line, pe.Err)
			}
			return fmt.Errorf("%s: reading: %w", name, err)
		}
		line, _ := cr.FieldPos(0)
		for i := range rec {
			rec[i] = strings.TrimSpace(rec[i])
		}
		if err := fn(line, rec, first); err != nil {
			return fmt.Errorf("%s:%d: %w", name, line, err)
		}
	}
}

// isHeader reports whether rec, the first row of a customers file, is its
// header: its second column is "amount", or its only one is "customer".
func isHeader(rec []string) bool {
	return (len(rec) >= 2 && strings.EqualFold(rec[1], "amount")) || (len(rec) == 1 && strings.EqualFold(rec[0], "customer"))
}

// byteOrderMark is U+FEFF in UTF-8.
const byteOrderMark = "\ufeff"

// readCustomerIDs reads the customer IDs of a customers file, in either of
// readCustomers' forms (its other columns are not read), once each, in
// the file's order.
func readCustomerIDs(r io.Reader, name string) ([]string, error) {
	var ids []string
	seen := map[string]bool{}
	err := readRows(r, name, func(line int, rec []string, first bool) error {
		if first && isHeader(rec) {
			return nil
		}
		if err := (billing.Item{Customer: rec[0]}).Validate(billing.Charges); err != nil {
			return errors.New(reason(err))
		}
		if !seen[rec[0]] {
			seen[rec[0]] = true
			ids = append(ids, rec[0])
		}
		return nil
	})
	if err == nil && len(ids) == 0 {
		err = fmt.Errorf("%s: no customers; want the customers file of the run (customer IDs in the first column)", name)
	}
	return ids, err
}

// parseRow turns one record into an item, or says what is wrong with it.
func parseRow(rec []string, api billing.API, fp *flat) (billing.Item, string) {
	id := rec[0]
	if err := (billing.Item{Customer: id}).Validate(api); err != nil {
		return billing.Item{}, reason(err)
	}
	var p billing.Price
	switch {
	case fp != nil && len(rec) == 1:
		p = billing.Price{Amount: fp.amount, Currency: fp.currency}
	case fp != nil:
		return billing.Item{}, fmt.Sprintf("%d columns; with -amount and -currency every row is a customer ID alone", len(rec))
	case len(rec) < 3 || len(rec) > 4:
		return billing.Item{}, fmt.Sprintf("%d columns; want customer ID, amount in minor units, currency and an optional payment method (or IDs alone with -amount and -currency)", len(rec))
	default:
		amount, err := strconv.ParseInt(rec[1], 10, 64)
		if err != nil {
			return billing.Item{}, fmt.Sprintf("customer %s: amount %q is not a whole number of the currency's smallest unit (write 2500 for $25.00)", id, rec[1])
		}
		p = billing.Price{Amount: amount, Currency: rec[2]}
		if len(rec) == 4 {
			p.PaymentMethod = rec[3]
		}
	}
	if api == billing.PaymentIntents && p.PaymentMethod == "" {
		return billing.Item{}, fmt.Sprintf("customer %s: -api payment_intents needs a payment method (pm_…) in the fourth column", id)
	}
	if err := p.Validate(api); err != nil {
		return billing.Item{}, "customer " + id + ": " + reason(err)
	}
	return billing.Item{Customer: id, Price: &p}, ""
}

// invoiceItem turns a priced item into one billed by a copy of inv.
func invoiceItem(it billing.Item, inv *billing.Invoice) (billing.Item, string) {
	if it.Price.PaymentMethod != "" {
		return it, "customer " + it.Customer + ": a payment method in the fourth column is not used by -invoice: Stripe charges an invoice to the customer's default payment method"
	}
	v := *inv
	v.Currency = it.Price.Currency
	v.Lines = []billing.InvoiceLine{{Description: inv.Lines[0].Description, Amount: it.Price.Amount}}
	return billing.Item{Customer: it.Customer, Invoice: &v}, ""
}

// reason is billing's description of bad input without its leading
// "billing: invalid input: ".
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), billing.ErrInvalid.Error()+": ")
}
