// Package idemvet is a go/analysis analyzer that reports code which can
// make Stripe charge a customer twice. Run it with the idemvet command:
// standalone (idemvet ./...) or as go vet -vettool=$(which idemvet) ./...
//
// Reports (the diagnostic category in brackets):
//   - [retrykey] a key made from uuid, crypto/rand, math/rand, the clock, a
//     counter or the attempt number inside code that runs once per attempt:
//     a function passed to a retry helper (backoff, retry-go, go-retry,
//     try, billonce/retry, any package named *retry*/*backoff*), a function
//     it calls, a loop that repeats after an error, or an http.RoundTripper.
//   - [freshkey] a random key made for one request with no retry reusing it:
//     no safer than no key.
//   - [fixedkey] one key for many operations: invariant across a range loop
//     whose request changes, or read from the receiver or a package variable
//     in a function whose parameters name the operation.
//   - [nokey] a stripe-go New/Confirm/Pay/Capture/Increment write of a
//     resource that moves or bills money whose params surely carry no key
//     (-allwrites: every resource). Update is not reported: a repeated
//     update sets the same values again.
//   - [poollock] pg_advisory_lock/unlock through *pgxpool.Pool, *sql.DB or
//     *sqlx.DB instead of one pinned connection; [xactlock] a transaction
//     advisory lock through a pool outside a transaction.
//
// Silence a deliberate case with //idemvet:ignore <reason> on the reported
// line or the line above it; without a reason it is not honoured.
//
// Not found: check-then-charge races between replicas, a crash between
// Stripe and the database, resending a key after Stripe's 24 h window,
// keys built across packages through values other than function
// arguments and results.
package idemvet
