package chaos

import (
	"context"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/ledger"
)

// Ledger is what Check found at the fake.
type Ledger struct {
	Faults            map[billingtest.FaultKind]int64
	Requests, Replays int64
	// Paid and Declined count the customers of the main period.
	Paid, Declined int
	// Reports counts the usage windows counted once (CheckUsage), or the
	// invoice lines billed (CheckInvoices).
	Reports                         int
	Duplicates, Missing, Mismatches int
	Problems                        []string // one line per broken invariant (first 20)
	// Evidence holds, when an invariant broke, the fake's request log and
	// the children's log lines for the first customers concerned.
	Evidence []string
}

// OK reports whether every invariant of the ledger held.
func (l Ledger) OK() bool { return l.Duplicates == 0 && l.Missing == 0 && l.Mismatches == 0 }

// Check closes the fake, which waits for held requests so its ledger is
// final, and checks that ledger and the claim table. For each period of
// periods, its customers 0 to n-1 must each be charged exactly once at
// their price, with a succeeded claim naming that charge, but for the
// declined, which must have a failed claim and no charge. Any other charge
// or claim is a mismatch. Paid and Declined count the customers of main.
func (e *Env) Check(ctx context.Context, main string, periods map[string]int) (Ledger, error) {
	e.Fake.Close()
	st := e.Fake.Stats()
	l := Ledger{Faults: st.Faults, Requests: st.Requests, Replays: st.Replays}
	claims, err := loadClaims(ctx, e.Pool, &l)
	if err != nil {
		return l, e.Errorf("reading claims: %w", err)
	}
	verify(main, periods, e.Fake.Payments(), claims, e.Declined, &l)
	if !l.OK() {
		l.Evidence = evidence(l.Problems, e.Fake.Log(), e.LogDir)
	}
	return l, nil
}

// key is a period and a customer.
type key struct{ period, customer string }

// claimRow is what verify needs of a claim.
type claimRow struct{ state, stripeID string }

