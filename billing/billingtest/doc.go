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
// confirm=true and a payment method is given); GET of each by id; GET
// /v1/charges and /v1/payment_intents listed by customer; GET
// /v1/charges/search and /v1/payment_intents/search with clauses such as
// metadata['billonce_period']:'2026-09', customer:'cus_1', status:'succeeded' joined by
// AND. Parameters are validated as Stripe does (a positive integer amount, a
// known lowercase currency, no unknown parameters); a rejection is a 400
// invalid_request_error that names the parameter.
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
//   - Only charges and payment intents exist: no customers, payment methods,
//     sources, refunds, captures, updates, confirm/cancel endpoints, invoices
//     or webhooks. Any customer or payment-method ID is accepted; a confirmed
//     payment intent does not create a separate ch_ object.
//   - Cards are not modelled: payments succeed unless a decline is set; there
//     is no 3-D Secure, requires_action, authorisation hold, minimum amount
//     per currency, zero-decimal currency rules or currency conversion.
//   - Search is exact-match only (metadata, customer, status, currency,
//     amount, joined by AND; no OR, negation, ranges or prefix matches) and is
//     immediately consistent; Stripe's search index can lag by up to a minute.
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
