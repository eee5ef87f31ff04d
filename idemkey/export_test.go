package idemkey

// The input limits, for the tests of package idemkey_test.
const (
	MaxScopeBytes = maxScopeBytes
	MaxPartBytes  = maxPartBytes
	MaxParts      = maxParts
	MaxKeyBytes   = maxKeyBytes
)

// Header is the key's header name, for the tests of package idemkey_test.
const Header = header
