package chaos

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// Refund is one refund of a customer's payment for the period: its refund
// id and amount.
type Refund struct {
	ID     string
	Amount int64
	// Past: with the refunds before it, more than the payment. billonce
	// refuses it (ErrInvalid) before anything is sent, once those before
	// it are claimed.
	Past bool
}

// Refunds are the refunds customer i is given of its payment, asked for
// in this order: three partial ones (the first two of one amount for two
// customers in three), then one that with them comes to more than
// Price(i).
func Refunds(i int) []Refund {
	p := Price(i).Amount
	part := func(pct int) int64 { return max(1, p*int64(pct)/100) }
	first := part(10 + i%21)
	second := first
	if i%3 == 0 {
		second = part(5 + i%11)
	}
	out := []Refund{{"rma-1", first, false}, {"rma-2", second, false}, {"rma-3", part(5 + i%7), false}}
	left := p
	for _, r := range out {
		left -= r.Amount
	}
	return append(out, Refund{"rma-past", left + 1 + int64(i%50), true})
}

// CheckRefunds is Check for a run that charges every customer for period
// and then refunds each by Refunds: it closes the fake, checks the charges
// as Check does, and counts the refunds at the fake. Each refund of a
// customer charged must be there exactly once (Duplicates, Missing: by
// its metadata billonce_refund), at its amount, succeeded, refunding the
// customer's payment, with a succeeded claim naming it; the one past the
// payment must be neither at the fake nor claimed, a declined customer
// must have no refund, a payment's refunds must never come to more than
// it, Stripe must have refused no refund billonce sent, and every refund
// claim must be settled: anything else is a mismatch. Reports counts the
// refunds made once.
func (e *Env) CheckRefunds(ctx context.Context, period string) (Ledger, error) {
	e.Fake.Close()
	st := e.Fake.Stats()
	l := Ledger{Faults: st.Faults, Requests: st.Requests, Replays: st.Replays}
	claims, err := loadClaims(ctx, e.Pool, &l)
	if err != nil {
		return l, e.Errorf("reading claims: %w", err)
	}
	refundClaims := map[key]claimRow{}
	for k, c := range claims {
		if _, id, ok := strings.Cut(k.period, " refund "); ok {
			refundClaims[key{id, k.customer}] = c
			delete(claims, k)
		}
	}
	payments := e.Fake.Payments()
	verify(period, map[string]int{period: e.s.Customers}, payments, claims, e.Declined, &l)
	paid := map[string]billingtest.Payment{}
	for _, p := range payments {
		if p.Paid && p.Period == period {
			paid[p.Customer] = p
		}
	}
	refunds := map[key][]billingtest.Movement{} // by refund id and customer
	for _, m := range e.Fake.Movements("refund") {
		id, c := m.Metadata["billonce_refund"], m.Metadata[billing.MetaCustomer]
		if id == "" || c == "" || m.Metadata[billing.MetaPeriod] != period {
			l.problem(&l.Mismatches, "refund %s of %s (metadata %v) was not asked for", m.ID, m.Of, m.Metadata)
			continue
		}
		refunds[key{id, c}] = append(refunds[key{id, c}], m)
	}
	for i := range e.s.Customers {
		c := CustomerID(i)
		p := paid[c]
		var live int64
		for _, r := range Refunds(i) {
			k := key{r.ID, c}
			ms, cl := refunds[k], refundClaims[k]
			_, claimed := refundClaims[k]
			delete(refunds, k)
			delete(refundClaims, k)
			for _, m := range ms {
				if m.Status != "failed" && m.Status != "canceled" {
					live += m.Amount
				}
			}
			at := fmt.Sprintf("customer %s, refund %s", c, r.ID)
			switch {
			case e.Declined[c] && (len(ms) > 0 || claimed):
				l.problem(&l.Mismatches, "%s: the customer was never charged, yet %d refunds at Stripe, claim %q", at, len(ms), cl.state)
			case e.Declined[c]:
			case r.Past && len(ms) > 0:
				l.problem(&l.Mismatches, "%s: past the payment, yet refunded at Stripe by %s (%s %d); claim %q", at, ms[0].ID, ms[0].Status, ms[0].Amount, cl.state)
			case r.Past && claimed:
				l.problem(&l.Mismatches, "%s: past the payment, yet claimed (%q)", at, cl.state)
			case r.Past:
			case len(ms) == 0:
				l.problem(&l.Missing, "%s: never refunded at Stripe; claim %q", at, cl.state)
			case len(ms) > 1:
				l.Duplicates += len(ms) - 1
				var ids []string
				for _, m := range ms {
					ids = append(ids, fmt.Sprintf("%s (%s %d, key %s)", m.ID, m.Status, m.Amount, m.IdempotencyKey))
				}
				l.note("%s: refunded %d times: %s", at, len(ms), strings.Join(ids, ", "))
			default:
				m := ms[0]
				if m.Amount != r.Amount || m.Status != "succeeded" || m.Of != p.ID {
					l.problem(&l.Mismatches, "%s: %s is %s %d of %s, want succeeded %d of the payment %s", at, m.ID, m.Status, m.Amount, m.Of, r.Amount, p.ID)
				}
				if cl.state != string(claim.StateSucceeded) || cl.stripeID != m.ID {
					l.problem(&l.Mismatches, "%s: claim %q names %q, want succeeded naming %s", at, cl.state, cl.stripeID, m.ID)
				}
				l.Reports++
			}
		}
		if live > p.Amount || p.AmountRefunded > p.Amount {
			l.problem(&l.Mismatches, "customer %s: payment %s of %d refunded %d (amount_refunded %d), more than it", c, p.ID, p.Amount, live, p.AmountRefunded)
		}
	}
	for k, ms := range refunds {
		l.problem(&l.Mismatches, "%d refunds %s of customer %s, not among its refunds", len(ms), k.period, k.customer)
	}
	for k, c := range refundClaims {
		l.problem(&l.Mismatches, "refund claim %s of customer %s (state %q), not among its refunds", k.period, k.customer, c.state)
	}
	for _, r := range e.Fake.Log() {
		if r.Method == http.MethodPost && r.Path == "/v1/refunds" && r.Status == http.StatusBadRequest {
			l.problem(&l.Mismatches, "customer %s: Stripe refused refund key %s (HTTP 400): billonce sent a refund past what is left", r.Customer, r.IdempotencyKey)
		}
	}
	if !l.OK() {
		l.Evidence = evidence(l.Problems, e.Fake.Log(), e.LogDir)
	}
	return l, nil
}
