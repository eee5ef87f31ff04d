package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
)

// A period declined under one scope is not billed by a Biller of another
// scope sharing the claim table (a renamed scope): Charge is refused with
// a mismatch on the scope that tells to re-bill from the Biller of the
// declined claim's scope, and nothing is sent. The customer's completion
// of the declined PaymentIntent then pays the period once, and the other
// scope's Run counts the period Invalid, sending nothing. Counted at the
// fake.
func TestRenamedScopeDoesNotBillAPeriodDeclinedUnderTheOldScope(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.PaymentIntents, nil)
	ctx := context.Background()
	pi := h.declinedForAuthentication("cus_1")
	h.srv.Honor("cus_1") // a charge sent now would go through
	renamed := h.biller(func(c *billing.Config) { c.API = billing.PaymentIntents; c.Scope = "renamed" })
	k, err := renamed.Key("cus_1", period, 1)
	if err != nil {
		t.Fatal(err)
	}
	sent := len(h.srv.Payments())

	_, err = renamed.Charge(ctx, "cus_1", period, nil)
	var mm *claim.MismatchError
	if !errors.As(err, &mm) || mm.Field != "scope" || mm.Have != billing.DefaultScope || billing.ErrorKind(err) != "mismatch" ||
		!strings.Contains(err.Error(), `Config.Scope = "`+billing.DefaultScope+`"`) {
		t.Fatalf("Charge under a renamed scope of a period declined under %q = %v; want a mismatch on scope telling to re-bill from scope %q",
			billing.DefaultScope, err, billing.DefaultScope)
	}
	if got := len(h.srv.Payments()); got != sent {
		t.Errorf("%d payments created by the refused Charge, want none", got-sent)
	}
	if got := h.sentWith(k.String()); len(got) != 0 {
		t.Errorf("the renamed scope's key reached Stripe %d times, want never", len(got))
	}

	h.completeOnSession(pi)
	sum, err := renamed.Run(ctx, period, billing.Customers("cus_1"), nil)
	if err != nil || sum.Invalid != 1 || sum.Created != 0 || sum.Done != 1 {
		t.Errorf("Run under the renamed scope = %+v, %v; want the period counted Invalid, nothing created", sum, err)
	}
	if got := len(h.srv.Payments()); got != sent {
		t.Errorf("%d payments created under the renamed scope, want none", got-sent)
	}
	if n := h.srv.CountPeriod("cus_1", period); n != 1 {
		t.Errorf("the period was paid %d times, want once: by its customer completing the declined PaymentIntent", n)
	}
}
