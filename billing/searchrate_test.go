package billing_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/internal/testenv"
)

// A large reconciliation searches Stripe at most 20 times a second, below
// Stripe's limit for search, whatever the Biller's RateLimit: it draws no
// 429 and leaves the rest of the rate to charges.
func TestReconcileSearchRate(t *testing.T) {
	t.Parallel()
	testenv.Long(t) // a few seconds of searches at the rate limit
	e := newEnv(t, func(c *billing.Config) { c.RateLimit = 500 })
	ctx := context.Background()
	ids := customers(25)
	for _, id := range ids {
		if _, err := e.b.Charge(ctx, id, period, nil); err != nil {
			t.Fatal(err)
		}
	}
	// Every claim is left pending past its window: Reconcile must find
	// each charge by search before anything else.
	const past = 25 * time.Hour
	e.exec(`UPDATE billonce_claims SET state = 'pending', stripe_id = '', owner = '', lease_until = now() - interval '1 second',
		created_at = created_at - $1 * interval '1 microsecond', first_sent_at = first_sent_at - $1 * interval '1 microsecond'`, past.Microseconds())
	e.srv.Advance(past)
	sum, err := e.b.Reconcile(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	if sum.AlreadyBilled+sum.Created != len(ids) {
		t.Fatalf("Reconcile: %+v, %v", sum.Progress, sum.Failures)
	}
	var searches []time.Time
	for _, en := range e.srv.Log() {
		if strings.HasSuffix(en.Path, "/search") {
			searches = append(searches, en.Time)
		}
	}
	if len(searches) < 2*len(ids) {
		t.Fatalf("%d searches for %d claims; want 2 each", len(searches), len(ids))
	}
	most := 0
	for i := range searches {
		n := 0
		for j := i; j < len(searches) && searches[j].Sub(searches[i]) < time.Second; j++ {
			n++
		}
		most = max(most, n)
	}
	t.Logf("%d searches in %v, at most %d in one second", len(searches), sum.Elapsed.Round(time.Millisecond), most)
	if most > 21 {
		t.Errorf("%d searches in one second; want at most 20 (and one of burst)", most)
	}
	wantAllOnce(t, e.srv, ids)
}
