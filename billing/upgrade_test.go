package billing_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

// A claim table made by billonce before claims recorded where their keys
// went (schema version 1), with pending, succeeded and failed claims in
// it, is upgraded in place by Migrate, and its pending claims are settled
// exactly once: at once when Stripe's search finds their payment, after
// their deadline when it does not.
func TestUpgradeFromVersion1(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	e := &env{tb: t, srv: newServer(t, billingtest.Config{}), pool: pgtest.Pool(t)}
	v1, err := os.ReadFile("../testdata/claim_v1_schema.sql")
	if err != nil {
		t.Fatal(err)
	}
	e.exec(strings.NewReplacer("{{table}}", "billonce_claims", "{{live_index}}", "billonce_claims_live",
		"{{pending_index}}", "billonce_claims_pending").Replace(string(v1)))

	// Keys as billonce derives them; this Biller is only used for that.
	keys := e.biller(func(c *billing.Config) { c.Claims = claim.NewMemory(claim.Config{}) })
	key := func(c string) string {
		k, err := keys.Key(c, period, 1)
		if err != nil {
			t.Fatal(err)
		}
		return k.String()
	}
	// cus_lost was charged and its answer lost; cus_unsent's first send
	// never reached Stripe; cus_done and cus_declined are settled.
	e.chargeDirect("cus_lost", key("cus_lost"), amount)
	done := e.chargeDirect("cus_done", key("cus_done"), amount)
	e.exec(`INSERT INTO billonce_claims (key, customer, period, amount, currency, state, stripe_id, owner, lease_until, last_error, created_at) VALUES
		($1, 'cus_lost', $5, 2500, 'usd', 'pending', '', 'old-runner/1', now() - interval '1 minute', 'timeout', now() - interval '2 hours'),
		($2, 'cus_unsent', $5, 2500, 'usd', 'pending', '', 'old-runner/2', now() - interval '1 minute', 'timeout', now() - interval '2 hours'),
		($3, 'cus_done', $5, 2500, 'usd', 'succeeded', $6, '', now(), '', now() - interval '3 hours'),
		($4, 'cus_declined', $5, 2500, 'usd', 'failed', '', '', now(), 'card_declined', now() - interval '3 hours')`,
		key("cus_lost"), key("cus_unsent"), key("cus_done"), key("cus_declined"), period, done.ID)

	e.store = newStore(t, e.pool) // Migrate upgrades the table in place
	e.b = e.biller()
	if c := e.claimOf("cus_done"); c.State != claim.StateSucceeded || c.StripeID != done.ID || c.SentAge < 3*time.Hour {
		t.Errorf("succeeded claim after the upgrade: %+v", c)
	}

	run := func() billing.Summary {
		t.Helper()
		sum, err := e.b.Run(ctx, period, billing.Customers("cus_lost", "cus_unsent", "cus_done", "cus_declined", "cus_new"), nil)
		if err != nil {
			t.Fatal(err)
		}
		return sum
	}
	sum := run()
	if sum.Created != 1 || sum.AlreadyBilled != 2 || sum.Declined != 1 || sum.Pending != 1 {
		t.Errorf("first run after the upgrade: %+v; want cus_new created, cus_lost and cus_done already billed, cus_declined failed, cus_unsent pending", sum.Progress)
	}
	var moved *billing.ChargeError
	for _, err := range sum.Failures {
		if strings.Contains(err.Error(), "cus_unsent") && !(errors.As(err, &moved) && errors.Is(err, billing.ErrSentElsewhere)) {
			t.Errorf("cus_unsent: %v; want ErrSentElsewhere (its key's endpoint is not recorded)", err)
		}
	}
	if c := e.claimOf("cus_lost"); c.State != claim.StateSucceeded {
		t.Errorf("cus_lost's claim: %+v; want succeeded from search", c)
	}

	// Past the deadline of cus_unsent's key, and the hour search is given
	// to index its last possible send, search finds nothing and the key is
	// sent again, once.
	e.advance(23 * time.Hour)
	if sum := run(); sum.Created != 1 || sum.AlreadyBilled != 3 || sum.Declined != 1 {
		t.Errorf("run past the deadline: %+v; want cus_unsent created", sum.Progress)
	}
	for c, want := range map[string]int{"cus_lost": 1, "cus_unsent": 1, "cus_done": 1, "cus_declined": 0, "cus_new": 1} {
		if n := e.count(c); n != want {
			t.Errorf("%s charged %d times, want %d", c, n, want)
		}
	}
}
