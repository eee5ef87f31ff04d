package billing_test

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// ErrorKind gives every kind one word, the most telling one first: an
// answer that stops runs wins over the kind of the charge it stopped.
func TestErrorKindNamesEachKind(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		err  error
		want string
	}{
		{nil, ""},
		{errors.New("something else"), "other"},
		{fmt.Errorf("x: %w", billing.ErrDeclined), "declined"},
		{&billing.ChargeError{Err: billing.ErrDeclined, AfterProcessing: true}, "failed_after_settlement"},
		{&billing.ChargeError{Err: fmt.Errorf("%w: %w", billing.ErrInvalid, &claim.MismatchError{Field: "amount"})}, "mismatch"},
		{fmt.Errorf("%w: %w", billing.ErrOutcomeUnknown, spendcap.ErrSpendCapReached), "spend_cap_reached"},
		{billing.ErrStripeUnreachable, "stripe_unreachable"},
		{billing.ErrRunHeldElsewhere, "run_held_elsewhere"},
		{context.DeadlineExceeded, "deadline_exceeded"},
	} {
		if got := billing.ErrorKind(c.err); got != c.want {
			t.Errorf("ErrorKind(%v) = %q; want %q", c.err, got, c.want)
		}
	}
}
