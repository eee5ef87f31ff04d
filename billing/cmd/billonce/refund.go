package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/billonce/billonce/billing"
)

// cmdRefund refunds part or all of the payment that billed a customer for
// a period, once per refund id: the operator's name for the refund (an
// RMA, a ticket), which makes a second run of the same command the same
// refund. It prints what it will do, and does it only with -yes.
func cmdRefund(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "refund", "refund -customer C -period P -id ID -amount N [-yes] [flags]")
	var b biller
	b.register(f)
	customer := f.String("customer", "", "customer ID; required")
	period := f.String("period", "", "the billing period whose payment is refunded; required")
	id := f.String("id", "", "the refund's id, your name for it (an RMA, a ticket): the same id is the same refund; required")
	amount := f.Int64("amount", 0, "amount to refund, in the currency's smallest unit (the payment's currency); required")
	yes := f.Bool("yes", false, "refund; without it the command only prints what it would do")
	if err := f.parse(args); err != nil {
		return err
	}
	if err := required("customer", *customer, "period", *period, "id", *id); err != nil {
		return err
	}
	if err := checkPeriod(*period, false); err != nil {
		return err
	}
	if *amount <= 0 {
		return usageError("-amount %d: give the amount to refund, a positive number of the currency's smallest unit (cents)", *amount)
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	fmt.Fprintf(a.stdout, "will refund %d of customer %s's payment for %s, refund id %s\n", *amount, *customer, *period, *id)
	if !*yes {
		return usageError("nothing was refunded: pass -yes to refund")
	}
	rc, err := s.biller.Refund(ctx, *customer, *period, *id, *amount)
	switch {
	case errors.Is(err, billing.ErrInvalid):
		return usageError("%s", reason(err))
	case errors.Is(err, billing.ErrDeclined) || errors.Is(err, billing.ErrOutcomeUnknown) || errors.Is(err, billing.ErrInProgress):
		fl := failureOf(*period, err)
		fmt.Fprintf(a.stdout, "not refunded: %s (%s %s)\n", fl.Kind, fl.StripeCode, fl.Message)
		return errIncomplete
	case err != nil:
		return err
	}
	state := ""
	if rc.Processing {
		state = " (pending at Stripe: its event or billonce reconcile settles it)"
	}
	fmt.Fprintf(a.stdout, "%s: %s, %d %s, key %s%s\n", rc.Outcome, rc.StripeID, rc.Amount, rc.Currency, rc.Key, state)
	return nil
}
