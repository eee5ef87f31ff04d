package main

import (
	"context"
	"fmt"

	"github.com/billonce/billonce/billing"
)

// cmdReconcile runs Biller.Reconcile under the scope's reconcile lock:
// every claim runners left pending, in every period, is resumed with its
// own key, or searched for in Stripe first once its key's window is over;
// payments processing for longer than SettleAfter are read from Stripe.
func cmdReconcile(ctx context.Context, a *app, args []string) (err error) {
	f := newFlags(a, "reconcile", "reconcile [-json] [-customers FILE] [flags]")
	var b biller
	b.register(f)
	asJSON := f.Bool("json", false, "print one JSON object")
	file := f.String("customers", "", "with -api payment_intents: the customers file, for the payment method of each claim resumed (claims record the amount, not the method)")
	if err := f.parse(args); err != nil {
		return err
	}
	started := false // see cmdRun
	defer func() {
		if !started {
			err = reportEarly(a, "reconcile", "", err, *asJSON)
		}
	}()
	var price func(context.Context, string, string) (billing.Price, error)
	if *file != "" {
		in, name, done, err := openInput(a, "customers", *file, "customers")
		if err != nil {
			return err
		}
		items, err := readCustomers(in, name, billing.API(b.api), nil, nil)
		done()
		if err != nil {
			return usageError("%v", err)
		}
		prices := make(map[string]billing.Price, len(items))
		for _, it := range items {
			prices[it.Customer] = *it.Price
		}
		price = func(_ context.Context, customer, _ string) (billing.Price, error) {
			p, ok := prices[customer]
			if !ok {
				return p, fmt.Errorf("customer %s is not in %s", customer, *file)
			}
			return p, nil
		}
	}
	s, err := b.open(ctx, price)
	if err != nil {
		return err
	}
	defer s.close()
	started = true
	sum, err := s.biller.Reconcile(ctx, &billing.ReconcileOptions{
		Lock:     s.guard,
		Progress: newProgress(a.stderr, "reconciling").update,
	})
	return report(a, "reconcile", "", sum, err, *asJSON)
}
