// Package billingotel reports what a [billing.Biller] does as
// OpenTelemetry metrics and spans. It is the only package of billonce that
// imports OpenTelemetry: a program that does not use it does not link it.
//
// # Wiring
//
// Make an [Observer] and put its Observe method in billing.Config.Observe;
// the function you had there, if any, goes in Config.Next. Writes (charges,
// invoices, usage reports, refunds, transfers, payouts), Stripe calls,
// webhook deliveries and runs all arrive as billing's events:
//
//	obs, err := billingotel.New(billingotel.Config{}) // the global providers
//	if err != nil { … }
//	b, err := billing.New(billing.Config{…, Observe: obs.Observe})
//	…
//	sum, err := b.Run(ctx, period, customers, nil) // recorded when it returns
//
// A spend-cap proxy is observed where it runs, through its own hook:
//
//	px, err := spendcap.NewProxy(spendcap.ProxyConfig{…, Observe: obs.ObserveProxy})
//
// # Metrics
//
// Every metric is named under "billonce."; those of writes, Stripe calls
// and runs carry billonce.api ("charges" or "payment_intents", from
// Config.API). Those of writes, Stripe calls and payment updates carry
// billonce.object, the kind of write they are about, by Stripe's name of
// its object (billing.Event.Object): "charge", "payment_intent",
// "invoice", "meter_event" (a usage report), "refund", "credit_note",
// "transfer" or "payout"; a refund's outcomes or a payout's latency are
// seen apart from a charge's. No metric carries a customer, a period, a
// key or a request id.
//
//	billonce.writes                counter {write}     writes finished, of every kind: billonce.object,
//	                                                   billonce.outcome ("created", "replayed",
//	                                                   "already_billed", "reconciled", "not_billed")
//	                                                   and error.type (below)
//	billonce.stripe.call.duration  histogram s         HTTP calls of writes (creating a charge, payment
//	                                                   intent, meter event, refund, credit note,
//	                                                   transfer or payout, or a step of an invoice):
//	                                                   billonce.object, error.type (Stripe's error type,
//	                                                   "http_error" for an answer naming none,
//	                                                   "transport" when no answer came) and
//	                                                   http.response.status_code of an error answer
//	billonce.stripe.retries        counter {call}      calls that retried an earlier one with the same
//	                                                   key, by billonce.object
//	billonce.payment.updates       counter {update}    billonce.update ("settled", "refunded", "disputed"),
//	                                                   billonce.state of a settlement, billonce.object
//	                                                   (a refund that settles is "refund", the payment
//	                                                   it refunds "charge"); from a webhook or
//	                                                   Reconcile alike (an event does not say which)
//	billonce.webhook.events        counter {event}     webhook deliveries, by billonce.result: "applied",
//	                                                   "duplicate", "unchanged", "other_payment",
//	                                                   "unproven", "ignored", "not_applied", "rejected" (4xx: a bad
//	                                                   signature or body), "retry" (5xx)
//	billonce.runs                  counter {run}       billonce.result: "complete", "incomplete" (customers
//	                                                   not billed), "stopped" (Run returned an error)
//	billonce.run.duration          histogram s         the same attribute
//	billonce.run.customers         counter {customer}  billonce.outcome: "created", "already_billed",
//	                                                   "declined", "processing",
//	                                                   "declined_after_processing", "pending", "invalid"
//	billonce.proxy.requests        counter {request}   requests to a spend-cap proxy, by billonce.result:
//	                                                   "admitted" or the refusal (spendcap.Entry.Refused:
//	                                                   "cap", "endpoint", "revoked", "expired",
//	                                                   "unknown_key", "kill_switch", "bad_request",
//	                                                   "upstream", "store"); from ObserveProxy in
//	                                                   spendcap.ProxyConfig.Observe, where the proxy runs
//
// The run metrics come from billing's EventRun, reported when a Run
// returns, whether it ran or was refused; a run may mix kinds, and its
// metrics carry no billonce.object. error.type of a write is
// [billing.ErrorKind] of its error. billonce.object is absent from an
// event that names no object (one built by hand, or about a claim made
// before claims recorded their endpoint).
//
// The counter of writes was named billonce.charges, and the span
// billonce.charge, when charges were all billonce made; they count every
// kind now, and a name that says "charges" of a payout misleads.
//
// # Spans
//
// Each write that reaches its outcome is one span, "billonce.write",
// from the earlier of its first Stripe call and the start of its
// settlement to its outcome, with billonce.object, billonce.customer,
// billonce.period, billonce.key, billonce.outcome, billonce.attempt and
// billonce.request_id of a failure, error.type, and an error status
// when it was not billed. Each HTTP call to Stripe is an event of the span,
// "billonce.stripe.call", at the time the call started, with billonce.key
// (the write's, for every step of an invoice too), billonce.http_attempt
// (from 1 within one send), billonce.duration_s,
// http.response.status_code and error.type of an error answer, and
// billonce.request_id when Stripe answered. No attribute holds a secret:
// billing's events carry none.
//
// Calls are kept until their write's outcome, at most 64 per write and
// for at most 10,000 writes at once; past that, the write waiting
// longest is ended as a span without an outcome (error status "no
// outcome reported"), as are the writes of a period still waiting when
// a Run of that period returns. Spans are roots: billing's events carry no
// context to make them children of the caller's span.
package billingotel
