package idemvet

import "go/ast"

// checkFreshKey reports a key made from a random source or the clock for
// one call, with no retry in sight that reuses it (bs is empty): it is
// worth no more than the random key stripe-go adds by itself.
func (c *checker) checkFreshKey(s sink, origins []origin, bs []boundary) bool {
	if len(bs) > 0 {
		return false
	}
	for _, o := range origins {
		if o.kind != oSource {
			continue
		}
		shared := false
		for e := range s.cur.Enclosing((*ast.ForStmt)(nil), (*ast.RangeStmt)(nil), (*ast.FuncLit)(nil)) {
			if !within(e.Node(), o.pos) {
				shared = true // the key is made once and used on several passes or calls
			}
		}
		if shared {
			continue
		}
		c.report(s.cur, FreshKey,
			"idempotency key made by %s for this one request: a retry of the code around it, a restart or the next run makes another key, and Stripe charges again (it is no safer than sending no key). "+
				"Derive the key from what identifies the operation (customer, period: idemkey.For) so every attempt, replica and rerun sends the same one",
			o.desc)
		return true
	}
	return false
}
