// Package billing charges Stripe customers exactly once per billing period.
//
// A [Biller] puts billonce's layers together, so that one call gets every
// protection:
//
//  1. the idempotency key is derived from (scope, customer, period, attempt)
//     with [idemkey.For], once, before anything can retry;
//  2. a claim row for (customer, period) is committed with [claim.Store]
//     before the first byte goes to Stripe;
//  3. the Stripe call runs inside [retry.Do], which hands every attempt that
//     same key; the HTTP client refuses any write without it;
//  4. the outcome is written back to the claim.
//
// # Charging one customer
//
//	store, _ := claim.NewPostgres(pool, claim.Config{})
//	_ = store.Migrate(ctx)
//	biller, err := billing.New(billing.Config{
//		SecretKey: os.Getenv("STRIPE_SECRET_KEY"),
//		Claims:    store,
//		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
//			return billing.Price{Amount: 2500, Currency: "usd"}, nil
//		},
//	})
//	receipt, err := biller.Charge(ctx, "cus_123", "2026-09")
//
// Call Charge as often as you like, from as many replicas as you like: the
// first call that wins the claim charges; the others get the same receipt
// (How is AlreadyRecorded, or Replayed when Stripe answered a lost attempt
// again) or an [*InProgressError] while the winner is still at work.
//
// # What can go wrong, and what Charge returns
//
//   - A decline is definitive: the claim is marked failed and Charge returns
//     a [*FailedError] with Stripe's decline code. It is never retried, and
//     later calls return the same error. Billing again is a decision for a
//     person: [Biller.Rebill] with attempt 2 uses a new key. Once a re-bill
//     has succeeded, Charge and Run report the period as billed.
//   - Timeouts, dropped connections, 5xx, 409 and 429 answers are retried
//     with the same key (see [Classify]). If retries run out, the outcome is
//     unknown: the claim stays pending and Charge returns an
//     [*UnknownOutcomeError]. The next Charge or Run resumes it with the same
//     key, and Stripe replays the charge if it was made.
//   - A pending claim older than Config.WindowMargin (23 hours) may have
//     outlived Stripe's 24-hour memory of its key, so it is looked up with
//     Stripe's search on metadata before anything is sent; if search cannot
//     settle it, Charge returns [*NeedsReconciliationError] and sends nothing.
//   - A spend-cap, revoked-key or permission answer ([ErrSpendCapReached],
//     [ErrVaultKeyRevoked], [ErrEndpointNotAllowed], [ErrStripeAuth]) is
//     never retried and stops a Run.
//   - So does a refusal that no customer's request could get past
//     ([ErrStripeRequest]): a wrong Config.StripeURL, an unknown parameter,
//     a key in the wrong mode, an API version Stripe does not take, a
//     proxy's own 404. The claims stay pending; once the configuration is
//     fixed the next Run sends them with the same keys. Only a refusal about
//     the customer's own card, payment method, bank account or price fails
//     the claim. [Classify] has the table.
//   - Bad input wraps [ErrInvalidInput] and is reported before anything is
//     written or sent.
//
// Every charge carries the metadata billonce_key, billonce_customer and
// billonce_period, so it can always be found again.
//
// # Billing runs
//
// [Biller.Run] bills a whole period from an iterator of customers: claims in
// batches, charges with bounded concurrency under the Biller's rate limit,
// reports progress, and returns a [Summary]. Several Runs of one period at
// once (three replicas of a cron job) charge nobody twice; pass a
// [lock.Guard] in [RunOptions] so that only one of them does the work.
// [Biller.Reconcile] settles claims that crashed runners left pending.
//
// # Charges or PaymentIntents
//
// Config.API chooses the Stripe API. [Charges] (POST /v1/charges against the
// customer's default source) matches older integrations. [PaymentIntents]
// (confirm=true, off_session=true with a saved payment method) is what Stripe
// recommends for new ones and handles SCA; each Price must then carry a
// PaymentMethod.
//
// # Testing code that uses billing
//
// Point Config.StripeURL at a fake Stripe from package
// [github.com/billonce/billonce/billing/billingtest] and count charges in its
// ledger; use claim.NewMemory for unit tests that need no database.
package billing
