package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// cmdRebill bills one customer again for a period, under a new attempt
// number and so a new key: a person's decision after a decline, a failed
// bank debit or a refund. It prints what it will do, and does it only with
// -yes. The price, and the connected account billed (-account), default
// to those of the customer's latest claim for the period.
func cmdRebill(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "rebill", "rebill -customer C -period P -attempt N [-amount N -currency C] [-account acct_…] [-yes] [flags]")
	var b biller
	b.register(f)
	customer := f.String("customer", "", "customer ID; required")
	period := f.String("period", "", "billing period; required")
	attempt := f.Int("attempt", 0, "the billing attempt: 2 for the first re-bill, then 3, ...; required")
	amount := f.Int64("amount", 0, "amount in the currency's smallest unit (default: the latest claim's)")
	currency := f.String("currency", "", "currency (default: the latest claim's)")
	pm := f.String("payment-method", "", "payment method, pm_… (payment_intents)")
	account := accountFlag(f, "the connected account (acct_…) to bill on (default: the latest claim's; the platform's own without one)")
	yes := f.Bool("yes", false, "bill; without it the command only prints what it would do")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := required("customer", *customer, "period", *period); err != nil {
		return err
	}
	if err := checkPeriod(*period, false); err != nil {
		return err
	}
	if *attempt < 2 {
		return usageError("-attempt %d: re-bills are numbered from 2 (attempt 1 is the run's charge); see billonce inspect -customer %s -period %s", *attempt, *customer, *period)
	}
	if err := checkAccount(f, *account); err != nil {
		return err
	}
	if f.set("amount") != f.set("currency") {
		return usageError("-amount and -currency go together: the re-bill's price; without either, it is the latest claim's")
	}
	if f.set("amount") {
		p := billing.Price{Amount: *amount, Currency: *currency, PaymentMethod: *pm}
		if err := p.Validate(billing.API(b.api)); err != nil {
			return usageError("%s", reason(err))
		}
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	var claims []claim.Claim
	if err := b.read(ctx, func(ctx context.Context) (err error) {
		claims, err = s.store.List(ctx, *period, *customer)
		return err
	}); err != nil {
		return err
	}
	var latest *claim.Claim
	for _, c := range claims {
		latest = &c
		fmt.Fprintf(a.stdout, "attempt %d: %s, %d %s%s, key %s %s\n", c.Attempt, c.State, c.Amount, c.Currency, onText(c.Account), c.Key, c.StripeID)
	}
	if latest != nil && !f.set("account") {
		*account = latest.Account
	}
	p := billing.Price{Amount: *amount, Currency: *currency, PaymentMethod: *pm}
	if latest != nil && !f.set("amount") && !f.set("currency") {
		p.Amount, p.Currency = latest.Amount, latest.Currency
	}
	if err := p.Validate(billing.API(b.api)); err != nil {
		return usageError("%s (give -amount and -currency)", reason(err))
	}
	key, err := s.biller.Key(*customer, *period, *attempt)
	if err != nil {
		return usageError("%s", reason(err))
	}
	keyText := "key " + key.String()
	if *account != "" {
		// Biller.Key is the platform's; a charge on a connected account
		// has a key of its own, on its receipt.
		keyText = "its key printed once billed"
	}
	fmt.Fprintf(a.stdout, "will charge customer %s %d %s for %s%s as attempt %d, %s\n", *customer, p.Amount, p.Currency, *period, onText(*account), *attempt, keyText)
	if !*yes {
		return usageError("nothing was charged: pass -yes to bill")
	}
	rc, err := s.biller.Rebill(ctx, *customer, *period, *attempt, &billing.ChargeOptions{Price: &p, Account: *account})
	if err != nil {
		fl := failureOf(*period, err)
		if errors.Is(err, billing.ErrDeclined) || errors.Is(err, billing.ErrOutcomeUnknown) || errors.Is(err, billing.ErrInProgress) {
			fmt.Fprintf(a.stdout, "not billed: %s (%s %s)\n", fl.Kind, fl.StripeCode, fl.Message)
			return errIncomplete
		}
		return err
	}
	fmt.Fprintf(a.stdout, "%s: %s, %d %s, key %s\n", rc.Outcome, rc.StripeID, rc.Amount, rc.Currency, rc.Key)
	return nil
}
