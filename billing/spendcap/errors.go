package spendcap

import (
	"errors"
	"fmt"
)

// ErrInvalid is wrapped by every error that reports a bad
// configuration: nothing was sent when it is returned.
var ErrInvalid = errors.New("spendcap: invalid input")

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Refusals by a spend-cap proxy, matched by the [*ProxyError] a [Transport]
// returns. None of them reached Stripe. A billing run that meets one stops
// and sends nothing more: they are never retried.
var (
	// ErrSpendCapReached is returned when the proxy refused the request
	// because the cap of its vault key is spent, or the amount alone is
	// above the cap.
	ErrSpendCapReached = errors.New("spendcap: spend cap reached")
	// ErrEndpointNotAllowed is returned when the proxy refused an endpoint
	// that is not on the vault key's allowlist.
	ErrEndpointNotAllowed = errors.New("spendcap: endpoint not allowed by the spend-cap proxy")
	// ErrVaultKeyRevoked is returned when the proxy no longer accepts the
	// vault key (revoked, expired, unknown, or every key is suspended).
	ErrVaultKeyRevoked = errors.New("spendcap: vault key revoked")
)
