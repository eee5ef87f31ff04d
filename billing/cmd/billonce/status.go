package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimread"
)

// pendingJSON is a pending claim in status.
type pendingJSON struct {
	Customer   string    `json:"customer"`
	Account    string    `json:"account,omitempty"`
	Key        string    `json:"key"`
	Attempt    int       `json:"attempt"`
	AgeSeconds float64   `json:"age_seconds"`
	Owner      string    `json:"owner"`
	FreeAt     time.Time `json:"free_at"`
	Free       bool      `json:"free"`
	LastError  string    `json:"last_error"`
	// StripeID and Step: the invoice a pending invoice claim builds on,
	// once a call that gave up part way recorded it, and the last step
	// recorded, if any (see claim.Claim.Step).
	StripeID string `json:"stripe_id,omitempty"`
	Step     string `json:"step,omitempty"`
}

// unsettledJSON is a processing payment in status.
type unsettledJSON struct {
	Customer          string    `json:"customer"`
	Account           string    `json:"account,omitempty"`
	Key               string    `json:"key"`
	StripeID          string    `json:"stripe_id"`
	ProcessingSince   time.Time `json:"processing_since"`
	ProcessingSeconds float64   `json:"processing_seconds"`
}

// movesJSON is one kind of the claims made for a period beside its
// bills: its refunds and credit notes, its transfers, or its payouts.
type movesJSON struct {
	Count  int            `json:"count"`
	States map[string]int `json:"states"`
	// Amounts is what the succeeded ones moved, per currency: refunded,
	// transferred or paid out.
	Amounts map[string]int64 `json:"amounts"`
	// Pending are those not settled yet (pending, or processing at
	// Stripe), Failed those that failed: nothing was moved by them.
	Pending []moveJSON `json:"pending"`
	Failed  []moveJSON `json:"failed"`
}

