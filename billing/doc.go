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
//	biller, err := billing.New(billing.Config{
//		SecretKey: os.Getenv("STRIPE_SECRET_KEY"),
//		Claims:    store, // claim.NewPostgres(pool, claim.Config{}), migrated
//		Price: func(ctx context.Context, customer, period string) (billing.Price, error) {
//			return billing.Price{Amount: 2500, Currency: "usd"}, nil
//		},
//	})
//	...
//	receipt, err := biller.Charge(ctx, "cus_123", "2026-09", nil)
//
// Call Charge as often as you like, from as many replicas as you like: the
// first call that wins the claim charges; the others get the same receipt
// (Outcome AlreadyBilled, or Replayed when Stripe answered a lost attempt
// again) or an [ErrInProgress] while the winner is still at work. Pass
// [ChargeOptions] to charge a price of your own instead of Config.Price's.
// The program examples/quickstart is the whole production shape in one
// file: pool, claim table, Biller, lock, Run, exit code.
//
// A service that bills from many places can make one Biller the default
// with [SetDefault] and call the package-level [Charge] anywhere.
//
// # What can go wrong, and what Charge returns
//
// Every error of a charge is a [*ChargeError]: the customer, period, key,
// attempt and Stripe's request id, and in Err the kind, which errors.Is
// tells apart, and Stripe's own *stripe.Error whenever Stripe answered
// with one (errors.As), declines included. Its
// documentation has the table of kinds: what each leaves in the claim
// table and what to do. Two rules explain most of it. Anything that may
// have reached Stripe leaves the claim pending with its key, and the next
// Charge or Run resumes it with that same key, so Stripe replays a charge
// it made ([ErrOutcomeUnknown] after retries run out on timeouts, dropped
// connections, 5xx, 409 and 429; see [Classify]). And only a refusal about
// the customer's own card, payment method, bank account or price (or a
// usage report's window, too old for Stripe) decides that one item
// ([ErrDeclined], terminal for the key: billing again is a
// person's [Biller.Rebill]); a refusal that no customer's request could
// get past (a wrong Config.StripeURL, a revoked key, a spend cap) decides
// nobody and stops a Run ([StopsRun]), and so does a Stripe that gives no
// HTTP answer at all for a while ([ErrStripeUnreachable]).
//
// With no Config.Logger, warnings and errors (a stopped run, a claim that
// needs reconciliation, a key sent elsewhere, a payment that failed after
// processing) go to slog.Default, as River's do; retries and other
// information stay quiet.
//
// A Run over [claim.Postgres] makes its workers' checks and records their
// charges (and paid invoices) many per database round trip: a charge is recorded a few
// milliseconds after Stripe answered, and counted in the Run's Progress
// once it is. A runner that dies in between leaves the claim pending, and
// the next run gets Stripe's replay under the same key.
//
// # Keys have a deadline, and remember where they went
//
// A key has a deadline: Config.WindowMargin (23 hours) after it was first
// sent, on the database clock. Stripe remembers keys for at least 24
// hours, and a key it has forgotten makes a new charge. So before every
// HTTP attempt (each retry, each customer leaving a Run's queue) the claim
// store confirms the deadline has not passed. The one exception is the
// first attempt of each write of a claim a Run has just made (an
// invoice's steps each), within half its lease: no request ever carried
// the claim's keys and no other runner can send them meanwhile, so the
// claim's own statement is the check. Usage reports take no exception:
// their deadline runs from their window's opening, not from the claim. Once the deadline has passed,
// the key's payment is looked up with Stripe's search on metadata, among
// charges and payment intents alike, and nothing is sent: a payment found
// is recorded; none found starts the key's window again and sends it; if
// search cannot settle it, the error is [ErrNeedsReconciliation].
//
// A claim remembers where its key went: the API (endpoint) and a
// fingerprint of the credential that sent it (never the credential). A
// Biller configured otherwise (the other API, a rotated secret key) never
// resends such a claim blind. It searches Stripe first: a payment found is
// recorded. If none is found, the error is [ErrSentElsewhere] and nothing
// is sent until the key's whole 24-hour window has passed (an attempt of
// the old configuration may still land until then), and the hour search
// is given to index the last request the old configuration can have sent
// (WindowMargin and an attempt's timeout after the window started), after
// which a miss reopens the window for the new configuration. Finish claims with the
// configuration that made them, or accept that wait. Behind a spend-cap
// proxy, name the Stripe key with Config.Credential.
//
// Every charge carries the metadata billonce_key, billonce_customer and
// billonce_period, so it can always be found again.
//
// # Billing runs
//
// [Biller.Run] bills a whole period from an iterator of customers: claims in
// batches, charges with bounded concurrency under the Biller's rate limit,
// reports [Progress] (Created, AlreadyBilled, Declined, Pending, Invalid:
// the words of [Outcome] and of the error kinds), and returns a [Summary].
// Several Runs of one period at once (three replicas of a cron job) charge
// nobody twice; pass a [lock.Locker] in [RunOptions] so that only one of
// them does the work. Under a [lock.Lease], a run's claims check the
// lease's fencing token: a run that stalled while another took the lease
// over claims nothing more, and stops. An item may also move money out,
// through the same claims, batches and guard: one with a Refund refunds
// the payment that billed its customer for the period ([Biller.Refund];
// a Run of them is a mass refund, each payment refunded once per refund
// id, and the refunds of one payment claimed in turn, so that they never
// add up to more than it), one with a Transfer or a Payout pays a
// connected account ([Biller.Transfer], [Biller.Payout]). Progress counts
// them as it counts charges (Created: made by this run).
// [Biller.Reconcile] settles claims that crashed runners left pending, of
// its own Config.Scope only, reads payments that have been processing
// longer than Config.SettleAfter, and prunes the records of webhook events
// older than Config.EventRetention (see below). A claim table holds one live claim per
// customer and period, whatever the scope, and a declined period is
// re-billed only from the scope that claimed it (a claim of another scope
// is refused, a *claim.MismatchError on "scope"): products that bill the
// same customers for the same periods use a claim table each.
//
// # Usage meters
//
// [Biller.ReportUsage] reports a customer's usage on a Stripe meter for a
// window of time as one meter event, exactly once, and [Biller.RunUsage]
// reports many with Run's batching, concurrency, rate limit, progress and
// lock. A [Usage] names its meter's kind: [Increments] for a summing
// meter, [WindowTotals] (the window's running total, each new total the
// window's next Usage.Attempt, sent once the one before it settled) for a
// pre-aggregated one (event_time_window hour or day, of which Stripe keeps
// the newest event per window). The Biller reads each meter from Stripe once and
// refuses the wrong combination, which would over- or under-count. The
// claim table keeps the windows of a customer and meter from
// overlapping, across runs, replicas and scopes: an overlapping report is
// an [ErrInvalid] naming the window claimed, and nothing is sent.
//
// The charge rules hold, with the meter event's identifier as a second
// key: it is the claim's idempotency key, derived from (scope, meter,
// customer, window, kind, attempt), and Stripe refuses a repeat of it for
// at least a day. That refusal is read as "delivered" when this claim may
// have sent the event before, and as needing a person when it cannot
// have; it is never retried. Past the key's deadline the meter's event
// summary for the customer over the report's whole window decides,
// instead of a search, and so it does before every send of a window
// that ended more than WindowMargin ago, whose event Stripe may have
// taken from a claim table restored since; what no summary can show (an
// earlier report that reaches into the window, one sent since within
// WindowMargin) is in ReportUsage's documentation. A
// delivered report's claim is succeeded; Stripe may still reject the
// event as it aggregates it, and the meter error report that says so
// (a v2 event, delivered to [Biller.Webhook]) fails the claims it names,
// when it can be about their own event: on their meter, by the meter's
// Stripe id, which the claim records and which is one Stripe account's,
// and validated within the day in which their key can be sent.
// ReportUsage has the details, and what each step can and cannot prove.
//
// # Refunds
//
// [Biller.Refund] refunds all or part of the payment that paid a customer's
// period (a charge, a PaymentIntent, or a paid invoice, which is refunded
// by a credit note of it), exactly once per refund id: the caller's own name for the
// refund (an RMA, a credit number), never its amount, so two partial
// refunds of the same amount are two refunds and a second click, a
// redelivered webhook or a retry days later with the same id is the same
// refund. A refund is a claim of its own, of the payment's claim
// (claim.Claim.RefundOf): its key is derived from the payment's key and
// the refund id, it is committed before anything is sent, and the claim
// table refuses it, on any replica, when the payment's live refunds and
// it would add up to more than the payment: [ErrInvalid], naming what is
// left, before anything is sent. Before a call first sends the key, and
// past its deadline, the refund is looked for by listing the payment's
// refunds, or the invoice's credit notes (Stripe has no search for
// either), whose answer is current at
// once: a refund whose claim row was lost (a table restored from an
// older copy) is found and recorded, not made again once Stripe has
// forgotten its key. A pending refund is processing
// until its charge.refund.updated event or Reconcile settles it; one that
// fails is reported and failed for its id, and refunding again is a
// person's decision, under a new id.
//
// # Transfers and payouts
//
// [Biller.Transfer] moves money from the platform's balance to a connected
// account, and [Biller.Payout] pays a connected account's balance out to
// its bank, each exactly once per (account, period, attempt): a claim of
// its own, committed before anything is sent, whose customer is the
// account and whose period is "transfer <period>" or "payout <period>",
// so that one transfer and one payout of each account and period live at
// a time, on every replica. A transfer carries the transfer group
// "billonce <scope> <period>", and past the key's window it is found by
// listing the account's transfers of the group; a payout is found by
// listing the account's payouts since its claim. A balance short of it
// is Stripe's balance_insufficient: a refusal with what to do, never
// retried. A payout is processing until paid, and one its bank returns
// after it was paid (payout.failed, days later) fails its claim and is
// reported. Paying again is always a person's decision: the next
// MoneyOutOptions.Attempt, which needs the attempt before it failed. Nor
// does billonce reverse a transfer.
//
// # Connected accounts
//
// A platform (Stripe Connect) bills its connected accounts' customers on
// those accounts: set ChargeOptions.Account, Item.Account (one Run bills
// items of any number of accounts), Invoice.Account or Usage.Account to
// the account's id ("acct_…"). Every request made for that customer goes
// to the account with the Stripe-Account header, the searches, listings
// and reads that settle a claim included, and a refund goes to its
// payment's account. The account is part of the claim and of the key (the
// platform's keys are those billonce always derived, and every claim made
// before accounts were recorded is the platform's): a period claimed on
// one account and asked for on another, or on the platform's own, is
// refused (a [*claim.MismatchError] on "account"), never billed again
// there, since the first account's payment may exist. A webhook event
// moves a claim only when its account (Stripe's top-level "account" of
// a Connect event, "" for the platform's) is the claim's: an id or a key
// in another account's object proves nothing.
//
// # Invariants
//
// Whatever the configuration, the retries and the replicas, billonce keeps
// these promises. Code, comments and tests cite them by name.
//
//  1. Key from intent: an idempotency key is a pure function of the
//     business identity (scope, customer, period and the attempt number a
//     person chose when re-billing; for a usage report its meter, window
//     and kind; for an invoice's steps, the invoice's key and the step),
//     never of time, randomness, retry count, host or process.
//  2. Every write carries a key: every POST to Stripe carries its key, and
//     no transport or retry layer makes one up; a POST that reaches
//     [idemkey.Transport] without a key is refused, not sent.
//  3. Claim before send: a claim is committed on its own, visible to every
//     replica, before the first byte goes to Stripe ([claim.NewPostgres]
//     takes a pool, never a caller's transaction).
//  4. Same key, same charge: a claim is resent only with its own key and
//     its recorded amount and currency; a different amount for a claimed
//     period is an error, never a new charge.
//  5. The deadline: no HTTP attempt carries a key once WindowMargin has
//     passed, on the database clock, since the key was first sent, unless
//     a search made after that point found no payment for it. It is
//     checked before every attempt, so retries and waits in a Run's queue
//     count (see Clocks below for the one exception).
//  6. Outcomes are final: a decline is recorded and ends its key; billing
//     again is an explicit re-bill under a new key, never an automatic
//     retry. (A declined PaymentIntent may still succeed, when its
//     customer completes it before a re-bill cancels it: its claim is then
//     succeeded; see Webhooks.)
//  7. Honest locks: a [lock.Locker] holds its lock on one connection,
//     releases it there or destroys the connection, and cancels the guarded
//     job's context when the lock is lost.
//  8. Stop on refusals: a spend cap, a revoked key or a missing permission
//     stops the run; such an answer is never retried.
//  9. No secrets in logs: secret keys and vault keys are redacted in every
//     log line, error and printed value.
//  10. Database time: leases, deadlines and staleness are read on the
//     database's clock, which all replicas share, not the application's.
//  11. A claim knows where its key went: it records the endpoint (charges
//     or payment intents) and a non-secret fingerprint of the credential
//     that sent it; a resume under another endpoint or credential searches
//     first or refuses, and never sends blind.
//  12. Claims stand on their own: a claim is durable before its key is
//     sent whatever store the caller passed; a store that cannot promise
//     that (a caller's transaction, one shared connection) is refused.
//  13. Events once, in order: a webhook event is recorded by its ID in the
//     transaction that applies it; a duplicate changes nothing, and an
//     older event never moves a claim backwards.
//  14. Owners are unique: each Biller's owner is its own, whatever
//     Config.Owner says, so two replicas never take each other's live
//     claims for their own.
//
// Rebill refuses an attempt number whose predecessor has no claim (an
// earlier attempt's claim deleted by hand is no gap: Charge and Run are
// answered by the later attempts' claims, a declined one's decline or a
// paid one's receipt), but a pending re-bill can still find its
// predecessor gone: a claim deleted by hand after
// its decline, or a table written by an earlier build that did not number
// re-bills. Its key may have charged, so it is neither sent nor deleted:
// Stripe's search settles it. A payment found is recorded; finding none is
// trusted once the key's whole window has passed, and the claim is then
// abandoned and the re-bill refused; until then it stays pending with
// [ErrNeedsReconciliation], and the period's other attempts wait for it.
//
// # Clocks
//
// Deadlines and leases are read on the database's clock, the one clock all
// replicas share; a Run's first send of a claim it has just won relies on
// the claim statement's own reading and this process's clocks for half a
// lease, instead of a second round trip. billonce assumes the database
// clock does not jump forward: a jump of a day while a key is on its way
// (or waiting for that first send) can make a replica with another secret
// key or endpoint find the key's window long past, search, find nothing
// yet, and charge again under its own key.
//
// # Webhooks
//
// [Biller.Webhook] is the handler for Stripe's events: it verifies their
// signature (400 if it is wrong) and applies each to the claim of its
// payment in the claim store, once: a redelivery is a duplicate. The
// metadata that names a claim is anyone's to write, so an event moves a
// claim only when it is shown to be about the claim's own send: its
// object is the one the claim recorded from Stripe's answer to its key.
// Before a claim has recorded its payment, no event moves it; the claim's
// own resume settles it with its key. A meter error report, which names
// no object of the claim's, is shown to be about a usage claim's event by
// its meter's Stripe id, which must be the one the claim recorded (so a
// report on another Stripe account, whose reports share the claim table,
// moves none of this account's claims), and by its time (see Usage
// meters).
//
// A failed claim records the payment Stripe declined, when its answer
// named one. That payment's success after all moves the claim on to
// succeeded, the one way out of failed: a PaymentIntent declined off
// session with authentication_required, which its customer completes on
// session (Stripe's recovery), pays the period, and a Rebill of it then
// returns that payment's receipt, AlreadyBilled. A re-bill cancels the
// PaymentIntents of the attempts before it at Stripe before its own key
// is sent (see [Biller.Rebill]), so once it is sent they can no longer
// succeed: one that succeeds while a re-bill is claimed and not sent
// stops the re-bill at its next send check, or the re-bill's cancel finds
// it paid. A claim that paid the period first and cancels nothing (an
// invoice of the period, a re-bill sent by an earlier version of
// billonce) keeps it, and the event is reported (EventNotApplied) for a
// person to refund one of the two payments.
// An event that can never be applied is answered 200 and reported
// (EventNotApplied), so that Stripe does not retry it for days; a failure
// that may pass (the claim store, a read from Stripe) is answered 5xx, so
// that Stripe delivers again. Every delivery is reported to Config.Observe
// as an EventWebhook with its result ("applied", "duplicate", "rejected",
// "retry", …).
//
// The record of an applied event is what makes a redelivery a duplicate.
// Reconcile deletes records older than Config.EventRetention, 90 days by
// default: three times the 30 days for which Stripe can resend an event
// (it retries a failed delivery for 3). Pruning belongs to Reconcile
// because Reconcile is the periodic job every deployment already
// schedules; the store's PruneEvents is there for services that do not.
// An event delivered after its record was pruned is applied again and
// changes nothing, since claims only move forward: it is answered
// "unchanged", is reported only as an EventWebhook "unchanged", and
// charges nobody.
//
// # Invoices
//
// [Biller.Invoice] bills a customer for a period by one Stripe invoice
// with its lines ([Invoice], or Config.Invoice's answer), with the same
// guarantee: one invoice, each line added once, finalized once, paid (or,
// with Invoice.DaysUntilDue, sent) once, across retries, replicas,
// crashes and days. A Run item with an Invoice, or every item when
// Config.Invoice is set and Config.Price is not, is billed that way.
//
// An invoice is several requests, each with its own key, derived from
// the claim's key and the step's name (and line index); the draft, each
// invoice item and the invoice carry the metadata billonce_key,
// billonce_customer, billonce_period, and each item billonce_line, its
// index. The draft is made with pending_invoice_items_behavior=exclude and
// each line added to it by id, so that no pending invoice item of the
// customer is swept in. The claim records nothing of the invoice before
// its outcome (a claim and its outcome are all an invoice writes to
// PostgreSQL, as for a charge), because every step is found again
// cheaply: the invoice by listing the customer's invoices made since the
// claim (a list shows an invoice at once, where a search lags), its lines
// by listing them, the finalization and the payment by the invoice's
// status. A call that gives up part way records the invoice it holds as
// it releases the claim (claim.Claim.StripeID), so that its events settle
// the claim. A call that finds the claim part way (a runner gave up, or
// was killed) reads that invoice, or lists the customer's invoices for
// the one carrying the key (one found is taken in whatever status it has
// reached, a final one only if it shows the claim's lines, as billonce's
// own does; several, or only other customers' or currencies', or final
// ones without the claim's lines, is [ErrNeedsReconciliation]; a void
// one, billonce's own voided by a person, fails the claim), and goes on
// from where Stripe shows it, with the same keys: a line on the draft is
// taken, not sent again. Stripe lists no deleted invoice, so when none is
// found the invoice.deleted events of the customer's invoices are looked
// at too: billonce's draft deleted by a person (one carrying all its
// metadata, not the key alone) fails the claim, as an
// invoice voided by hand does, and no other invoice is made (Stripe keeps
// events for 30 days: a draft deleted longer ago than that, resumed only
// then, is made again). The keys'
// deadline is the claim's, which starts before any step is sent. Past it
// nothing is written blind: each step is looked for first, the same way.
// A claim whose steps may have been sent with another credential (a
// rotated secret key) is looked for the same way first at every step, and
// the charge's rule decides: a step found is taken; finding nothing is
// [ErrSentElsewhere] until the key's window has passed (the old key's
// request may still land, and finding the draft does not prove that its
// lines were not sent), after which the step is sent. That rule holds for
// the steps that could make something twice, the draft and the lines: a
// finalization, payment or sending not found is sent at once, since one
// of the old key's landing after it is refused by the invoice's status
// (or sends the customer the same invoice again). Lines found past
// the window are recorded (claim.Claim.Step "line i", the last of them)
// before anything is sent in the window that starts then, so that a later
// resume does not send them again. A line missing while a later one is on
// the draft was deleted from it (on Stripe's dashboard, say): the lines
// after it may carry keys Stripe has forgotten too, so nothing is sent,
// and the claim waits for a person with [ErrNeedsReconciliation].
//
// The claim records the invoice's total, not its lines, and the receipt's
// Amount is that total; but a draft is anyone's to change between two
// steps. So the draft's lines are listed before it is finalized: an item
// billonce did not add (a person's on Stripe's dashboard, other code's),
// or lines that are not the call's (another split of the same total,
// after Config.Invoice changed), leave the invoice a draft and the claim
// pending, with [ErrNeedsReconciliation] naming them. A person deletes
// the items billonce did not add from the draft (or calls with the lines
// the invoice was begun with), and the next call finalizes and pays it.
// The finalized invoice's total is checked against the claim before it is
// paid or sent: one that differs (an item added as it was finalized, a
// discount or tax of Stripe's) is left open and unpaid, with Stripe's
// automatic collection of it off, and ErrNeedsReconciliation: an
// invoice is finalized with it off, and it is turned on, for Stripe to
// go on collecting a declined payment, only once the total is checked. A person
// voids it, and invoice.voided fails the claim: billonce invoices that
// period no more. Or, if its total is what the customer owes, the person
// pays it by hand, and invoice.paid settles the claim.
//
// A customer is either charged or invoiced for a period: both take the
// period's one claim in the claim table. A declined payment leaves the
// invoice open for Stripe to collect, and the claim processing: it is
// reported, never invoiced again. Once the draft exists a Stripe refusal
// of a step leaves the claim pending (never failed, never abandoned) for
// a person, who fixes the cause and calls again, or voids the invoice.
// Reconcile resumes pending invoices with Config.Invoice for their lines;
// without it, it reports them and leaves them as they are.
//
// # What a refusal means
//
// A 4xx that Classify stops on either concerns one item (its customer, or
// a value of its own that its claim fixes for its key), or the way the
// request is made. Only the first kind is recorded on the claim as failed,
// which is terminal for the key (billing the customer again is a
// [Biller.Rebill]), with what a person can do when there is more to say
// than Stripe's message; the second kind would refuse every item alike,
// so it stops the run and decides nothing: Stripe stores nothing for a
// request it refuses before executing it, so a claim the call made and
// never got executed is abandoned, to be claimed afresh once the
// configuration is fixed, and any other stays pending. When in doubt a
// refusal is of the second kind: stopping decides nothing that cannot be
// undone.
//
//	refusal (Stripe's code, https://docs.stripe.com/error-codes)       claim    run    error
//	type card_error, any status (declines: card_declined,              failed   goes   ErrDeclined
//	  insufficient_funds, expired_card, authentication_required, ...)
//	resource_missing with param customer, source or payment_method    failed   goes   ErrDeclined
//	  (no such customer or payment method); missing (no such source
//	  on the customer)
//	the customer's payment method or bank account: account_closed,    failed   goes   ErrDeclined
//	  bank_account_declined, bank_account_restricted,
//	  bank_account_unusable, bank_account_unverified,
//	  billing_invalid_mandate, charge_exceeds_source_limit,
//	  debit_not_authorized, invalid_source_usage,
//	  payment_intent_authentication_failure,
//	  payment_intent_incompatible_payment_method,
//	  payment_intent_mandate_invalid,
//	  payment_intent_payment_attempt_failed,
//	  payment_method_bank_account_blocked,
//	  payment_method_currency_mismatch,
//	  payment_method_customer_decline, payment_method_provider_decline,
//	  payment_method_unexpected_state, refer_to_customer, and the card
//	  codes (card_declined, expired_card, incorrect_cvc, ...) whatever
//	  the type
//	the item's own data, recorded on the claim and never sent         failed   goes   ErrDeclined
//	  otherwise under its key: amount_too_small, amount_too_large
//	  (the price), timestamp_too_far_in_past (a usage report's
//	  window start, which only grows older)
//	400 idempotency_error                                              pending  goes   ErrKeyReused
//	401, 403 (api_key_expired, a wrong or revoked key, a restricted    pending  stops  ErrStripeAuth
//	  key without permission)
//	any other 4xx: a wrong URL (404 without a code),                   pending  stops  ErrStripeRequest
//	  parameter_unknown, parameter_missing, parameter_invalid_*,
//	  resource_missing of another parameter or none, livemode_mismatch,
//	  testmode_charges_only, secret_key_required, an API version
//	  Stripe refuses, a currency the account cannot charge, a code
//	  not listed here, and any error answer that is not Stripe's (a
//	  proxy's or a web server's own page, without Stripe's Request-Id)
//
// The table is one for every kind. Two kinds add to it, each in one
// place: once an invoice's claim holds its draft, a refusal of a later
// step that the table would record as failed leaves the claim pending
// with [ErrNeedsReconciliation] instead, naming the invoice, since the
// draft exists (a person fixes the cause and calls again, or voids it);
// and Stripe's refusal of a meter event's identifier it has seen
// ("already exists") is the claim's own event when its key may have been
// sent before, and [ErrNeedsReconciliation] when it cannot have been.
//
// # One engine for every kind
//
// Charges, invoices, usage reports and refunds are kinds of one engine,
// which runs each the same way:
//
//  1. the key from the kind's business identity (invariant 1);
//  2. the claim, committed before anything is sent, with what the kind
//     records on it (a usage report's meter and window);
//  3. the kind's checks of other claims before a send (a re-bill's
//     earlier attempts, a window total's previous total), and, where the
//     key may have gone where this Biller's requests do not meet it, the
//     kind's lookup first;
//  4. every write, each invoice step included, through one guard: the
//     rate limit, the deadline check on the database clock, the trace
//     that tells a request never written, the call with its key, the
//     report to Config.Observe, and the count of Stripe's answers that
//     decides [ErrStripeUnreachable];
//  5. the outcome recorded, or the table above applied, or the claim left
//     pending for reconciliation, or handed back (released, or abandoned
//     when its key never ran);
//  6. past the key's deadline, or after an unknown outcome, the kind's
//     lookup; a lookup that finds nothing proves nothing while the key
//     went with another endpoint or credential and its whole window has
//     not passed (the one past-window rule, [ErrSentElsewhere]);
//  7. events (a webhook, a meter error report, a lookup's hit) move a
//     claim only when they are about its own send (see Webhooks).
//
// What differs between kinds:
//
//	kind          key from                          found past the window by        writes
//	charge        scope, customer, period, attempt  search on billonce_key          one: the charge or PaymentIntent
//	invoice       scope, customer, period; a step   search (draft), listing its     draft, each line, finalize,
//	              key per step                      lines, reading the invoice      collect, pay or send
//	usage report  scope, meter, customer, window,   the meter's event summary       one: the meter event, its
//	              kind, attempt                     for the window                  identifier the key
//	refund        scope, the payment's key,         listing the payment's refunds   one: the refund, or the
//	              refund id                         (credit notes) on billonce_key  invoice's credit note
//	transfer      scope, account, period, attempt   listing the account's transfers one: the transfer
//	                                                of its group
//	payout        scope, account, period, attempt   listing the account's payouts   one: the payout, on the
//	                                                                                account
//
// # Charges or PaymentIntents
//
// Config.API chooses the Stripe API. [Charges] (POST /v1/charges against the
// customer's default source) matches older integrations. [PaymentIntents]
// (confirm=true, off_session=true with a saved payment method) is what Stripe
// recommends for new ones and handles SCA; each Price must then carry a
// PaymentMethod.
//
// # Behind a spend-cap proxy
//
// A spend-cap proxy holds the Stripe secret and bounds what a run can
// spend. Give the Biller an HTTP client from [spendcap.Client] as
// Config.HTTPClient and the vault key as Config.SecretKey: the process then
// holds no Stripe secret. The proxy's refusals stop a Run as listed above.
// Package [github.com/billonce/billonce/billing/spendcap] has the client
// side and the proxy itself.
//
// # Testing code that uses billing
//
// Point Config.StripeURL at a fake Stripe from package
// [github.com/billonce/billonce/billing/billingtest] and count charges in its
// ledger; use claim.NewMemory for unit tests that need no database.
package billing
