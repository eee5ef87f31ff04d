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

// PayoutReturned is the failure code of the payouts ReturnPayouts fails
// after they were paid.
const PayoutReturned = "account_closed"

// CreateAccounts connects one account at the fake for each customer of
// the run, in order (account i stands for customer i, and is owed
// Price(i)), and sets the platform's available balance to what the
// transfers to them come to, once each: a transfer made twice leaves the
// platform short of another. The declined customers' accounts are those
// whose payout ReturnPayouts fails after it was paid, as a bank returns
// one days later.
func (e *Env) CreateAccounts() []string {
	e.accounts = make([]string, e.s.Customers)
	var total int64
	for i := range e.accounts {
		e.accounts[i] = e.Fake.CreateAccount()
		total += Price(i).Amount
	}
	e.Fake.SetBalance("", Price(0).Currency, total)
	return e.accounts
}

// ReturnPayouts fails, as its bank would once it was paid, the payout of
// period of every declined customer's account (see CreateAccounts), with
// PayoutReturned: the fake emits payout.failed and puts the amount back in
// the account's balance. It returns how many it failed; a payout not paid
// is left as it is, for the check to report.
func (e *Env) ReturnPayouts(period string) (int, error) {
	n := 0
	for _, m := range e.Fake.Movements("payout") {
		i := e.accountIndex(m.Account)
		if i < 0 || !e.Declined[CustomerID(i)] || m.Metadata[billing.MetaPeriod] != period || m.Status != "paid" {
			continue
		}
		if err := e.Fake.Settle(m.ID, "failed", PayoutReturned); err != nil {
			return n, e.Errorf("returning payout %s of %s: %w", m.ID, m.Account, err)
		}
		n++
	}
	return n, nil
}

// accountIndex is the customer account stands for, or -1.
func (e *Env) accountIndex(account string) int {
	if e.accountIdx == nil {
		e.accountIdx = make(map[string]int, len(e.accounts))
		for i, a := range e.accounts {
			e.accountIdx[a] = i
		}
	}
	if i, ok := e.accountIdx[account]; ok {
		return i
	}
	return -1
}

