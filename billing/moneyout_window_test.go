package billing_test

import (
	"context"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
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
