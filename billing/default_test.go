package billing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// The package-level Charge without a default Biller is an invalid-input
// ChargeError that says what to call, and sends nothing; with one, it is
// that Biller's Charge, and calling it twice charges once.
func TestPackageChargeUsesTheDefault(t *testing.T) {
	// Not parallel: it sets the package's default.
	billing.SetDefault(nil)
	_, err := billing.Charge(context.Background(), "cus_1", period)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrInvalid) || !errors.As(err, &ce) || ce.Customer != "cus_1" {
		t.Fatalf("Charge without a default: %v; want a ChargeError wrapping ErrInvalid", err)
	}
	e := newEnv(t)
	billing.SetDefault(e.b)
	defer billing.SetDefault(nil)
	for range 2 {
		if _, err := billing.Charge(context.Background(), "cus_1", period); err != nil {
			t.Fatal(err)
		}
	}
	wantAllOnce(t, e.srv, []string{"cus_1"})
}

// Every failure a Run lists is a *ChargeError naming its customer, whatever
// went wrong: bad input, a repeat in a batch, a decline, a changed amount.
func TestRunFailuresAreChargeErrors(t *testing.T) {
	t.Parallel()
	e := newEnvWith(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	ctx := context.Background()
	if _, err := e.b.Charge(ctx, "cus_m", period, &billing.ChargeOptions{Price: &billing.Price{Amount: 100, Currency: "usd"}}); err != nil {
		t.Fatal(err)
	}
	sum, err := e.b.Run(ctx, period, billing.Customers("cus ok", "cus_r", "cus_r", "cus_d", "cus_m"), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]error{"cus ok": billing.ErrInvalid, "cus_r": billing.ErrInvalid, "cus_d": billing.ErrDeclined}
	if len(sum.Failures) != 4 {
		t.Fatalf("failures %v; want 4", sum.Failures)
	}
	for _, f := range sum.Failures {
		var ce *billing.ChargeError
		if !errors.As(f, &ce) {
			t.Fatalf("failure %v (%T) is not a *ChargeError", f, f)
		}
		var mismatch *claim.MismatchError
		switch kind, ok := want[ce.Customer]; {
		case ce.Customer == "cus_m" && errors.As(f, &mismatch):
		case !ok || !errors.Is(f, kind):
			t.Errorf("failure %v: want a ChargeError for a listed customer of the right kind", f)
		}
	}
	billingtest.RequireChargedOnce(t, e.srv, "cus_r", period)
	billingtest.RequireNotCharged(t, e.srv, "cus_d", period)
	billingtest.RequireChargedOnce(t, e.srv, "cus_m", period)
}
