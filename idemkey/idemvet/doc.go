// Package idemvet is a go/analysis analyzer that reports code which can
// make Stripe charge a customer twice. Run it with the idemvet command:
// standalone (idemvet ./...) or as go vet -vettool=$(which idemvet) ./...
//
// Reports (the diagnostic category in brackets):
//   - [retrykey] a key made from uuid (and ksuid, xid, ulid, snowflake...),
//     crypto/rand, math/rand, the clock, a counter (atomic ones too) or the
//     attempt number inside code that runs once per attempt: a function
//     passed to a retry helper (backoff, retry-go, go-retry, try,
//     billonce/retry, k8s wait, any package named *retry*/*backoff*), a
//     function it calls, a loop that repeats after an error (counted,
//     endless or over a channel; a labelled break or continue counts), a
//     function that calls itself again after an error, or an
//     http.RoundTripper. A loop or recursion whose request changes with its
//     counter walks a collection and is not a retry.
//   - [freshkey] a random key made for one request with no retry reusing it:
//     no safer than no key.
//   - [fixedkey] one key for many operations: invariant across a range loop
//     whose request changes, or read from the receiver or a package variable
//     in a function whose parameters name the operation. A receiver built
//     per operation (the request's customer comes from it too, or its key
//     is made from a value that also fills another of its fields) is not
//     reported.
//   - [nokey] a stripe-go New/Create/Confirm/Pay/Capture/Increment write of
//     a resource that moves or bills money (charges, payment intents,
//     subscriptions, refunds, transfers, payouts and the like; invoices
//     with every step: New, AddLines, FinalizeInvoice, Pay, SendInvoice,
//     VoidInvoice; invoice items; usage: meter events and their
//     adjustments) whose params surely carry no key (-allwrites: every
//     resource), through the resource packages (sub, subitem and
//     subschedule of stripe-go before v74 too), client.API or v82's
//     stripe.Client. Params surely carry no key when they are nil, a
//     literal without one, or a local variable or function result built
//     from those (in any package) that gets no key and reaches no other
//     code before the write. Update is not reported: a repeated update
//     sets the same values again.
//   - [poollock] pg_advisory_lock/unlock through *pgxpool.Pool, *sql.DB or
//     *sqlx.DB instead of one pinned connection; [xactlock] a transaction
//     advisory lock through a pool outside a transaction.
//
// A key is what goes into Params.IdempotencyKey, SetIdempotencyKey, an
// Idempotency-Key header (Header.Set/Add, an http.Header or map literal,
// resty's SetHeader), or an argument that a function turns into one.
//
// Silence a deliberate case with //idemvet:ignore <reason> on the reported
// line, the line above it, or the line above the statement holding it;
// without a reason it is not honoured.
//
// What it does not find:
//   - check-then-charge races between replicas, a crash between Stripe and
//     the database, resending a key after Stripe's 24 h window;
//   - keys built in another package and handed over by anything but
//     function arguments and results, or a struct field the called
//     function fills from a random source (op := NewOp(); op.Key): a key
//     in a channel, an interface, or a struct filled in later;
//   - a retry loop whose request also changes with the attempt counter
//     (p.Description = "attempt " + n) is taken for a walk: a key from the
//     counter there is not reported;
//   - a fixed key on a receiver built with its key made from a value it
//     also keeps in another field (&Biller{period: p, key: "charge-" + p}),
//     when the request names no customer: it is taken for a value built
//     per operation;
//   - a keyless write whose params come from the caller, a slice, a map or
//     a struct field (for _, p := range lines { InvoiceItems.New(p) }): it
//     cannot tell whether other code gave them a key;
//   - a pool hidden behind an interface (sqlc's DBTX) or SQL held in a
//     non-constant variable;
//   - requests sent with raw net/http to Stripe without any Idempotency-Key
//     header.
package idemvet
