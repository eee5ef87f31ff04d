package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/billonce/billonce/billing"
)

// cmdTransfer and cmdPayout pay one connected account for a period, once
// per attempt: a transfer from the platform's balance, a payout of the
// account's balance to its bank. Each prints what it will do and does it
// only with -yes; the same command run again is the same transfer or
// payout.
func cmdTransfer(ctx context.Context, a *app, args []string) error {
	return moneyOutCommand(ctx, a, args, "transfer", "move from the platform's balance to")
}

func cmdPayout(ctx context.Context, a *app, args []string) error {
	return moneyOutCommand(ctx, a, args, "payout", "pay out of the balance of")
}

func moneyOutCommand(ctx context.Context, a *app, args []string, what, verb string) error {
	f := newFlags(a, what, what+" -account acct_… -period P -amount N -currency C [-attempt N] [-yes] [flags]")
	var b biller
	b.register(f)
	account := accountFlag(f, "the connected account (acct_…); required")
	period := f.String("period", "", "the period paid for; required")
	amount := f.Int64("amount", 0, "amount, in the currency's smallest unit; required")
	currency := f.String("currency", "", "currency, as usd; required")
	attempt := f.Int("attempt", 1, "the attempt: 2 and up only after the one before it failed")
	yes := f.Bool("yes", false, "pay; without it the command only prints what it would do")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := checkAccount(f, *account); err != nil {
		return err
	}
	if err := required("account", *account, "period", *period, "currency", *currency); err != nil {
		return err
	}
	if err := checkPeriod(*period, false); err != nil {
		return err
	}
	p := billing.Price{Amount: *amount, Currency: *currency}
	if err := p.Validate(billing.Charges); err != nil {
		return usageError("%s", reason(err))
	}
	if *attempt < 1 {
		return usageError("-attempt %d: attempts are numbered from 1", *attempt)
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	fmt.Fprintf(a.stdout, "will %s account %s %d %s for %s, attempt %d\n", verb, *account, p.Amount, p.Currency, *period, *attempt)
	if !*yes {
		return usageError("nothing was paid: pass -yes to %s", what)
	}
	pay := s.biller.Transfer
	if what == "payout" {
		pay = s.biller.Payout
	}
	rc, err := pay(ctx, *account, *period, p, &billing.MoneyOutOptions{Attempt: *attempt})
	switch {
	case errors.Is(err, billing.ErrInvalid):
		return usageError("%s", reason(err))
	case errors.Is(err, billing.ErrDeclined) || errors.Is(err, billing.ErrOutcomeUnknown) || errors.Is(err, billing.ErrInProgress):
		fl := failureOf(*period, err)
		fmt.Fprintf(a.stdout, "not paid: %s (%s %s)\n", fl.Kind, fl.StripeCode, fl.Message)
		return errIncomplete
	case err != nil:
		return err
	}
	state := ""
	if rc.Processing {
		state = " (on its way: its event or billonce reconcile settles it)"
	}
	fmt.Fprintf(a.stdout, "%s: %s, %d %s, attempt %d, key %s%s\n", rc.Outcome, rc.StripeID, rc.Amount, rc.Currency, rc.Attempt, rc.Key, state)
	return nil
}
