package idemvet

// checkRetryKey reports a key made from a random source, the clock, a
// counter or the attempt number inside code that runs once per attempt
// (bs, see attempts.go): every attempt sends a new key.
func (c *checker) checkRetryKey(s sink, origins []origin, bs []boundary) bool {
	for _, b := range bs {
		for _, o := range origins {
			in := b.from <= o.pos && o.pos < b.to
			var why string
			switch {
			case o.kind == oSource && in:
				why = "it is made by " + o.desc + " inside it"
			case o.kind == oCounter && in:
				why = "it includes " + o.desc + ", which changes on every pass"
			case o.kind == oRangeVar && o.loop == b.node:
				why = "it includes the loop variable " + o.desc + ", a new value on every attempt"
			case o.kind == oParam && b.attemptNo[o.v]:
				why = "it includes the attempt number " + o.desc
			default:
				continue
			}
			c.report(s.cur, RetryKey,
				"idempotency key changes between attempts: %s, and %s; when Stripe commits an attempt whose response is lost, the next attempt carries a new key and charges again. "+
					"Make the key once per operation from what identifies it (customer, period: idemkey.For) before the retry starts, and send that same key on every attempt",
				b.what, why)
			return true
		}
	}
	return false
}