// CheckMoneyOut is Check for a run that, for period, transfers Price(i)
// to each account of CreateAccounts and then pays it out of the account's
// balance: it closes the fake and counts the transfers and payouts there.
// Each account must have exactly one transfer of its price (found by its
// destination and billonce's transfer group and metadata) and exactly one
// payout on the account (by its metadata), paid, with succeeded claims
// naming them; a declined customer's account has its one payout failed
// with PayoutReturned (ReturnPayouts), and its payout claim failed naming
// it. More than one of either is a duplicate, none is missing. Any other
// transfer, payout or claim is a mismatch, and so is a transfer or payout
// Stripe refused (HTTP 400: a payout sent before its transfer, or a
// transfer past the platform's balance), a platform balance left over, or
// an account balance other than 0 (the amount of a returned payout, for a
// declined customer's). Reports counts the transfers made once, Paid the
// payouts paid once, Declined the payouts returned.
func (e *Env) CheckMoneyOut(ctx context.Context, period string) (Ledger, error) {
	e.Fake.Close()
	st := e.Fake.Stats()
	l := Ledger{Faults: st.Faults, Requests: st.Requests, Replays: st.Replays}
	claims, err := loadClaims(ctx, e.Pool, &l)
	if err != nil {
		return l, e.Errorf("reading claims: %w", err)
	}
	group := "billonce " + billing.DefaultScope + " " + period
	transfers := map[string][]billingtest.Movement{} // by destination
	for _, m := range e.Fake.Movements("transfer") {
		if e.accountIndex(m.Destination) < 0 || m.TransferGroup != group || m.Metadata[billing.MetaCustomer] != m.Destination ||
			m.Metadata[billing.MetaPeriod] != period || m.Metadata[billing.MetaKey] == "" {
			l.problem(&l.Mismatches, "transfer %s to %s (group %q, metadata %v) was not asked for", m.ID, m.Destination, m.TransferGroup, m.Metadata)
			continue
		}
		transfers[m.Destination] = append(transfers[m.Destination], m)
	}
	payouts := map[string][]billingtest.Movement{} // by account
	for _, m := range e.Fake.Movements("payout") {
		if e.accountIndex(m.Account) < 0 || m.Metadata[billing.MetaCustomer] != m.Account ||
			m.Metadata[billing.MetaPeriod] != period || m.Metadata[billing.MetaKey] == "" {
			l.problem(&l.Mismatches, "payout %s on %q (metadata %v) was not asked for", m.ID, m.Account, m.Metadata)
			continue
		}
		payouts[m.Account] = append(payouts[m.Account], m)
	}
	var platformOut int64
	for i, a := range e.accounts {
		want := Price(i)
		platformOut += want.Amount
		returned := e.Declined[CustomerID(i)]
		tc, tClaimed := claims[key{"transfer " + period, a}]
		pc, pClaimed := claims[key{"payout " + period, a}]
		delete(claims, key{"transfer " + period, a})
		delete(claims, key{"payout " + period, a})
		at := fmt.Sprintf("account %s (customer %s)", a, CustomerID(i))
		once := func(what string, ms []billingtest.Movement, c claimRow, claimed bool) (billingtest.Movement, bool) {
			switch {
			case len(ms) == 0:
				l.problem(&l.Missing, "%s: no %s at Stripe; claim %q (claimed %v)", at, what, c.state, claimed)
				return billingtest.Movement{}, false
			case len(ms) > 1:
				l.Duplicates += len(ms) - 1
				var ids []string
				for _, m := range ms {
					ids = append(ids, fmt.Sprintf("%s (%s %d, key %s)", m.ID, m.Status, m.Amount, m.IdempotencyKey))
				}
				l.note("%s: %d %ss: %s", at, len(ms), what, strings.Join(ids, ", "))
				return billingtest.Movement{}, false
			}
			m := ms[0]
			if m.Amount != want.Amount || m.Currency != want.Currency {
				l.problem(&l.Mismatches, "%s: %s %s is %d %s, want %d %s", at, what, m.ID, m.Amount, m.Currency, want.Amount, want.Currency)
			}
			return m, true
		}
		tr, tOK := once("transfer", transfers[a], tc, tClaimed)
		po, pOK := once("payout", payouts[a], pc, pClaimed)
		delete(transfers, a)
		delete(payouts, a)
		if tOK {
			if tc.state != string(claim.StateSucceeded) || tc.stripeID != tr.ID {
				l.problem(&l.Mismatches, "%s: transfer claim %q names %q, want succeeded naming %s", at, tc.state, tc.stripeID, tr.ID)
			} else {
				l.Reports++
			}
		}
		wantPayout, wantClaim, balance := "paid", claim.StateSucceeded, int64(0)
		if returned {
			wantPayout, wantClaim, balance = "failed", claim.StateFailed, want.Amount
		}
		if pOK {
			switch {
			case po.Status != wantPayout || returned && po.FailureCode != PayoutReturned:
				l.problem(&l.Mismatches, "%s: payout %s is %s (failure code %q), want %s", at, po.ID, po.Status, po.FailureCode, wantPayout)
			case pc.state != string(wantClaim) || pc.stripeID != po.ID:
				l.problem(&l.Mismatches, "%s: payout claim %q names %q, want %s naming %s", at, pc.state, pc.stripeID, wantClaim, po.ID)
			case returned:
				l.Declined++
			default:
				l.Paid++
			}
		}
		if got := e.Fake.Balance(a, want.Currency); got != balance {
			l.problem(&l.Mismatches, "%s: balance %d %s at the end, want %d", at, got, want.Currency, balance)
		}
	}
	if got := e.Fake.Balance("", Price(0).Currency); got != 0 {
		l.problem(&l.Mismatches, "the platform's balance is %d at the end, want 0: it was funded with the %d the transfers come to", got, platformOut)
	}
	for a, ms := range transfers {
		l.problem(&l.Mismatches, "%d transfers to %s, not an account of the run", len(ms), a)
	}
	for a, ms := range payouts {
		l.problem(&l.Mismatches, "%d payouts on %s, not an account of the run", len(ms), a)
	}
	for k, c := range claims {
		l.problem(&l.Mismatches, "claim for %s, period %q (state %q), not a transfer or payout of the run", k.customer, k.period, c.state)
	}
	for _, r := range e.Fake.Log() {
		if r.Method == http.MethodPost && (r.Path == "/v1/transfers" || r.Path == "/v1/payouts") && r.Status == http.StatusBadRequest {
			l.problem(&l.Mismatches, "Stripe refused the %s of key %s (HTTP 400, account %q)", strings.TrimSuffix(strings.TrimPrefix(r.Path, "/v1/"), "s"), r.IdempotencyKey, r.Account)
		}
	}
	if !l.OK() {
		l.Evidence = evidence(l.Problems, e.Fake.Log(), e.LogDir)
	}
	return l, nil
}
