package billing_test

import (
	"context"
	"errors"
	"testing"

	"github.com/billonce/billonce/billing"
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
