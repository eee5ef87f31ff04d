// Package billingtest is a fake Stripe API for tests: a real HTTP server on
// loopback that enforces Stripe's idempotency rules, fails on purpose when
// told to, and keeps a ledger of every payment it created. Counting payments
// per customer and billing period in that ledger is how a test proves that
// billing code charged exactly once.
//
// Request mocks never check idempotency keys, so code that sends a fresh key
// on every retry passes them and double-charges in production. This fake
// answers the way Stripe does, so the same code double-charges here first.
//
// # Starting a server
//
// [NewServer] starts a server on a free loopback port (or Config.Addr) and
// returns it; point the real stripe-go client at [Server.URL]:
//
//	srv := billingtest.NewServer(billingtest.Config{})
//	defer srv.Close()
//	backend := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
//		URL:               stripe.String(srv.URL),
//		MaxNetworkRetries: stripe.Int64(0),
//	})
//	charges := charge.Client{B: backend, Key: "sk_test_anything"}
//
// The package imports only the standard library. The spend-cap proxy's
// loopback fake, to put in front of this one, is package
// [github.com/billonce/billonce/billing/spendcap/spendcaptest].
//
// # What it serves
//
// POST /v1/charges (amount, currency, customer or source, description,
// metadata) and POST /v1/payment_intents (amount, currency, customer,
// payment_method, confirm, off_session, metadata; status "succeeded" when
// confirm=true and a payment method is given), POST
// /v1/payment_intents/{id}/confirm (payment_method, off_session) of a
// PaymentIntent that needs a payment method or a confirmation, POST
// /v1/payment_intents/{id}/cancel (cancellation_reason) of one that is
// not succeeded, processing or canceled; GET of each by id; GET
// /v1/charges and /v1/payment_intents listed by customer; GET
// /v1/charges/search and /v1/payment_intents/search with clauses such as
// metadata['billonce_period']:'2026-09', customer:'cus_1', status:'succeeded' joined by
// AND; and the invoice, usage-meter, refund, credit-note, Connect,
// transfer and payout endpoints below. Parameters are validated as Stripe
// does (a positive integer amount, a known lowercase currency, no unknown
// parameters); a rejection is a 400 invalid_request_error that names the
// parameter.
//
// # Usage meters
//
// POST /v1/billing/meters (or [Server.CreateMeter]) creates a meter that
// sums or counts events by event_name, optionally keeping only the most
// recent event of each UTC hour or day (event_time_window). Its id is
// unique among every Server's meters in the process, as Stripe's ids are
// across accounts. POST
// /v1/billing/meter_events is validated at once (timestamp within the
// past 35 days and at most 5 minutes ahead, a numeric value, an identifier
// of at most 100 characters) and refuses an identifier already used within
// Config.IdentifierWindow (24 hours) with 400 "An event already exists with
// identifier …" and no Stripe-Should-Retry. Accepted events are processed
// Config.MeterDelay (1 minute) later on the server's clock, or at once by
// [Server.AggregateNow]; only then do they count in GET
// /v1/billing/meters/{id}/event_summaries, whose start and end must be
// aligned to minutes (hours or days with a grouping window or a windowed
// meter). Events of a customer given to [Server.RejectUsage], or of an
// event_name with no meter, are accepted, then rejected at processing into
// a v1.billing.meter.error_report_triggered event: a v2 thin event in
// [Server.Events], served whole, with the rejected identifiers, by GET
// /v2/core/events/{id}: one per meter and per run of events received
// within Config.MeterDelay of each other, whose validation window runs
// from the first one's receipt to the last one's processing, as Stripe
// reports the events it validated in a short window. Every answer's Date
// header is the server's clock. The ledger's oracle is [Server.MeterTotal] (what
// the meter counts over every accepted, not rejected event, processed or
// not) and [Server.MeterEvents].
//
// # Invoices
//
// POST /v1/invoices creates a draft; pending_invoice_items_behavior
// defaults to exclude, as stripe-go v79 documents for API 2024-06-20, so
// the customer's pending items ([Server.AddPendingItem], or POST
// /v1/invoiceitems without invoice) are swept in only with include. POST
// /v1/invoiceitems with invoice adds a line to a draft of the same
// customer, and is refused for any other. POST /v1/invoices/{id}/finalize
// turns a draft open (or paid when nothing is due) and refuses anything
// else; /pay turns an open invoice paid, answers a declined customer 402
// card_error and leaves the invoice open (unless paid_out_of_band=true: a
// person marks it paid outside Stripe, and no card is charged), and
// refuses a paid, draft or void one; /send marks an open or paid
// send_invoice invoice sent; /void voids an open one; DELETE removes a
// draft; POST /v1/invoices/{id} changes the auto_advance of a draft or open
// invoice. GET /v1/invoices/{id}, its /lines (paged), GET /v1/invoices
// (newest first, by customer, status and created[gte|gt|lte|lt]; a list
// shows an invoice at once) and GET /v1/invoices/search
// (metadata['k']:'v', customer, status, currency, amount; after the
// search delay) read them. Each change emits invoice.created,
// invoice.finalized, invoice.paid, invoice.payment_failed, invoice.sent,
// invoice.voided, invoice.deleted or invoice.updated with the invoice as
// data.object. GET /v1/events lists the events of the last 30 days, newest
// first, by type and created[gte|gt|lte|lt], as Stripe does.
// [Server.Invoices] is the ledger: status, lines, and how many times each
// invoice was finalized and paid.
//
// # Refunds and credit notes
//
// POST /v1/refunds refunds a succeeded charge (charge) or payment intent
// (payment_intent), with an optional amount (what is left by default),
// reason and metadata. A payment takes several partial refunds, of the
// same amount or not, until they add up to its amount; then a refund is
// refused with 400 charge_already_refunded, one over what is left with
// 400 amount_too_large, and any refund of a payment with a dispute
// ([Server.Dispute]) with 400 charge_disputed. The charge's amount_refunded and refunded follow.
// A refund is succeeded at once, or pending when the payment's customer
// settles later (Config.Async, [Server.SettleLater]): it then succeeds,
// or fails with the Async's FailureCode as its failure_reason, [Async].After
// later on the server's clock, or when [Server.Settle] moves it to
// succeeded, failed or canceled; Settle also fails a succeeded refund, as
// Stripe reports one failed after it succeeded (its customer's bank
// returned it). A pending refund counts as refunded; a
// failed or canceled one gives its amount back to the payment and the
// balance, and the payment can be refunded again. Events follow API
// 2024-06-20: charge.refunded (the charge, or for a payment intent a
// charge naming it) when a refund is made, charge.refund.updated (the
// refund) when it settles. Stripe sent refund.created, refund.updated and
// refund.failed for refunds of a charge only from 2024-10-28, and stripe-go
// v79 has no refund.failed; the fake sends none of them. GET
// /v1/refunds?charge=…|payment_intent=… lists a payment's refunds, newest
// first and current at once (there is no refund search), and GET
// /v1/refunds/{id} reads one. [Server.Refund], a refund made in the
// Dashboard, makes the same refund without a key.
//
// POST /v1/credit_notes credits a finalized invoice by amount, or by lines
// (lines[N][type] invoice_line_item with an invoice_line_item, whole or
// for an amount, or custom_line_item with unit_amount and quantity). On an
// open invoice (a pre_payment note) it reduces amount_due, never below
// nothing, and takes no refund_amount, credit_amount or out_of_band_amount;
// an invoice with nothing left due is paid, with no payment. On a paid
// invoice (post_payment) refund_amount, credit_amount and
// out_of_band_amount must add up to its total; refund_amount makes a
// succeeded refund of the invoice's payment (at most what was paid and not
// refunded; none for an invoice paid out of band). The credit notes of an
// invoice never credit more than its total; a draft or void invoice takes
// none. Each emits credit_note.created. GET /v1/credit_notes?invoice=…
// (or customer=) lists them, GET /v1/credit_notes/{id} reads one.
//
// # Connected accounts, transfers and payouts
//
// [Server.CreateAccount] (or POST /v1/accounts) connects an account to the
// platform. A request with a Stripe-Account header (Stripe-Context on /v2)
// acts on that account; one naming an account that is not connected is
// refused with 403 account_invalid. Charges, payment intents, invoices,
// meters, meter events, error reports, refunds, credit notes and payouts
// live on the account they were made on: another account, the platform
// included, neither lists nor reads them, and answers 404
// resource_missing for their ids. A customer lives on the account it is
// first named on, as though it had been created there: named on another
// account it is missing (404 resource_missing on the customer parameter,
// or a meter event rejected at processing with
// meter_event_customer_not_found). Idempotency keys are scoped per API key
// and per account. An event of a connected account carries the top-level
// account field ([Event].Account), and a meter error report its context.
//
// Each account has an available balance per currency: what
// [Server.SetBalance] sets, plus the payments that succeed and the
// invoices paid (at once: the fake has no pending balance and no fees),
// less refunds (which may take it below zero, as Stripe debits the
// account), transfers and payouts; GET /v1/balance and [Server.Balance]
// read it. POST /v1/transfers (amount, currency, destination, an acct_
// connected account, transfer_group, metadata) moves the platform's
// balance to the destination's and emits transfer.created; it is made by
// the platform only, and one larger than the balance is refused with 400
// balance_insufficient. GET /v1/transfers?destination=…&transfer_group=…
// lists them. POST /v1/transfers/{id}/reversals (amount, what is left by
// default) gives part of a transfer back, from the destination's balance
// to the platform's, and emits transfer.reversed with the transfer; it is
// refused with amount_too_large over what is left, and with
// balance_insufficient when the destination's balance is short. GET
// /v1/transfers/{id}/reversals lists them, as does the transfer's
// reversals field. POST /v1/payouts (amount, currency, method, metadata) pays
// out the balance of the account it is made on, or refuses with
// balance_insufficient; a payout is pending (payout.created), in transit
// an hour later (payout.updated) and paid on its arrival date two days
// after it was made (payout.paid); an instant one is in transit at once
// and paid within half an hour. [Server.Settle] moves a payout on now,
// cancels a pending one (payout.canceled) or fails one, even once paid,
// as a bank may days later (payout.failed, with its failure_code); a
// failed or canceled payout's amount is back in the balance. GET
// /v1/payouts lists them (status= filters them); every list of this
// section, refunds and credit notes included, also takes
// created[gte|gt|lte|lt] and refuses a filter it does not know.
//
// Every POST above goes through the idempotency layer below, with every
// fault, exactly as charges do; a refusal that depends on the server's
// state (a refund over what is left, a short balance, a draft invoice)
// stores nothing, so the same key may succeed once the state allows it.
//
// # Idempotency, as Stripe does it
//
// Every request needs an API key (Authorization: Bearer); idempotency keys
// are scoped per API key and per account. Once a POST with an Idempotency-Key starts
// executing, its status and body are stored, 500s included. A later request
// with that key gets the stored answer with Idempotent-Replayed: true (and
// Original-Request). The same key with other parameters, or on the other
// endpoint, answers 400 idempotency_error; a request while the first is
// still executing answers 409 idempotency_key_in_use. Validation errors, 429s
// and injected faults "before commit" store nothing. Keys are forgotten
// Config.KeyTTL (24 hours) after first use on the server's clock, which only
// [Server.Advance] moves beyond the wall clock; after that the same key
// creates a new payment. Every response carries Request-Id, and
// Stripe-Should-Retry where Stripe sends it.
//
// Note that stripe-go v79 adds a random Idempotency-Key to every POST whose
// params carry none, whatever MaxNetworkRetries is, and reuses it for its own
// retries; a retry made by the caller around stripe-go gets a new one.
//
// # Failing on purpose
//
// A [Fault] says what happens to one request; see [FaultKind] for the list:
// commit then drop the connection ([FaultDrop], [FaultCut]), commit then
// answer late ([FaultSlow]), 500 before or after commit, 409 in flight, 429
// lock_timeout or rate_limit, declines (402 card_error with a
// decline_code, stored like any result), and any other Stripe refusal you
// describe ([FaultRefuse] with a [Refusal]: an unknown parameter, an expired
// key, livemode_mismatch, a customer Stripe does not know), stored nowhere. Faults are chosen, in this order, by
//
//   - [Server.FailNext]: a queue of faults for requests that match a
//     [Match] (method, path, customer, idempotency key, account);
//   - Config.Script or [Server.SetScript]: a func([Request]) [Fault], such as
//     [RandomFaults], which draws seeded random faults from a hash of the
//     seed, the API and idempotency keys and the attempt number, so a run is
//     repeatable however requests interleave;
//   - [Server.Decline]: customers whose card always declines (their state,
//     not a fault of the request).
//
// All of them, and the rate limiter ([Server.SetRateLimit]), can be changed
// while the server runs.
//
// [FaultDrop] closes the connection without a byte. On a reused keep-alive
// connection net/http then resends the request once by itself, because a
// request with an Idempotency-Key counts as replayable; the resend gets the
// stored answer. Use [FaultCut] (headers and half a body, then close) when the
// client must see the failure: that is the seeds' lost response after Stripe
// committed.
//
// # Reading the ledger
//
// [Server.Count] and [Server.CountPeriod] count payments that moved money
// per customer and per (customer, period), the period being the metadata
// value under Config.PeriodKey ("billonce_period", the key billing.Biller writes). [Server.Payments] lists every
// payment, declined ones included, with its idempotency key and account;
// [Server.Movements] every refund, credit note, transfer, reversal and payout, with
// what it is about, its status, period and key: counting them is the
// oracle of money going out. [Server.Balance] is an account's balance;
// [Server.Log] is the request log (method, path, account, key, status,
// replayed, fault); [Server.Stats] the running totals. All return copies.
//
// # Payments that settle later, and webhooks
//
// Config.Async or [Server.SettleLater] makes a customer pay by bank debit:
// a charge is created "pending", a confirmed payment intent "processing",
// neither counted in the ledger; once [Async].After has passed on the
// server's clock ([Server.Advance]) it succeeds, and is counted, or fails
// with its FailureCode. Every change of a payment is an event, as Stripe
// would send it ([Server.Events]): charge.pending, charge.succeeded,
// charge.failed, payment_intent.processing, payment_intent.succeeded,
// payment_intent.payment_failed, and charge.refunded and
// charge.dispute.created after a refund and [Server.Dispute]; the refunds
// and payouts of the section above move on the same clock.
// [Server.ConfirmIntent] is a declined payment intent completed later
// on-session by its customer (3-D Secure after an off-session
// authentication_required, or another card): it succeeds, is counted and
// emits payment_intent.succeeded.
// [Server.Final] gives every payment's final status.
//
// A [Sender] delivers events to a webhook endpoint as Stripe does: signed
// ([Sign]: Stripe-Signature t=…,v1=HMAC-SHA256), at least once (seeded
// duplicates), in shuffled order, after random delays, retried while the
// endpoint answers anything but 2xx.
//
// # Another process
//
// A chaos run may serve the fake from its own process (Config.Addr).
// billing/billingtest/cmd/fake-stripe does, and serves the ledger and the settings as JSON
// on a second address for processes that drive it over HTTP; the package
// itself has no endpoints beyond Stripe's.
//
// # What the fake does not model
//
// Trust it for idempotency and failure handling, not for the rest of Stripe:
//
//   - Only charges, payment intents, invoices, invoice items, meters,
//     meter events, refunds, credit notes, transfers, payouts, the balance
//     and connected accounts exist: no customer objects, payment methods,
//     sources, captures, updates, cancel endpoints (but a payment intent's), subscriptions, prices,
//     balance transactions or webhooks endpoints. Any customer or
//     payment-method ID is accepted (a customer where it is first named); a
//     confirmed payment intent does not create a separate ch_ object (its
//     refunds name no charge), and paying an invoice creates no charge or
//     payment intent: a credit note's refund names none and emits no event
//     of its own.
//   - Refunds cannot be updated or canceled through the API (only
//     [Server.Settle] settles them), and are never refused for a short
//     balance or a dispute. Credit notes cannot be voided or previewed,
//     have no /lines endpoint of their own, and credit_amount moves no
//     customer balance (the fake has none); a line is not checked against
//     what earlier notes credited of it, only the invoice's total is.
//   - Transfers cannot be tied to a source_transaction, a reversal cannot
//     be read alone or updated, and Connect's destination charges
//     (transfer_data, application_fee_amount) are not modelled. Payouts go
//     to no bank account object, cannot be reversed, and are never
//     automatic. Accounts cannot be read, updated or deleted; every one is
//     enabled at once.
//   - Invoices have no tax, discounts, credit balance, automatic
//     advancement (auto_advance is stored, nothing happens by itself)
//     or invoice-item endpoints beyond create; an
//     invoice's currency is its first line's (usd when it has none).
//   - Meters cannot be updated or deactivated; there are no meter event
//     adjustments and no v2 meter event streams. Whether an event is
//     rejected is decided when it is accepted (its customer, its meter),
//     though reported only once processed. An error report lists every
//     rejected identifier (up to 100 per code), where Stripe sends samples.
//   - Cards are not modelled: payments succeed unless a decline is set; there
//     is no 3-D Secure challenge (a decline set as authentication_required
//     fails off session, with that code, and goes through when the
//     PaymentIntent is confirmed again on session, as once its customer has
//     authenticated), no requires_action, authorisation hold, minimum amount
//     per currency, zero-decimal currency rules or currency conversion.
//   - Search is exact-match only (metadata, customer, status, currency,
//     amount, joined by AND; no OR, negation, ranges or prefix matches). An
//     object becomes searchable Config.SearchDelay after its creation on the
//     server's clock (0 by default: at once); Stripe's index usually lags by
//     up to a minute, and more during incidents.
//   - Lists support customer, limit and starting_after, not ending_before;
//     only the lists of refunds, credit notes, transfers and payouts take
//     created filters.
//   - All API keys belong to the platform: every key sees every object of
//     the account it acts on. There are no restricted-key permissions, OAuth
//     access revocation or live mode.
//   - The rate limiter is one global token bucket; Stripe's limits are per
//     account, per endpoint, with separate read and write budgets.
//   - Idempotency keys are compared per API key on method, path and the
//     exact set of form parameters; keys are not length-checked beyond what
//     stripe-go enforces and expired keys are forgotten lazily.
//   - The server's clock only moves forward; created timestamps follow it.
//   - HTTP/1.1 only, no TLS.
package billingtest
