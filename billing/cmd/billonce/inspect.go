package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimread"
)

// claimJSON is a claim as inspect shows it.
type claimJSON struct {
	// Kind is what the claim is for: charge, invoice, meter_event,
	// refund, credit_note, transfer or payout.
	Kind     string `json:"kind"`
	Customer string `json:"customer"`
	// Account is the connected account the claim's key went to; "" for
	// the platform's own (where a transfer is made: its customer is the
	// account it pays).
	Account  string `json:"account,omitempty"`
	Period   string `json:"period"`
	Key      string `json:"key"`
	Attempt  int    `json:"attempt"`
	Scope    string `json:"scope"`
	State    string `json:"state"`
	Amount   int64  `json:"amount"`
	Currency string `json:"currency"`
	StripeID string `json:"stripe_id"`
	// Step is an invoice's recovery point, if it has one ("line 2";
	// "draft" or "finalized" on claims of earlier versions; see
	// claim.Claim.Step); StripeID is then the invoice.
	Step           string     `json:"step,omitempty"`
	Endpoint       string     `json:"endpoint"`
	Credential     string     `json:"credential"`
	Owner          string     `json:"owner"`
	LeaseUntil     time.Time  `json:"lease_until"`
	Leases         int        `json:"leases"`
	LastError      string     `json:"last_error"`
	CreatedAt      time.Time  `json:"created_at"`
	FirstSentAt    time.Time  `json:"first_sent_at"`
	SentAgeSeconds float64    `json:"sent_age_seconds"`
	ReconciledAt   *time.Time `json:"reconciled_at,omitempty"`
	ProcessingAt   *time.Time `json:"processing_at,omitempty"`
	SettledAt      *time.Time `json:"settled_at,omitempty"`
	FailureCode    string     `json:"failure_code"`
	Refunded       int64      `json:"refunded"`
	// RefundOf is, on a refund's or credit note's claim, the key of the
	// payment claim it refunds.
	RefundOf  string            `json:"refund_of,omitempty"`
	Dispute   string            `json:"dispute"`
	UpdatedAt time.Time         `json:"updated_at"`
	Events    []claimread.Event `json:"events"`
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func toClaimJSON(c claim.Claim, evs []claimread.Event) claimJSON {
	if evs == nil {
		evs = []claimread.Event{}
	}
	return claimJSON{Kind: kindOf(c), Customer: c.Customer, Account: c.Account, RefundOf: c.RefundOf, Period: c.Period, Key: c.Key, Attempt: c.Attempt, Scope: c.Scope, State: string(c.State),
		Amount: c.Amount, Currency: c.Currency, StripeID: c.StripeID, Step: c.Step, Endpoint: c.Endpoint, Credential: c.Credential,
		Owner: c.Owner, LeaseUntil: c.LeaseUntil.UTC(), Leases: c.Leases, LastError: c.LastError, CreatedAt: c.CreatedAt.UTC(),
		FirstSentAt: c.FirstSentAt.UTC(), SentAgeSeconds: c.SentAge.Round(time.Second).Seconds(), ReconciledAt: optTime(c.ReconciledAt),
		ProcessingAt: optTime(c.ProcessingAt), SettledAt: optTime(c.SettledAt), FailureCode: c.FailureCode, Refunded: c.Refunded,
		Dispute: c.Dispute, UpdatedAt: c.UpdatedAt.UTC(), Events: evs}
}

// cmdInspect shows one claim, by its key; or every attempt of a customer
// for a period, with the customer's refunds and credit notes of the
// period's payments; or a connected account's transfers and payouts for
// a period: each claim's state, its account, where its key went (the
// endpoint and the fingerprint of the credential that sent it), its
// Stripe ids and the Stripe events applied to it. It only reads: the
// claims in one query, their events in one more.
func cmdInspect(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "inspect", "inspect (-key K | -customer C -period P [-account acct_…] | -account acct_… -period P) [-json]")
	var c conn
	c.register(f)
	key := f.String("key", "", "the claim's idempotency key")
	customer := f.String("customer", "", "a customer ID, with -period: its claims and refunds of the period")
	period := f.String("period", "", "a billing period, with -customer or -account")
	account := accountFlag(f, "a connected account (acct_…), with -period: its transfers and payouts for the period; with -customer too, only the customer's claims on it")
	asJSON := f.Bool("json", false, "print a JSON array of claims")
	if err := f.parse(args); err != nil {
		return err
	}
	if (*key == "") == (*customer == "" && *period == "" && !f.set("account")) {
		return usageError("give -key, or -customer and -period, or -account and -period")
	}
	if *key == "" {
		if *customer == "" && !f.set("account") {
			return usageError("-customer or -account required with -period")
		}
		if err := checkPeriod(*period, true); err != nil {
			return err
		}
		if err := checkAccount(f, *account); err != nil {
			return err
		}
	}
	pool, store, err := c.store(ctx)
	if err != nil {
		return err
	}
	defer pool.Close()
	var out []claimJSON
	if err := c.read(ctx, func(ctx context.Context) (err error) {
		out, err = inspected(ctx, pool, store, *key, *customer, *account, *period)
		return err
	}); err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(a.stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	w := a.stdout
	for i, c := range out {
		if i > 0 {
			fmt.Fprintln(w)
		}
		fmt.Fprintf(w, "claim %s\n  %s, customer %s%s, period %s, attempt %d, scope %q\n  state %s, ",
			c.Key, c.Kind, c.Customer, onText(c.Account), c.Period, c.Attempt, c.Scope, c.State)
		switch c.Kind {
		case kindMeterEvent:
			// A usage report's amount is the quantity reported; its
			// Stripe id is the meter event's identifier, the key.
			fmt.Fprintf(w, "value %d", c.Amount)
		case kindRefund, kindCreditNote, kindTransfer, kindPayout:
			fmt.Fprintf(w, "%s of %d %s", strings.ReplaceAll(c.Kind, "_", " "), c.Amount, c.Currency)
			if c.StripeID != "" {
				fmt.Fprintf(w, ", Stripe %s", c.StripeID)
			}
			if c.RefundOf != "" {
				fmt.Fprintf(w, ", of the payment of claim %s", c.RefundOf)
			}
		case kindInvoice:
			fmt.Fprintf(w, "invoice of %d %s", c.Amount, c.Currency)
			if c.StripeID != "" {
				fmt.Fprintf(w, ", Stripe %s", c.StripeID)
			}
			if c.Step != "" {
				fmt.Fprintf(w, ", last step recorded: %s", c.Step)
			}
		default:
			fmt.Fprintf(w, "%d %s", c.Amount, c.Currency)
			if c.StripeID != "" {
				fmt.Fprintf(w, ", Stripe %s", c.StripeID)
			}
		}
		fmt.Fprintf(w, "\n  key sent to %s with credential %s; first sent %s (%s ago)\n",
			orUnknown(c.Endpoint), orUnknown(c.Credential), c.FirstSentAt.Local().Format(time.DateTime), time.Duration(c.SentAgeSeconds)*time.Second)
		fmt.Fprintf(w, "  owner %q, lease until %s, leased %d times\n", c.Owner, c.LeaseUntil.Local().Format(time.DateTime), c.Leases)
		for _, l := range []struct {
			name string
			t    *time.Time
		}{{"reconciled", c.ReconciledAt}, {"processing since", c.ProcessingAt}, {"settled", c.SettledAt}} {
			if l.t != nil {
				fmt.Fprintf(w, "  %s %s\n", l.name, l.t.Local().Format(time.DateTime))
			}
		}
		if c.FailureCode != "" || c.Refunded != 0 || c.Dispute != "" {
			fmt.Fprintf(w, "  failure code %q, refunded %d, dispute %q\n", c.FailureCode, c.Refunded, c.Dispute)
		}
		if c.LastError != "" {
			fmt.Fprintf(w, "  last error: %s\n", c.LastError)
		}
		fmt.Fprintf(w, "  events applied: %d\n", len(c.Events))
		for _, e := range c.Events {
			fmt.Fprintf(w, "    %s %s %s %s: %s\n", e.Created.Local().Format(time.DateTime), e.ID, e.Type, e.StripeID, e.Result)
		}
	}
	return nil
}

// inspected reads the claim of key; or, when key is "", every claim of
// customer for period with its refunds, on account when it is not "";
// or, when customer is "" too, account's transfers and payouts for
// period. The events applied to each are read in one more query.
func inspected(ctx context.Context, pool *pgxpool.Pool, store *claim.Postgres, key, customer, account, period string) ([]claimJSON, error) {
	var claims []claim.Claim
	if key != "" {
		c, err := store.Get(ctx, key)
		if errors.Is(err, claim.ErrNotFound) {
			return nil, fmt.Errorf("no claim has the key %s", key)
		}
		if err != nil {
			return nil, err
		}
		claims = []claim.Claim{c}
	} else {
		periods, prefixes := periodClaims(period)
		who := "customer " + customer + onText(account)
		if customer == "" {
			// The account's own claims for the period: a transfer's
			// and a payout's customer is the account.
			periods, prefixes, customer, who = periods[1:], nil, account, "a transfer or payout to account "+account
		}
		all, err := store.ListPeriods(ctx, periods, prefixes, customer)
		if err != nil {
			return nil, err
		}
		for _, c := range all {
			if onAccount(c, account) {
				claims = append(claims, c)
			}
		}
		if len(claims) == 0 {
			return nil, fmt.Errorf("no claim for %s in period %s: billonce has never billed it", who, period)
		}
	}
	keys := make([]string, len(claims))
	for i, c := range claims {
		keys[i] = c.Key
	}
	evs, err := claimread.Events(ctx, pool, claim.DefaultTable, keys)
	if err != nil {
		return nil, err
	}
	out := make([]claimJSON, 0, len(claims))
	for _, c := range claims {
		out = append(out, toClaimJSON(c, evs[c.Key]))
	}
	return out, nil
}

// The endpoints of claims that are not a single payment.
const (
	endpointInvoices    = "invoices"
	endpointMeterEvents = "meter_events"
)

func orUnknown(s string) string {
	if s == "" {
		return "(unknown)"
	}
	return s
}
