package main

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimread"
)

// pendingJSON is a pending claim in status.
type pendingJSON struct {
	Customer   string    `json:"customer"`
	Key        string    `json:"key"`
	Attempt    int       `json:"attempt"`
	AgeSeconds float64   `json:"age_seconds"`
	Owner      string    `json:"owner"`
	FreeAt     time.Time `json:"free_at"`
	Free       bool      `json:"free"`
	LastError  string    `json:"last_error"`
	// StripeID and Step: the invoice a pending invoice claim builds on,
	// and its last step done.
	StripeID string `json:"stripe_id,omitempty"`
	Step     string `json:"step,omitempty"`
}

// unsettledJSON is a processing payment in status.
type unsettledJSON struct {
	Customer          string    `json:"customer"`
	Key               string    `json:"key"`
	StripeID          string    `json:"stripe_id"`
	ProcessingSince   time.Time `json:"processing_since"`
	ProcessingSeconds float64   `json:"processing_seconds"`
}

// statusJSON is what status -json prints.
type statusJSON struct {
	Period    string          `json:"period"`
	States    map[string]int  `json:"states"`
	Pending   []pendingJSON   `json:"pending"`
	Unsettled []unsettledJSON `json:"unsettled"`
	Failures  []failure       `json:"failures"`
	// Unclaimed, with -customers, are the file's customers that have no
	// claim for the period, in the file's order.
	Unclaimed []string `json:"unclaimed,omitzero"`
}

// cmdStatus shows a period's claims: how many in each state, the pending
// ones with their age, owner and when their lease frees them, the
// payments processing for longer than -settle-after, and the failures
// with their kind and Stripe code. With -customers, it also names the
// customers of the run's file that have no claim at all: those a run
// stopped or killed before reaching. It only reads.
func cmdStatus(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "status", "status -period P [-customers FILE] [-json] [-settle-after D]")
	var c conn
	c.register(f)
	period := f.String("period", "", "billing period; required")
	settleAfter := f.Duration("settle-after", billing.DefaultSettleAfter, "list processing payments older than this (the Biller's SettleAfter)")
	asJSON := f.Bool("json", false, "print one JSON object")
	file := f.String("customers", "", "the run's customers file (- reads standard input): name its customers that have no claim for the period")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := checkPeriod(*period, true); err != nil {
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
		if st, err = statusOf(ctx, pool, store, *period, *settleAfter); err != nil || ids == nil {
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
	fmt.Fprintf(w, "period %s\n", st.Period)
	for _, s := range []claim.State{claim.StateSucceeded, claim.StateProcessing, claim.StatePending, claim.StateFailed} {
		fmt.Fprintf(w, "  %-10s %6d\n", s, st.States[string(s)])
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
			if p.Step != "" {
				fmt.Fprintf(w, "; invoice %s, last step done: %s", p.StripeID, p.Step)
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

func statusOf(ctx context.Context, pool *pgxpool.Pool, store *claim.Postgres, period string, settleAfter time.Duration) (*statusJSON, error) {
	counts, err := store.Count(ctx, period)
	if err != nil {
		return nil, err
	}
	now, err := claimread.Now(ctx, pool)
	if err != nil {
		return nil, err
	}
	st := &statusJSON{Period: period, States: map[string]int{}, Pending: []pendingJSON{}, Unsettled: []unsettledJSON{}, Failures: []failure{}}
	for _, s := range []claim.State{claim.StateSucceeded, claim.StateProcessing, claim.StatePending, claim.StateFailed} {
		st.States[string(s)] = counts[s]
	}
	if counts[claim.StatePending]+counts[claim.StateProcessing]+counts[claim.StateFailed] == 0 {
		return st, nil
	}
	claims, err := store.List(ctx, period, "")
	if err != nil {
		return nil, err
	}
	for _, c := range claims {
		switch c.State {
		case claim.StatePending:
			free := !c.LeaseUntil.After(now) || c.Owner == ""
			st.Pending = append(st.Pending, pendingJSON{Customer: c.Customer, Key: c.Key, Attempt: c.Attempt,
				AgeSeconds: c.Age.Round(time.Second).Seconds(), Owner: c.Owner, FreeAt: c.LeaseUntil.UTC(), Free: free, LastError: c.LastError, StripeID: c.StripeID, Step: c.Step})
			if c.LastError != "" {
				st.Failures = append(st.Failures, claimFailure(c))
			}
		case claim.StateProcessing:
			if since := now.Sub(c.ProcessingAt); since >= settleAfter {
				st.Unsettled = append(st.Unsettled, unsettledJSON{Customer: c.Customer, Key: c.Key, StripeID: c.StripeID,
					ProcessingSince: c.ProcessingAt.UTC(), ProcessingSeconds: since.Round(time.Second).Seconds()})
			}
		case claim.StateFailed:
			st.Failures = append(st.Failures, claimFailure(c))
		}
	}
	return st, nil
}