// moveJSON is one refund, credit note, transfer or payout in status.
type moveJSON struct {
	Kind     string `json:"kind"`
	Customer string `json:"customer"`
	Account  string `json:"account,omitempty"`
	Period   string `json:"period"`
	Key      string `json:"key"`
	Attempt  int    `json:"attempt"`
	State    string `json:"state"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	StripeID string `json:"stripe_id"`
	// RefundOf is, for a refund or credit note, the key of the payment's
	// claim it refunds.
	RefundOf string `json:"refund_of,omitempty"`
	// StripeCode is, on a failed one, why: Stripe's refusal code, or the
	// failure code of one that failed after it was pending.
	StripeCode string `json:"stripe_code,omitempty"`
	LastError  string `json:"last_error,omitempty"`
}

func newMoves() movesJSON {
	return movesJSON{States: map[string]int{}, Amounts: map[string]int64{}, Pending: []moveJSON{}, Failed: []moveJSON{}}
}

// add counts c among m.
func (m *movesJSON) add(c claim.Claim) {
	m.Count++
	m.States[string(c.State)]++
	mv := moveJSON{Kind: kindOf(c), Customer: c.Customer, Account: c.Account, Period: c.Period, Key: c.Key, Attempt: c.Attempt, State: string(c.State),
		Amount: c.Amount, Currency: c.Currency, StripeID: c.StripeID, RefundOf: c.RefundOf, LastError: c.LastError}
	switch c.State {
	case claim.StateSucceeded:
		m.Amounts[c.Currency] += c.Amount
	case claim.StateFailed:
		mv.StripeCode = claimFailure(c).StripeCode
		m.Failed = append(m.Failed, mv)
	default:
		m.Pending = append(m.Pending, mv)
	}
}

// statusJSON is what status -json prints.
type statusJSON struct {
	Period string `json:"period"`
	// Account, with -account, is the connected account shown: the
	// claims on it, and the transfers to it.
	Account   string          `json:"account,omitempty"`
	States    map[string]int  `json:"states"`
	Pending   []pendingJSON   `json:"pending"`
	Unsettled []unsettledJSON `json:"unsettled"`
	Failures  []failure       `json:"failures"`
	// Unclaimed, with -customers, are the file's customers that have no
	// claim for the period, in the file's order.
	Unclaimed []string `json:"unclaimed,omitzero"`
	// Refunds are the refunds and credit notes of the period's payments,
	// Transfers and Payouts the money paid to connected accounts for it.
	Refunds   movesJSON `json:"refunds"`
	Transfers movesJSON `json:"transfers"`
	Payouts   movesJSON `json:"payouts"`
}

// cmdStatus shows a period's claims: how many in each state, the pending
// ones with their age, owner and when their lease frees them, the
// payments processing for longer than -settle-after, and the failures
// with their kind and Stripe code; beside them, the period's refunds and
// credit notes, transfers and payouts, each kind with its count, what
// the succeeded ones moved per currency, and those pending or failed.
// With -account, only the claims on that connected account, and the
// transfers to it. With -customers, it also names the customers of the
// run's file that have no claim at all: those a run stopped or killed
// before reaching. It reads the period's claims in one query.
func cmdStatus(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "status", "status -period P [-account acct_…] [-customers FILE] [-json] [-settle-after D]")
	var c conn
	c.register(f)
	period := f.String("period", "", "billing period; required")
	settleAfter := f.Duration("settle-after", billing.DefaultSettleAfter, "list processing payments older than this (the Biller's SettleAfter)")
	asJSON := f.Bool("json", false, "print one JSON object")
	file := f.String("customers", "", "the run's customers file (- reads standard input): name its customers that have no claim for the period")
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
	var ids []string
	name := *file
	if *file != "" {
		in, n, done, err := openInput(a, "customers", *file, "customers")
		if err != nil {
			return err
		}
		defer done()
		name = n
		if ids, err = readCustomerIDs(in, name); err != nil {
			return usageError("%v", err)
		}
	}
	pool, store, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var st *statusJSON
	err = c.read(ctx, func(ctx context.Context) (err error) {
		if st, err = statusOf(ctx, store, *period, *account, *settleAfter); err != nil || ids == nil {
			return err
		}
		st.Unclaimed, err = claimread.Unclaimed(ctx, pool, claim.DefaultTable, *period, ids)
		return err
	})
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	w := a.stdout
	fmt.Fprintf(w, "period %s%s\n", st.Period, onText(st.Account))
	for _, s := range []claim.State{claim.StateSucceeded, claim.StateProcessing, claim.StatePending, claim.StateFailed} {
		fmt.Fprintf(w, "  %-10s %6d\n", s, st.States[string(s)])
	}
	for _, m := range []struct {
		what, moved string
		m           movesJSON
	}{{"refunds and credit notes", "refunded", st.Refunds}, {"transfers", "transferred", st.Transfers}, {"payouts", "paid out", st.Payouts}} {
		printMoves(w, m.what, m.moved, m.m)
	}
	switch {
	case ids == nil:
	case len(st.Unclaimed) == 0:
		fmt.Fprintf(w, "every one of the %d customers of %s has a claim\n", len(ids), name)
	default:
		fmt.Fprintf(w, "no claim, never reached by a run: %d of the %d customers of %s\n", len(st.Unclaimed), len(ids), name)
		for _, c := range st.Unclaimed {
			fmt.Fprintf(w, "  %s\n", c)
		}
	}
	if len(st.Pending) > 0 {
		fmt.Fprintln(w, "pending:")
		for _, p := range st.Pending {
			free := "free now: the next run or reconcile resumes it with its key"
			if !p.Free {
				free = fmt.Sprintf("held by %s until %s", p.Owner, p.FreeAt.Local().Format(time.DateTime))
			}
			fmt.Fprintf(w, "  %s attempt %d, key %s, %s old, %s", p.Customer, p.Attempt, p.Key, (time.Duration(p.AgeSeconds) * time.Second).String(), free)
			if p.StripeID != "" {
				fmt.Fprintf(w, "; invoice %s", p.StripeID)
				if p.Step != "" {
					fmt.Fprintf(w, ", last step recorded: %s", p.Step)
				}
			}
			if p.LastError != "" {
				fmt.Fprintf(w, "; last: %s", p.LastError)
			}
			fmt.Fprintln(w)
		}
	}
	if len(st.Unsettled) > 0 {
		fmt.Fprintf(w, "processing for more than %s (reconcile reads them from Stripe):\n", *settleAfter)
		for _, u := range st.Unsettled {
			fmt.Fprintf(w, "  %s %s, key %s, since %s\n", u.Customer, u.StripeID, u.Key, u.ProcessingSince.Local().Format(time.DateTime))
		}
	}
	if len(st.Failures) > 0 {
		fmt.Fprintln(w, "failures:")
		for _, fl := range st.Failures {
			fmt.Fprintf(w, "  %s attempt %d: %s", fl.Customer, fl.Attempt, fl.Kind)
			if fl.StripeCode != "" {
				fmt.Fprintf(w, " (%s)", fl.StripeCode)
			}
			fmt.Fprintf(w, ": %s\n", fl.Message)
		}
	}
	return nil
}

// printMoves prints one kind of the claims made for the period, if it
// has any.
func printMoves(w io.Writer, what, moved string, m movesJSON) {
	if m.Count == 0 {
		return
	}
	fmt.Fprintf(w, "%s: %d", what, m.Count)
	for _, s := range []claim.State{claim.StateSucceeded, claim.StateProcessing, claim.StatePending, claim.StateFailed} {
		if n := m.States[string(s)]; n > 0 {
			fmt.Fprintf(w, ", %s %d", s, n)
		}
	}
	fmt.Fprintln(w)
	for _, cur := range slices.Sorted(maps.Keys(m.Amounts)) {
		fmt.Fprintf(w, "  %s %d %s\n", moved, m.Amounts[cur], cur)
	}
	for _, l := range []struct {
		name string
		mvs  []moveJSON
	}{{"not settled", m.Pending}, {"failed", m.Failed}} {
		for _, mv := range l.mvs {
			fmt.Fprintf(w, "  %s: %s %s%s, %s %d %s, key %s", l.name, mv.Kind, mv.Customer, onText(mv.Account), mv.State, mv.Amount, mv.Currency, mv.Key)
			if mv.StripeID != "" {
				fmt.Fprintf(w, ", Stripe %s", mv.StripeID)
			}
			if mv.StripeCode != "" {
				fmt.Fprintf(w, " (%s)", mv.StripeCode)
			}
			if mv.LastError != "" {
				fmt.Fprintf(w, ": %s", mv.LastError)
			}
			fmt.Fprintln(w)
		}
	}
}

// statusOf reads the claims of period and those made for it, of account
// when it is not "", in one query, and sums them up. The database's
// clock, on which leases are measured, is read off the claims
// themselves: each one's Age is the time since its CreatedAt on that
// clock, at the query.
func statusOf(ctx context.Context, store *claim.Postgres, period, account string, settleAfter time.Duration) (*statusJSON, error) {
	periods, prefixes := periodClaims(period)
	claims, err := store.ListPeriods(ctx, periods, prefixes, "")
	if err != nil {
		return nil, err
	}
	st := &statusJSON{Period: period, Account: account, States: map[string]int{}, Pending: []pendingJSON{}, Unsettled: []unsettledJSON{}, Failures: []failure{},
		Refunds: newMoves(), Transfers: newMoves(), Payouts: newMoves()}
	for _, s := range []claim.State{claim.StateSucceeded, claim.StateProcessing, claim.StatePending, claim.StateFailed} {
		st.States[string(s)] = 0
	}
	for _, c := range claims {
		if !onAccount(c, account) {
			continue
		}
		if c.Period != period {
			switch kindOf(c) {
			case kindTransfer:
				st.Transfers.add(c)
			case kindPayout:
				st.Payouts.add(c)
			default:
				st.Refunds.add(c)
			}
			continue
		}
		st.States[string(c.State)]++
		now := c.CreatedAt.Add(c.Age)
		switch c.State {
		case claim.StatePending:
			free := !c.LeaseUntil.After(now) || c.Owner == ""
			st.Pending = append(st.Pending, pendingJSON{Customer: c.Customer, Account: c.Account, Key: c.Key, Attempt: c.Attempt,
				AgeSeconds: c.Age.Round(time.Second).Seconds(), Owner: c.Owner, FreeAt: c.LeaseUntil.UTC(), Free: free, LastError: c.LastError, StripeID: c.StripeID, Step: c.Step})
			if c.LastError != "" {
				st.Failures = append(st.Failures, claimFailure(c))
			}
		case claim.StateProcessing:
			if since := now.Sub(c.ProcessingAt); since >= settleAfter {
				st.Unsettled = append(st.Unsettled, unsettledJSON{Customer: c.Customer, Account: c.Account, Key: c.Key, StripeID: c.StripeID,
					ProcessingSince: c.ProcessingAt.UTC(), ProcessingSeconds: since.Round(time.Second).Seconds()})
			}
		case claim.StateFailed:
			st.Failures = append(st.Failures, claimFailure(c))
		}
	}
	return st, nil
}
