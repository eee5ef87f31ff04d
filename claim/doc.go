// Package claim records, durably and for the whole cluster, that a charge is
// about to be sent, before the first byte goes to Stripe (claim before send).
// A billing run that claims every customer first charges each one at most
// once per period, whatever retries, crashes and replicas do.
//
// # The claim table
//
// One row per idempotency key, holding the customer, the period, the amount
// and currency, a state, the Stripe id, an attempt count, the owner of the
// lease, when the lease ends, the last error and the creation and update
// times. All times come from the database clock. The key is unique, and at
// most one claim per (customer, period) is live (pending or succeeded): a
// failed claim no longer holds its period, so billing again after a decline
// is an explicit new claim under a new key, and the failed row stays as the
// record of the first attempt.
//
// A row also records where its key went: the scope that made the claim, the
// re-bill attempt, the endpoint and a non-secret fingerprint of the
// credential that sends the key, when the key's current window opened
// (first_sent_at) and when a reconciliation last found no payment for it.
// Rows made before migration 2 added these hold empty strings and 0
// (unknown), and a window that opened when the claim was made.
//
// # Migrations
//
// The table's schema is a series of numbered migrations built into the
// package ([Migrations] lists them). Run [Postgres.Migrate] at start-up: it
// applies, in one transaction, those the table has not had, and lists them
// in a record table named after the claim table (billonce_claims_migrations
// by default). It is safe from every replica at once, and upgrades a table
// made by an earlier billonce in place. A binary older than the table
// refuses to touch it ([ErrNewerSchema]).
//
//	store, err := claim.NewPostgres(pool, claim.Config{})
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//
// Teams that migrate with their own tool (goose, golang-migrate, atlas) copy
// each [Migration]'s SQL into a migration of theirs, once, in order. Every
// migration is idempotent, so calling Migrate as well is harmless: it
// records what the tool applied.
//
// [Config] names the table and schema and sets the lease; its zero value
// is usable. [NewPostgres] accepts a *pgxpool.Pool, a *pgx.Conn or your own
// pgx.Tx (see [DB]): a claim made in your transaction commits or rolls back
// with it.
//
// # States
//
//	          Claim                  Succeed(stripeID)
//	(none) ──────────► pending ─────────────────────► succeeded   (terminal)
//	                      │  Fail(reason)
//	                      ├─────────────────────────► failed      (terminal for this key)
//	                      │  lease expired (crash) or Release
//	                      └──► pending, resumed by the next Claim with the SAME key
//
// # Claiming
//
// [Postgres.Claim] takes a [Request] and answers, in one atomic round trip,
// with a [Result]: the [Outcome] and the row as it stands.
//
//	res, err := store.Claim(ctx, claim.Request{
//		Customer: "cus_42", Period: "2025-01", Key: key,
//		Amount: 4200, Currency: "usd", Owner: runID,
//	})
//	switch {
//	case err != nil:
//		// *MismatchError: this customer and period (or this key) is claimed
//		// with other parameters. Investigate; never charge.
//	case res.Outcome == claim.Won, res.Outcome == claim.Resumed:
//		// Ours: send with key, then Succeed, Fail or Release.
//	case res.Outcome == claim.Succeeded:
//		// Already charged: res.Claim.StripeID.
//	default:
//		// InProgress elsewhere, or Failed for this key: do nothing.
//	}
//
// Won and Resumed set the owner and a lease of [Config.Lease] on the
// database clock, and count an attempt. While the lease is live every other
// owner sees InProgress; the same owner claiming again resumes. A runner
// that crashes simply stops renewing: once its lease has expired, the next
// Claim for that key resumes it, and of runners racing for it exactly one
// does. A resumed claim is resent with its own key and recorded amount; if
// its Age nears Stripe's 24-hour idempotency window, reconcile with Stripe
// before resending.
//
// [Postgres.ClaimBatch] claims thousands of requests in one statement with
// the same outcomes, in request order.
//
// # After the call to Stripe
//
//   - [Postgres.Succeed] records the charge id; [Postgres.Fail] records a
//     definitive failure. Both are idempotent and refuse a contradiction
//     with [ErrConflict].
//   - [Postgres.Release] is for an unknown outcome (retries exhausted): the
//     claim stays pending, the error is recorded and the lease expires at
//     once, so the next run resumes it with the same key.
//   - [Postgres.Renew] extends the lease during a long call; [ErrLeaseLost]
//     means another runner has taken over and this one must stop.
//
// # Reconciling
//
// [Postgres.Pending] lists pending claims older than an age (claims near
// the end of the idempotency window), [Postgres.Stale] those whose lease
// has run out.
//
// # Bad input
//
// Every argument is checked before any query, and a bad one returns an
// error wrapping [ErrInvalid] saying what to fix: empty or oversized
// customer, period, key or owner ([MaxIDLen] bytes), a zero or negative
// amount, a currency that is not three lowercase letters ("usd", as Stripe
// writes it; "USD" is refused rather than silently rewritten), a nil
// database or a table name that is not a plain identifier.
//
// # Testing code built on claims
//
// [Memory] implements [Store] in process memory with the same behaviour.
// It is single-process only; tests that need time to pass run it inside a
// testing/synctest bubble.
package claim
