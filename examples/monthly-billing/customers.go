package main

import (
	"encoding/csv"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"iter"
	"os"
	"strconv"
	"strings"

	"github.com/billonce/billonce/billing"
)

// demoWidth is the number of digits in demo customer IDs (cus_demo_0001).
func demoWidth(n int) int { return max(4, len(strconv.Itoa(n))) }

// demoID is the ID of demo customer i (1-based).
func demoID(i, n int) string { return fmt.Sprintf("cus_demo_%0*d", demoWidth(n), i) }

// demoPlans are the monthly prices of the demo customers, in cents.
var demoPlans = [...]int64{900, 1900, 4900}

// demoPrice is what demo customer i owes: one of three plans, by i.
func demoPrice(i int, api billing.API) billing.Price {
	p := billing.Price{Amount: demoPlans[i%len(demoPlans)], Currency: "usd"}
	if api == billing.PaymentIntents {
		p.PaymentMethod = "pm_card_visa"
	}
	return p
}

// demoDeclined returns the indexes of the d demo customers (of n) whose cards
// decline, spread evenly over the list.
func demoDeclined(d, n int) []int {
	out := make([]int, d)
	for k := range d {
		out[k] = (k + 1) * n / (d + 1)
	}
	return out
}

// demoItems yields n demo customers with their prices.
func demoItems(n int, api billing.API) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for i := 1; i <= n; i++ {
			p := demoPrice(i, api)
			if !yield(billing.Item{Customer: demoID(i, n), Price: &p}, nil) {
				return
			}
		}
	}
}

// inputError is a problem with the customers file, at a line.
type inputError struct {
	file string
	line int
	msg  string
}

func (e *inputError) Error() string {
	if e.line == 0 {
		return fmt.Sprintf("%s: %s", e.file, e.msg)
	}
	return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg)
}

// row is one customer of the customers file and its line number.
type row struct {
	billing.Item
	line int
}

// csvItems streams the customers file as billing items.
func csvItems(path string, api billing.API) iter.Seq2[billing.Item, error] {
	return func(yield func(billing.Item, error) bool) {
		for r, err := range csvRows(path, api) {
			if !yield(r.Item, err) {
				return
			}
		}
	}
}

// csvRows reads the customers file row by row: customer ID, amount in the
// currency's smallest unit, currency, and an optional payment method. A
// first row whose second column is "amount" is a header and is skipped.
// Each row is checked as billing would check it; the iteration stops at the
// first bad row with an *inputError naming its line.
func csvRows(path string, api billing.API) iter.Seq2[row, error] {
	return func(yield func(row, error) bool) {
		f, err := os.Open(path)
		if err != nil {
			yield(row{}, &inputError{file: path, msg: fmt.Sprintf("cannot open the customers file: %v", errors.Unwrap(err))})
			return
		}
		defer f.Close()
		r := csv.NewReader(f)
		r.FieldsPerRecord = -1 // the payment method column is optional
		r.TrimLeadingSpace = true
		r.Comment = '#'
		first := true
		for {
			rec, err := r.Read()
			if err == io.EOF {
				return
			}
			if err != nil {
				var pe *csv.ParseError
				if errors.As(err, &pe) {
					yield(row{}, &inputError{file: path, line: pe.Line, msg: "malformed CSV: " + pe.Err.Error()})
				} else {
					yield(row{}, &inputError{file: path, msg: "reading: " + err.Error()})
				}
				return
			}
			line, _ := r.FieldPos(0)
			if first {
				first = false
				if len(rec) >= 2 && strings.EqualFold(strings.TrimSpace(rec[1]), "amount") {
					continue
				}
			}
			it, msg := parseRow(rec, api)
			if msg != "" {
				yield(row{}, &inputError{file: path, line: line, msg: msg})
				return
			}
			if !yield(row{it, line}, nil) {
				return
			}
		}
	}
}

// parseRow turns one CSV record into an item, or says what is wrong with it.
// The customer and the price are checked by billing's own rules.
func parseRow(rec []string, api billing.API) (billing.Item, string) {
	if len(rec) < 3 || len(rec) > 4 {
		return billing.Item{}, fmt.Sprintf("%d columns; want customer ID, amount in minor units, currency and an optional payment method", len(rec))
	}
	for i := range rec {
		rec[i] = strings.TrimSpace(rec[i])
	}
	id := rec[0]
	if err := (billing.Item{Customer: id}).Validate(api); err != nil {
		return billing.Item{}, reason(err)
	}
	amount, err := strconv.ParseInt(rec[1], 10, 64)
	if err != nil {
		return billing.Item{}, fmt.Sprintf("customer %s: amount %q is not a whole number of the currency's smallest unit (write 2500 for $25.00)", id, rec[1])
	}
	p := billing.Price{Amount: amount, Currency: rec[2]}
	if len(rec) == 4 {
		p.PaymentMethod = rec[3]
	}
	if api == billing.PaymentIntents && p.PaymentMethod == "" {
		return billing.Item{}, fmt.Sprintf("customer %s: -api payment_intents needs a payment method (pm_…) in the fourth column", id)
	}
	if err := p.Validate(api); err != nil {
		return billing.Item{}, "customer " + id + ": " + reason(err)
	}
	return billing.Item{Customer: id, Price: &p}, ""
}

// reason is billing's description of bad input without its leading
// "billing: invalid input: ": the file and line say where it comes from.
func reason(err error) string {
	return strings.TrimPrefix(err.Error(), billing.ErrInvalid.Error()+": ")
}

// checkFile reads the whole customers file once, streaming, and returns the
// number of customers, or the first problem: a malformed row, a bad amount or
// currency, or a customer listed twice. Only a 64-bit hash and a line number
// per customer are kept to find duplicates (a hash collision, about one in
// 10^7 for a million customers, would report a duplicate that is not one:
// the safe direction).
//
// byInvoice refuses a payment method: Stripe pays an invoice with the
// customer's default one.
func checkFile(path string, api billing.API, byInvoice bool) (int, error) {
	seen := map[uint64]int{}
	n := 0
	for r, err := range csvRows(path, api) {
		if err != nil {
			return n, err
		}
		n++
		if byInvoice && r.Price.PaymentMethod != "" {
			return n, &inputError{file: path, line: r.line, msg: fmt.Sprintf("customer %s: a payment method is not used by -by invoice: Stripe pays an invoice with the customer's default payment method", r.Customer)}
		}
		h := fnv.New64a()
		h.Write([]byte(r.Customer))
		if prev, dup := seen[h.Sum64()]; dup {
			return n, &inputError{file: path, line: r.line, msg: fmt.Sprintf("customer %s is listed again (first on line %d): a customer is billed once per period; merge the rows", r.Customer, prev)}
		}
		seen[h.Sum64()] = r.line
	}
	if n == 0 {
		return 0, &inputError{file: path, msg: "no customers in the file; want rows of customer ID, amount, currency[, payment method]"}
	}
	return n, nil
}
