package billing

import (
	"context"
	"sync/atomic"
)

var defaultBiller atomic.Pointer[Biller]

// SetDefault makes b the Biller that the package-level [Charge] uses, in
// the manner of slog.SetDefault: build the Biller once at start-up with
// [New], set it, and let the rest of the service call billing.Charge. A nil
// b unsets it. It is safe to call concurrently with Charge.
func SetDefault(b *Biller) { defaultBiller.Store(b) }

// Charge bills customer for period exactly once with the default Biller
// (see [SetDefault]), at the price from its Config.Price: it is
// [Biller.Charge] with nil options. Before SetDefault it returns a
// [*ChargeError] wrapping [ErrInvalid] and sends nothing.
func Charge(ctx context.Context, customer, period string) (Receipt, error) {
	b := defaultBiller.Load()
	if b == nil {
		return Receipt{}, chargeErr(job{customer: customer, period: period, attempt: 1}, nil, "",
			invalid("no default Biller: call billing.SetDefault with the Biller from billing.New first"))
	}
	return b.Charge(ctx, customer, period, nil)
}
