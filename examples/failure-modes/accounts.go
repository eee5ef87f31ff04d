package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"

	"github.com/billonce/billonce/billing"
)

// The account row: a marketplace bills its user "user-42" for the period
// on behalf of two merchants, each a connected account with the user's own
// Stripe customer object (Stripe customers live on one account).
const marketUser = "user-42"

var merchantCustomers = []string{"cus_user42_at_a", "cus_user42_at_b"}

func accountScenarios() []scenario {
	return []scenario{{
		id:        "account-not-keyed",
		name:      "charge on a connected account keyed without the account",
		customers: merchantCustomers,
		naive:     naiveAccountKey,
		billonce:  billonceAccountKey,
	}}
}

// merchants makes the two connected accounts and returns their ids, in
// the order of merchantCustomers.
func merchants(e *env) []string {
	return []string{e.stripe.CreateAccount(), e.stripe.CreateAccount()}
}

// naiveAccountKey keys each charge by the platform's own identity, the
// user and the period, and keeps the keys it sent in a table, so that a
// rerun past Stripe's 24 hours does not charge again: a key in the table
// is skipped. The user's charge for merchant B has merchant A's key, so
// the table calls it billed, and merchant B is never paid. (Stripe alone
// would have made both: it scopes keys per account.)
func naiveAccountKey(ctx context.Context, e *env) error {
	if _, err := e.pool.Exec(ctx, "CREATE TABLE "+e.schema+".sent_keys (key text PRIMARY KEY)"); err != nil {
		return err
	}
	sum := sha256.Sum256([]byte(marketUser + "/" + period))
	key := hex.EncodeToString(sum[:])
	for i, acct := range merchants(e) {
		tag, err := e.pool.Exec(ctx, "INSERT INTO "+e.schema+".sent_keys VALUES ($1) ON CONFLICT DO NOTHING", key)
		if err != nil {
			return err
		}
		if tag.RowsAffected() == 0 {
			e.logf("unsafe code: merchant %d: key already sent, reported billed", i+1)
			continue
		}
		p := chargeParams(ctx, merchantCustomers[i], key)
		p.SetStripeAccount(acct)
		ch, err := e.stripeClient(nil).New(p)
		if err != nil {
			return err
		}
		e.logf("unsafe code: merchant %d: %s", i+1, ch.ID)
	}
	return nil
}

// billonceAccountKey bills each merchant's customer on its account, twice
// over (the cron runs again): the account is part of the claim and of the
// key, so each is charged once.
func billonceAccountKey(ctx context.Context, e *env) error {
	accts := merchants(e)
	for run := 1; run <= 2; run++ {
		b, err := e.biller(ctx, "cron", nil)
		if err != nil {
			return err
		}
		for i, acct := range accts {
			r, err := b.Charge(ctx, merchantCustomers[i], period, &billing.ChargeOptions{Account: acct})
			e.logf("billonce: run %d, merchant %d: %s %s, err=%v", run, i+1, r.Outcome, r.StripeID, err)
		}
	}
	return nil
}
