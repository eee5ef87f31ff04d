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
// record of the first attempt. That new claim is of the failed claim's
// scope: a claim of another scope for a customer and period with a failed
// claim is refused (a [*MismatchError] on "scope", naming the failed
// claim), so that a renamed scope sharing the table cannot re-bill a
// declined period without a person's decision, nor charge it twice when
// its customer completes the declined payment. A claim of unknown scope
// (made before migration 2) blocks no scope's claim. Within a scope a
// period's attempts follow one another: a claim of an earlier attempt than
// one that failed (its own failed claim deleted by hand) is answered
// failed, with the later attempt's claim, and nothing is written, since
// billing it would pay a period whose later declined payment can still be
// completed. A partial index on the failed claims (migration 9) finds them.
// Both rules hold against claims being made at the same moment: a claim
// that another transaction commits and fails while this one is inserted
// (the unique index of live claims then no longer sees it) is read again
// in the same transaction, at read committed; the transaction then fails,
// nothing of it commits, and the claim is made again, seeing it.
//
// A row also records where its key went: the scope that made the claim, the
// re-bill attempt, the endpoint and a non-secret fingerprint of the
// credential that sends the key, when the key's current window opened
// (first_sent_at) and when a reconciliation last found no payment for it.
// Rows made before migration 2 added these hold empty strings and 0
// (unknown), and a window that opened when the claim was made.
//
// A usage report's claim records its identity at Stripe's meter as
// columns of their own: the meter (its event name) and the window of time
// the usage was measured in (window_start inclusive, window_end
// exclusive); they are NULL for other claims. Stripe's meter adds up
// every event of a customer, so the table refuses two live claims of one
// customer and meter whose windows overlap, whatever their scope: two
// exclusion constraints, which hold under concurrency as a unique index
// does (of two overlapping claims made at once, one waits for the other
// and finds it). The same window may be claimed more than once (the
// totals of one window are a claim each), and windows that meet, one
// ending where the next starts, do not overlap. The refused claim is a
// [*MismatchError] on "window" naming the claim that holds the time.
// Usage claims made before migration 6 recorded their windows have a
// meter and a window start, taken from their period, but no window end
// (their key holds it, hashed): they take no part in the overlap check.
//
// A usage claim also records its meter's Stripe id (meter_id, "mtr_…",
// Claim.MeterID), read from Stripe by the Biller that claims it. An event
// name may name a meter on each of several Stripe accounts whose reports
// share one claim table (a scope each); the id names one meter on one
// account. It is what shows a meter error report to be about the claim's
// own event (see Events from Stripe). Usage claims made before migration
// 7 recorded it have NULL (unknown), and so have other claims.
//
// # Migrations
//
// billonce owns three sets of tables, each migrated the same way: this
// package's claim table and its events, the spend-cap proxy's budgets
// (package spendcap) and the lock's lease table (package lock). Each
// schema is a series of numbered migrations, the files of the package's
// migrations directory (claim/migrations/0001_create.sql, ...): plain SQL
// for the default names, built into the package. A released migration
// never changes; later versions of billonce only add new ones.
//
// Run [Postgres.Migrate] at start-up (spendcap and lock have the same
// Migrate): it applies, in one transaction, those the table has not had,
// and lists them in a record table named after the claim table
// (billonce_claims_migrations by default). It is safe from every replica
// at once (they wait for each other on an advisory lock), and upgrades a
// table made by an earlier billonce in place. Once the table is up to date
// it only reads the record, so the application's role needs no CREATE
// privilege. A binary older than the table refuses to touch it
// ([ErrNewerSchema]).
//
//	store, err := claim.NewPostgres(pool, claim.Config{})
//	if err != nil { ... }
//	if err := store.Migrate(ctx); err != nil { ... }
//
// Teams that migrate with their own tools apply the files instead, in
// order: `psql -v ON_ERROR_STOP=1 -f` takes them unchanged, and goose or
// golang-migrate take each file's text as one migration of theirs (goose
// after its "-- +goose Up" line), since each statement is idempotent, ends
// its line with a semicolon and is not dollar-quoted. For another table name
// or a schema, [Migrations] returns the files with the configured names in
// place: the default identifiers (billonce_claims and the names built on
// it) are replaced by the configured ones, quoted, so the SQL stays the
// files' own. Every file lists its own version in the record table (the
// first creates it), so Migrate recognizes a table made by psql or a tool
// by its record, as it recognizes its own work: it finds nothing to do and
// writes nothing.
//
// Migration 6 (usage_windows) needs PostgreSQL's btree_gist extension for
// its exclusion constraints, and creates it if the database lacks it. It
// ships with PostgreSQL and is trusted since PostgreSQL 13: any role with
// CREATE on the database may create it, no superuser needed. Managed
// services offer it, some after a step of their own: Azure's flexible
// server wants it allowed in the azure.extensions server parameter,
// Amazon RDS in rds.allowed_extensions where that is set, and on Google
// Cloud SQL only a cloudsqlsuperuser creates extensions. Where the role
// cannot create it (or the server lacks it), Migrate returns an error
// that names the extension, says what to do and changes nothing: have
// the database's owner run CREATE EXTENSION btree_gist; once in the
// database, then migrate again, with any role. An extension that exists
// already asks for no privilege.
//
// Migration 8 (unsent) adds a boolean column with a constant default,
// again without a rewrite, and marks the claims an earlier version
// released for an identifier another writer took.
//
// Migration 9 (failed_periods) creates a btree index on the failed
// claims' customer and period: no extension and no privilege beyond the
// table's ownership. Migrations run in a transaction, where CREATE INDEX
// CONCURRENTLY is not allowed, so it holds the claim table's SHARE lock
// while the index is built: claims and outcomes wait (reads do not). On a
// large table, build it first with CREATE INDEX CONCURRENTLY under the
// same name (see the file); the migration then finds it.
//
// Migration 10 (window_hashes) rebuilds migration 6's two exclusion
// constraints, led by an int8 hash of the customer and the meter, which
// makes each usage claim's insert and move out of pending several times
// cheaper; they exclude the same rows. No new extension or privilege.
// Building the indexes again holds the claim table's ACCESS EXCLUSIVE
// lock until the migration commits: claims and reads of the table wait,
// for as long as reading its usage claims takes. Run it when no billing
// runs.
//
// Migration 11 (refunds) adds a nullable column naming the payment claim
// a refund refunds, a check added NOT VALID, and a btree index on the
// refunds: no rewrite, no extension, no privilege beyond the table's
// ownership; the index is built under the SHARE lock, over no rows but
// refunds. A refund's claim runs in a transaction of its own that takes
// a transaction-level advisory lock on its payment's key (two-key form,
// apart from the one-key locks of package lock and of Migrate), so that
// the refunds of one payment are claimed one after the other and never
// add up to more than it.
//
// Migration 13 (pending_keys) indexes the pending claims by key in
// place of migration 1's index by creation time, which it drops: a batch
// of claims then reads the pending claims it names, not every pending
// claim on the table. A plain btree index over the pending claims only,
// built under the SHARE lock (claims and outcomes wait, reads do not);
// the drop takes the ACCESS EXCLUSIVE lock for a moment. To build it
// without the lock, see the file.
//
// Migration 7 (meter_ids) adds a nullable column and a check, added NOT
// VALID since every existing row is NULL: no extension, no privilege
// beyond the table's ownership that the earlier migrations needed, no
// rewrite and no scan of the table, so it is the same on a managed
// PostgreSQL as on any other. Its ALTER holds the claim table's lock until
// the migration commits, a moment: claims made meanwhile wait for it.
//
// [Config] names the table and schema and sets the lease; its zero value
// is usable. [NewPostgres] takes a *pgxpool.Pool and nothing else: every
// claim commits on its own, before anything is sent, so that every replica
// sees it and no rollback of a caller's transaction can erase a claim whose
// charge exists.
//
// # States
//
//	          Claim                  Succeed(stripeID)
//	(none) ──────────► pending ─────────────────────► succeeded   (terminal)
//	                      │  Fail(stripeID, reason)                  ▲ Apply: its own payment
//	                      ├─────────────────────────► failed ────────┘ succeeded after all
//	                      │                          (terminal for this key)
//	                      │  Process(stripeID): Stripe answered "pending" or
//	                      │  "processing" (a bank debit that settles days later)
//	                      ├──► processing ──Apply (webhook or read)──► succeeded
//	                      │                                       └──► failed (Stripe's failure code)
//	                      │  lease expired (crash) or Release
//	                      ├──► pending, resumed by the next Claim with the SAME key
//	                      │  send check: the key's window is over
//	                      └──► pending; search Stripe for the key's payment:
//	                           found → Succeed; none → Reopen (a new window), send
//
// A processing claim holds its period like a succeeded one: a new claim
// for it is answered "processing" and nothing is sent again. When its
// payment fails after processing the claim fails with Stripe's failure
// code (Claim.FailureCode, and Claim.ProcessingAt tells it from a card
// decline); like any failed claim it is never billed again automatically:
// a re-bill is a new attempt with a new key, decided by a person.
//
// A failed claim records the Stripe object that failed when Stripe's
// answer named one (the declined PaymentIntent or charge). One edge leaves
// the failed state: when that same object succeeds after all, as a
// PaymentIntent declined off session (authentication_required) does once
// its customer completes it on session, Stripe's documented recovery, the
// claim becomes succeeded: the period is paid, and billing it again would
// charge twice. Only the claim's own recorded payment does this, and only
// by an event no older than the latest one the claim applied. The claim
// takes its period back: a re-bill of it still pending (of the same scope,
// a later attempt) is failed in the same transaction, with FailureCode
// [FailureSuperseded], so that no send check passes for its key again (if
// an earlier send of that key reached Stripe, its payment is not recorded:
// billing reports it for a person). A re-bill that paid the period, or is
// processing, keeps it; the claim stays failed, and the update is reported
// as the period perhaps paid twice.
//
// One edge leaves the succeeded state, for what Stripe reports failed
// after it succeeded, which moved nothing: a usage report's meter event
// rejected after it was accepted (a meter error report), and a refund
// whose customer's bank returned it. The claim fails, and its amount no
// longer counts against its payment's refunds.
//
// # What you call, and what billing calls
//
// A [Store] is what you hand to billing.Config.Claims, and [Store.Get] is
// what you call on it: the claim for a key, as a [Claim]. On a [Postgres]
// store you also call [Postgres.Migrate] at start-up, [Postgres.Count] for
// a period's totals, and [Postgres.PruneEvents] if you do not run
// billing's Reconcile (see below).
//
// Everything else (claiming, leases, send checks, recording outcomes,
// settling payments, listing claims to reconcile) is the store's engine,
// which the billing package drives and which is not part of this
// package's API: it lives in billonce's internal packages, so that it can
// change with billing without breaking you. Store is implemented by this
// package only and may gain methods, as River documents its driver
// interface; an alternative store would have to implement the engine, and
// billonce does not promise that contract. The rest of this documentation
// says what the engine does, so that you can read the table.
//
// # Claiming
//
// A claim is made in one atomic round trip, and answers with the row as
// it stands and what the caller does next: won (a new claim: send with the
// key), resumed (a pending claim whose lease expired, or was already the
// caller's: send again with the same key and the recorded amount),
// in progress (another runner holds a live lease: do nothing), succeeded,
// processing or failed (do not call Stripe; failed is also the answer,
// with the later claim, for an attempt of a period whose later attempt of
// the same scope has failed), or a [*MismatchError]: this customer and
// period (or this key) is claimed with other parameters, or has failed
// under another scope, and nothing is charged.
//
// Winning or resuming sets the owner and a lease of [Config.Lease] on the
// database clock, and counts an attempt (Claim.Leases). While the lease is
// live every other owner sees the claim in progress; the same owner
// claiming again resumes. A runner that crashes simply stops renewing:
// once its lease has expired, the next claim for that key resumes it, and
// of runners racing for it exactly one does. Thousands of requests are
// claimed in one statement with the same outcomes.
//
// # After the call to Stripe
//
// A charge id is recorded as succeeded, a definitive failure as failed;
// both are idempotent and a contradiction is refused. An unknown outcome (retries exhausted) releases the claim: it stays
// pending, the error is recorded and the lease expires at once, so the
// next run resumes it with the same key. A long call renews its lease;
// losing the lease means another runner has taken over and this one stops.
// A claim whose key never executed at Stripe (refused before execution) is
// deleted, so the next run claims afresh.
//
// # Where the key went, and its window
//
// A claim records where its key goes: the scope that derived it, the
// billing attempt, the endpoint that receives it and a fingerprint of the
// credential that sends it. A resume never changes them, so a caller
// configured otherwise can tell that it must not resend the key blind.
//
// The claim also starts the key's window (Claim.FirstSentAt, Claim.SentAge):
// the earliest time the key may have reached Stripe, which forgets keys
// after 24 hours. Before every send the engine checks, on the database
// clock, that the window is still open and that the caller still holds
// the claim; a caller whose window is over searches Stripe, and if no
// payment exists for the key it reopens the claim, which starts a new
// window (Claim.ReconciledAt).
// Pending claims whose lease has run out are listed for reconciliation,
// per scope.
//
// # Events from Stripe
//
// An update (a webhook event, or a read of the payment) is applied in one
// transaction: the event id goes into the events table (named after the
// claim table with _events appended) with INSERT … ON CONFLICT DO NOTHING,
// and only if it was new is the claim row locked and moved. A redelivered
// event, or the same event delivered to several replicas at once, is
// applied once (a duplicate for the others). States only move forward
// (pending, processing, then succeeded or failed), so an older event
// arriving after a newer one changes nothing; a succeeded claim never
// fails, and a failed one succeeds only by its own payment (see States). Refunds (the amount refunded so far only
// grows) and disputes (the latest by Stripe's creation time of its event,
// Claim.DisputeAt; of two created in the same second, the greater id) are
// recorded on the claim without changing its state: they are not a reason
// to bill again. An event moves a claim only when it is shown to be about
// the claim's own send: an event for a payment other than the one the
// claim records, or of another kind of object, changes nothing, and so
// does any event for a claim that has recorded no Stripe object of its
// own yet (its send's answer, which a resume with the same key gets from
// Stripe again, settles it). An event about a usage report's meter event,
// whose identifier any writer may send, to any meter of any account, is
// shown to be about the claim's own by its meter and its time: the meter
// id the claim recorded (a report about another meter, on this account or
// another, changes nothing; nor does any report about a claim made before
// migration 7, which recorded none), and a window within the day after
// the claim's key window opened, and after its last reopening.
//
// # Pruning the events table
//
// The events table gains a row per event applied. [Postgres.PruneEvents]
// deletes the rows received longer ago than a given age, on the database
// clock, oldest first, 1000 rows per statement, each statement its own
// short transaction (rows another pruner holds are skipped), so that a
// webhook delivery never waits long behind it, however large the table.
// billing.Biller.Reconcile calls it with Config.EventRetention, 90 days
// by default; a service that does not run Reconcile schedules it itself
// (daily is plenty).
//
// A row is needed only while Stripe may deliver its event again: Stripe
// retries a delivery for up to 3 days, and an event can be resent from
// the dashboard or the API for up to 30 days. Keep rows longer than that.
// Should an event come after its row was deleted anyway, it is applied
// again, as if new, and changes nothing: the claim already knows as much
// or more, and the row is recorded again. States never move back, a
// refund is never counted twice (the amount is Stripe's running total,
// not an increment), an older dispute never replaces a newer one, and
// nothing is sent to Stripe.
//
// # Bad input
//
// Every argument is checked before any query, and a bad one returns an
// error wrapping [ErrInvalid] saying what to fix: empty or oversized
// customer, period, key or owner (1 to 255 bytes), a zero or negative
// amount, a currency that is not three lowercase letters ("usd", as Stripe
// writes it; "USD" is refused rather than silently rewritten), a nil
// database or a table name that is not a plain identifier.
//
// # Testing code built on claims
//
// [NewMemory] returns a [Store] in process memory with the same behaviour, for
// billing's unit tests. It is single-process only; tests that need time to
// pass run it inside a testing/synctest bubble.
package claim
