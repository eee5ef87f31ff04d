package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/internal/claimengine"
)

// laterClaims is a claim store whose new claims are made later on the
// database's clock by d: the claim of a call made d after the others.
type laterClaims struct {
	testStore
	e *env
	d time.Duration
}

func (s laterClaims) Claim(ctx context.Context, r claimengine.Request) (claimResult, error) {
	res, err := s.claimEngine.Claim(ctx, r)
	if err == nil {
		s.e.exec(`UPDATE billonce_claims SET created_at = created_at + $2 * interval '1 microsecond' WHERE key = $1`, r.Key, s.d.Microseconds())
	}
	return res, err
}

// A payout whose claim row was lost (a claim table restored from an older
// copy), asked for again days later, once Stripe forgot its key, is found
// by the listing before the send, however long ago it was made.
func TestPayoutWhoseClaimRowWasLostIsFoundDaysLater(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance(acct, "usd", 100_000)
	ctx := context.Background()
	r, err := e.b.Payout(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Created)
	e.exec("DELETE FROM billonce_claims WHERE key = $1", r.Key.String())
	const later = 72 * time.Hour
	e.srv.Advance(later)
	b := e.biller(func(c *billing.Config) { c.Claims = laterClaims{wrapStore(e.store), e, later} })
	again, err := b.Payout(ctx, acct, period, usd, nil)
	if got := movementsTo(e, "payout", acct); len(got) != 1 {
		t.Fatalf("payouts %+v after the claim was made again %v later (receipt %+v, %v); want the one payout %s", got, later, again, err, r.StripeID)
	}
	wantHow(t, again, err, billing.Reconciled)
}

// A payout's claim whose account column was lost (a row restored from a
// copy made before the column existed, or edited by hand) still stands
// for a payout on its account, its customer: Reconcile reports the claim
// whose row disagrees, and never pays out of the platform's balance.
func TestPayoutClaimWithoutItsAccountColumnIsReconciledOnItsAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance(acct, "usd", 100_000)
	e.srv.SetBalance("", "usd", 100_000)
	ctx := context.Background()
	b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/payouts"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/payouts"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore})
	_, err := b.Payout(ctx, acct, period, usd, nil)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) {
		t.Fatalf("payout with its answer lost: %v, want ErrOutcomeUnknown", err)
	}
	e.exec("UPDATE billonce_claims SET account = '' WHERE key = $1", ce.Key)
	e.ageClaim(ce.Key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	sum, rerr := e.b.Reconcile(ctx, nil)
	all := e.srv.Movements("payout")
	if len(all) != 1 || all[0].Account != acct {
		t.Fatalf("payouts %+v after Reconcile (%+v, %v); want the one payout on %s", all, sum, rerr, acct)
	}
	if len(sum.Failures) != 1 || !strings.Contains(sum.Failures[0].Error(), "account") {
		t.Fatalf("Reconcile: %+v, %v; want the claim's account reported", sum, rerr)
	}
	if bal := e.srv.Balance("", "usd"); bal != 100_000 {
		t.Fatalf("platform balance %d, want 100000: nothing paid out of it", bal)
	}
}

// A claim table restored from a copy made before a period's transfers
// has lost both attempts: attempt 1, refused for a short balance, and
// attempt 2, which transferred. A sweep that asks for attempt 1 again, a
// day later, finds the period's transfer by listing and never transfers
// a second time.
func TestTransferOfAnotherAttemptFoundByListingAfterARestoreIsNotMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	if _, err := e.b.Transfer(ctx, acct, period, usd, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("transfer without balance: %v, want ErrDeclined", err)
	}
	e.srv.SetBalance("", "usd", 100_000)
	r2, err := e.b.Transfer(ctx, acct, period, usd, &billing.MoneyOutOptions{Attempt: 2})
	wantHow(t, r2, err, billing.Created)
	e.exec("DELETE FROM billonce_claims")
	e.srv.Advance(25 * time.Hour)
	again, err := e.b.Transfer(ctx, acct, period, usd, nil)
	if got := movementsTo(e, "transfer", acct); len(got) != 1 {
		t.Fatalf("transfers %+v after attempt 1 was asked for again (%+v, %v); want attempt 2's transfer %s alone", got, again, err, r2.StripeID)
	}
	if !errors.Is(err, billing.ErrNeedsReconciliation) || !strings.Contains(err.Error(), r2.StripeID) {
		t.Fatalf("attempt 1 asked for again: %+v, %v; want ErrNeedsReconciliation naming attempt 2's transfer", again, err)
	}
}
