package billingtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/billonce/billonce/internal/ledger"
)

// Start starts a Server for one test and closes it when the test and its
// subtests end (tb.Cleanup). An invalid cfg fails the test.
func Start(tb testing.TB, cfg Config) *Server {
	tb.Helper()
	s, err := newServer(cfg)
	if err != nil {
		tb.Fatalf("billingtest.Start: %v", err)
	}
	tb.Cleanup(s.Close)
	return s
}

// RequireChargedOnce fails the test unless s's ledger holds exactly one
// payment that moved money for customer in period (the period being the
// metadata under Config.PeriodKey). The failure lists the customer's
// payments for the period, with their idempotency keys.
func RequireChargedOnce(tb testing.TB, s *Server, customer, period string) {
	tb.Helper()
	slot := ledger.Slot{Customer: customer, Period: period}
	if r := s.check(slot, true); slices.Contains(r.Missing, slot) || slices.Contains(r.Duplicates, slot) {
		tb.Fatalf("billingtest: customer %s was charged %d times for %s; want exactly once%s", customer, len(r.Paid[slot]), period, s.paymentsOf(customer, period))
	}
}

// RequireNotCharged fails the test if s's ledger holds any payment that
// moved money for customer in period.
func RequireNotCharged(tb testing.TB, s *Server, customer, period string) {
	tb.Helper()
	slot := ledger.Slot{Customer: customer, Period: period}
	if r := s.check(slot, false); slices.Contains(r.Unexpected, slot) {
		tb.Fatalf("billingtest: customer %s was charged %d times for %s; want never%s", customer, len(r.Paid[slot]), period, s.paymentsOf(customer, period))
	}
}

// check judges s's ledger for one slot with the oracle of every
// exactly-once test: once wants it charged exactly once, else never.
func (s *Server) check(slot ledger.Slot, once bool) ledger.Result {
	var ps []ledger.Payment
	for _, p := range s.Payments() {
		ps = append(ps, ledger.Payment{Customer: p.Customer, Period: p.Period, Paid: p.Paid})
	}
	return ledger.Check(ps, map[ledger.Slot]bool{slot: once})
}

// paymentsOf lists customer's payments for period, declined ones included,
// one per line.
func (s *Server) paymentsOf(customer, period string) string {
	var b strings.Builder
	for _, p := range s.Payments() {
		if p.Customer == customer && p.Period == period {
			fmt.Fprintf(&b, "\n\t%s %s %d %s paid=%v key=%q", p.ID, p.Status, p.Amount, p.Currency, p.Paid, p.IdempotencyKey)
		}
	}
	return b.String()
}
