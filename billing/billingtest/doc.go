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
// AND; and the invoice and usage-meter endpoints below. Parameters are validated as Stripe does (a positive integer amount, a
// known lowercase currency, no unknown parameters); a rejection is a 400
// invalid_request_error that names the parameter.
//
// # Usage meters
//
// POST /v1/billing/meters (or [Server.CreateMeter]) creates a meter that
// sums or counts events by event_name, optionally keeping only the most
// recent event of each UTC hour or day (event_time_window). POST
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
// invoice. GET /v1/invoices/{id}, its /lines (paged) and GET
// /v1/invoices/search (metadata['k']:'v', customer,
// status, currency, amount) read them. Each change emits invoice.created,
// invoice.finalized, invoice.paid, invoice.payment_failed, invoice.sent,
// invoice.voided, invoice.deleted or invoice.updated with the invoice as
// data.object.
// [Server.Invoices] is the ledger: status, lines, and how many times each
// invoice was finalized and paid.
//
// Every POST above goes through the idempotency layer below, with every
// fault, exactly as charges do.
//
// # Idempotency, as Stripe does it
//
// Every request needs an API key (Authorization: Bearer); idempotency keys
// are scoped per API key. Once a POST with an Idempotency-Key starts
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
// key, livemode_mismatch, a missing customer), stored nowhere. Faults are chosen, in this order, by
//
//   - [Server.FailNext]: a queue of faults for requests that match a [Match];
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
// payment, declined ones included, with its idempotency key; [Server.Log] is
// the request log (method, path, key, status, replayed, fault);
// [Server.Stats] the running totals. All return copies.
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
// charge.dispute.created after [Server.Refund] and [Server.Dispute].
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
//   - Only charges, payment intents, invoices, invoice items, meters and
//     meter events exist: no customers, payment methods, sources, refunds,
//     captures, updates, subscriptions, prices or
//     webhooks endpoints. Any customer or payment-method ID is accepted; a
//     confirmed payment intent does not create a separate ch_ object, and
//     paying an invoice creates no charge or payment intent.
//   - Invoices have no tax, discounts, credit balance, automatic
//     advancement (auto_advance is stored, nothing happens by itself),
//     uncollectible status or invoice-item endpoints beyond create; an
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
//   - Lists support customer, limit and starting_after, not ending_before or
//     created filters.
//   - All API keys belong to one account: every key sees every object. There
//     are no restricted-key permissions, Stripe-Account headers or live mode.
//   - The rate limiter is one global token bucket; Stripe's limits are per
//     account, per endpoint, with separate read and write budgets.
//   - Idempotency keys are compared per API key on method, path and the
//     exact set of form parameters; keys are not length-checked beyond what
//     stripe-go enforces and expired keys are forgotten lazily.
//   - The server's clock only moves forward; created timestamps follow it.
//   - HTTP/1.1 only, no TLS.
package billingtest