// loadClaims reads every claim by period and customer; a second claim for
// the same customer and period is a mismatch in l.
func loadClaims(ctx context.Context, pool *pgxpool.Pool, l *Ledger) (map[key]claimRow, error) {
	rows, err := pool.Query(ctx, `SELECT period, customer, state, coalesce(stripe_id, '') FROM billonce_claims`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	claims := map[key]claimRow{}
	for rows.Next() {
		var k key
		var c claimRow
		if err := rows.Scan(&k.period, &k.customer, &c.state, &c.stripeID); err != nil {
			return nil, err
		}
		if _, dup := claims[k]; dup {
			l.problem(&l.Mismatches, "customer %s has more than one claim for %s", k.customer, k.period)
		}
		claims[k] = c
	}
	return claims, rows.Err()
}

// problem counts a broken invariant in counter and notes it.
func (l *Ledger) problem(counter *int, format string, args ...any) {
	*counter++
	l.note(format, args...)
}

// note keeps the line of a broken invariant among the first 20.
func (l *Ledger) note(format string, args ...any) {
	if len(l.Problems) < 20 {
		l.Problems = append(l.Problems, fmt.Sprintf(format, args...))
	}
}

// verify checks the invariants Check describes against payments and
// claims, and counts what broke in l. Which customer is charged more than
// once, never, or when it should not be is the oracle's (package ledger);
// amounts and claims are checked here.
func verify(main string, periods map[string]int, payments []billingtest.Payment, claims map[key]claimRow, declined map[string]bool, l *Ledger) {
	claims = maps.Clone(claims)
	want := map[ledger.Slot]bool{}
	for period, n := range periods {
		for i := range n {
			want[ledger.Slot{Customer: CustomerID(i), Period: period}] = !declined[CustomerID(i)]
		}
	}
	r := ledger.Check(toLedger(payments), want)
	for _, s := range r.Duplicates {
		var ids []string
		for _, i := range r.Paid[s] {
			ids = append(ids, payments[i].ID+" key="+payments[i].IdempotencyKey)
		}
		l.Duplicates += len(ids) - 1
		l.note("customer %s charged %d times for %s: %s", s.Customer, len(ids), s.Period, strings.Join(ids, ", "))
	}
	for _, s := range r.Unexpected {
		p := payments[r.Paid[s][0]]
		if _, known := want[s]; known {
			l.problem(&l.Mismatches, "declined customer %s has a paid charge %s for %s", s.Customer, p.ID, s.Period)
		} else {
			l.problem(&l.Mismatches, "charge %s for unknown customer %s, period %q", p.ID, s.Customer, s.Period)
		}
	}
	for _, s := range r.Missing {
		c := claims[key{s.Period, s.Customer}]
		l.problem(&l.Missing, "customer %s never charged for %s; claim state %q", s.Customer, s.Period, c.state)
		if c.state == string(claim.StateSucceeded) {
			l.problem(&l.Mismatches, "customer %s, %s: succeeded claim names %s, but the ledger has no paid charge", s.Customer, s.Period, c.stripeID)
		}
	}
	for _, period := range slices.Sorted(maps.Keys(periods)) {
		for i := range periods[period] {
			k := key{period, CustomerID(i)}
			c := claims[k]
			delete(claims, k)
			var ps []billingtest.Payment
			for _, j := range r.Paid[ledger.Slot{Customer: k.customer, Period: period}] {
				ps = append(ps, payments[j])
			}
			switch {
			case declined[k.customer]:
				if period == main {
					l.Declined++
				}
				if c.state != string(claim.StateFailed) {
					l.problem(&l.Mismatches, "declined customer %s, %s: claim state %q, want failed", k.customer, period, c.state)
				}
				continue
			case len(ps) == 0:
				continue // missing, counted above
			}
			if period == main {
				l.Paid++
			}
			want := Price(i)
			for _, p := range ps {
				if p.Amount != want.Amount || p.Currency != want.Currency {
					l.problem(&l.Mismatches, "customer %s charged %d %s by %s, want %d %s", k.customer, p.Amount, p.Currency, p.ID, want.Amount, want.Currency)
				}
			}
			switch {
			case c.state != string(claim.StateSucceeded):
				l.problem(&l.Mismatches, "customer %s charged by %s for %s without a succeeded claim (state %q)", k.customer, ps[0].ID, period, c.state)
			case !slices.ContainsFunc(ps, func(p billingtest.Payment) bool { return p.ID == c.stripeID }):
				l.problem(&l.Mismatches, "customer %s, %s: succeeded claim names %s, not a paid charge of the customer", k.customer, period, c.stripeID)
			}
		}
	}
	for k, c := range claims {
		l.problem(&l.Mismatches, "claim for unknown customer %s, period %q (state %q)", k.customer, k.period, c.state)
	}
}

// toLedger is what the oracle needs of the fake's payments, in order.
func toLedger(payments []billingtest.Payment) []ledger.Payment {
	out := make([]ledger.Payment, len(payments))
	for i, p := range payments {
		out[i] = ledger.Payment{Customer: p.Customer, Period: p.Period, Paid: p.Paid}
	}
	return out
}

var customerRE = regexp.MustCompile(`cus_[0-9]+|acct_[0-9]+|bo1_[0-9a-f]+`)

// evidence collects what happened to the first few customers (or
// accounts, or idempotency keys) named in problems: the fake's request
// log and every log line that names them.
func evidence(problems []string, reqs []billingtest.Entry, logDir string) []string {
	var out []string
	seen := map[string]bool{}
	logs, _ := filepath.Glob(filepath.Join(logDir, "*.log"))
	for _, p := range problems {
		cust := customerRE.FindString(p)
		if cust == "" || seen[cust] || len(seen) == 3 {
			continue
		}
		seen[cust] = true
		out = append(out, "== "+cust+": requests at the fake")
		for _, e := range reqs {
			if e.Customer == cust || e.Account == cust || e.IdempotencyKey == cust {
				out = append(out, fmt.Sprintf("%s %s %s key=%s status=%d replayed=%v fault=%q object=%s",
					e.Time.Format("15:04:05.000000"), e.Method, e.Path, e.IdempotencyKey, e.Status, e.Replayed, e.Fault, e.ObjectID))
			}
		}
		for _, name := range logs {
			data, err := os.ReadFile(name)
			if err != nil {
				continue
			}
			for _, line := range strings.Split(string(data), "\n") {
				if strings.Contains(line, `"`+cust+`"`) {
					out = append(out, filepath.Base(name)+": "+line)
				}
			}
		}
	}
	return out
}
