// Package idemkey makes idempotency keys from business identity and sends
// them, unchanged, on every attempt of one operation.
//
// Stripe runs a POST carrying an Idempotency-Key it has seen before only
// once, and replays the first answer. That protects a charge only if every
// attempt of the same operation carries the same key, and different
// operations carry different keys. Keys made from random values or times
// break the first rule when a retry makes a new one; a key fixed once for a
// whole client breaks the second. This package makes both mistakes hard.
//
// # Making a key
//
// [For] hashes a scope and the parts that identify one operation:
//
//	key, err := idemkey.For("monthly-charge", customerID, "2026-01", "attempt-1")
//	if err != nil {
//		return err // empty, oversized or malformed input: fix the caller
//	}
//
// The same input gives the same key on every retry, replica and restart.
// The encoding is unambiguous (("a:b", "c") and ("a", "b:c") differ) and
// versioned: keys start with "bo1_", and a future format will use another
// prefix. The last part above is an attempt number that a person changes to
// bill again on purpose; never put a retry count, time or host in a key.
//
// Teams moving from JVM services that compute
// sha256(customer + ":" + period + ":" + suffix)[:32] use [Legacy] to send the
// very same keys while both run. It refuses the inputs for which that
// format is ambiguous.
//
// A key read back from storage becomes a [Key] again with [Parse].
//
// # Sending it
//
// Compute the key once, before any retry loop, and put it in the context
// with [WithKey]. A [Transport] in the HTTP client sets the Idempotency-Key
// header from that context:
//
//	client := &http.Client{Transport: &idemkey.Transport{}}
//	ctx = idemkey.WithKey(ctx, key) // once, outside the loop
//	for range 3 {
//		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, body())
//		resp, err := client.Do(req) // every attempt sends the same key
//		...
//	}
//
// The Transport never makes a key. A POST whose context has none is refused
// with *[MissingKeyError]; a request already carrying a different key (for
// example the random one stripe-go adds when params.IdempotencyKey is nil) is
// refused with *[KeyConflictError]. Either way nothing is sent. With
// stripe-go, set params.IdempotencyKey to key.String() as well as putting the
// key in the context.
//
// # Errors
//
// Input errors from [For], [Legacy] and [Parse] wrap [ErrInvalid] and say
// which element is wrong and why. They are permanent: do not retry them.
package idemkey
