package idemkey

// The input limits, for the tests of package idemkey_test.
const (
	MaxScopeBytes = maxScopeBytes
	MaxPartBytes  = maxPartBytes
	MaxParts      = maxParts
	MaxKeyBytes   = maxKeyBytes
)
