package main

import (
	"context"

	"github.com/billonce/billonce/billing"
)

// cmdReconcile runs Biller.Reconcile under the scope's reconcile lock:
// every claim runners left pending, in every period, is resumed with its
// own key, or searched for in Stripe first once its key's window is over;
// payments processing for longer than SettleAfter are read from Stripe.
func cmdReconcile(ctx context.Context, a *app, args []string) error {
	f := newFlags(a, "reconcile", "reconcile [-json] [flags]")
	var b biller
	b.register(f)
	asJSON := f.Bool("json", false, "print one JSON object")
	if err := f.parse(args); err != nil {
		return err
	}
	s, err := b.open(ctx, nil)
	if err != nil {
		return err
	}
	defer s.close()
	sum, err := s.biller.Reconcile(ctx, &billing.ReconcileOptions{
		Lock:     s.guard,
		Progress: newProgress(a.stderr, "reconciling").update,
	})
	return report(a, "reconcile", "", sum, err, *asJSON)
}
