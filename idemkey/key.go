package idemkey

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Limits on the input of [For], [Legacy] and [Parse], as their docs state.
// They are far above any real business identity (a Stripe customer ID is
// about 18 bytes) and keep a runaway caller from hashing megabytes into a
// key.
const (
	maxScopeBytes = 64  // the longest scope For accepts, in bytes
	maxPartBytes  = 255 // the longest part For, and customer, period or suffix Legacy, accepts
	maxParts      = 16  // the most parts For accepts
	maxKeyBytes   = 255 // the longest key Parse accepts: Stripe's limit
)

// prefix marks the version of the [For] format. A future format gets a new
// prefix ("bo2_"), so its keys can never equal today's.
const prefix = "bo1_"

// legacyHexLen is the length of a [Legacy] key: the first 32 hex characters.
const legacyHexLen = 32

// ErrInvalid is returned, wrapped, by [For], [Legacy] and [Parse] when
// their input is bad; the error says what to fix. Such an error is permanent: the same input fails the same way, so do not
// retry it; fix the input.
var ErrInvalid = errors.New("idemkey: invalid input")

// Key is an idempotency key. Make one with [For], [Legacy] or [Parse]. The
// zero Key is invalid: [WithKey] with it hides any outer key and the
// [Transport] refuses to send under it. Keys are comparable with ==.
//
// A Key is not a secret: it is a hash of business identity and may be
// logged.
type Key struct {
	s string
}

// String returns the key as sent in the Idempotency-Key header. It is
// "" for the zero Key.
func (k Key) String() string { return k.s }

// IsZero reports whether k is the zero Key, which is never a valid key.
func (k Key) IsZero() bool { return k.s == "" }

// For returns the key of one operation, derived only from what identifies it:
// a scope naming the kind of operation ("monthly-charge") and the parts that
// identify this instance of it (customer ID, billing period, and an attempt
// number that changes only when a person decides to bill again). Never pass
// times, random values, retry counts or host names: the key must be the same
// on every retry, every replica and every restart.
//
// The key is "bo1_" followed by the 64 lowercase hex characters of
// SHA-256 over the scope and each part, each preceded by its length in bytes
// as a 4-byte big-endian integer. The lengths make the encoding unambiguous:
// ("a:b", "c") and ("a", "b:c") give different keys. Strings are hashed as
// the bytes given; normalize Unicode before calling if your IDs may arrive in
// different forms.
//
// The scope and at least one part are required (a key from the scope alone
// would be shared by every customer). Each must be valid UTF-8 without
// control characters or leading or trailing white space, the scope at most
// 64 bytes and each part at most 255 bytes, with at most 16 parts. Otherwise For returns an error wrapping [ErrInvalid].
func For(scope string, parts ...string) (Key, error) {
	if err := check("scope", -1, scope, maxScopeBytes); err != nil {
		return Key{}, err
	}
	if len(parts) == 0 {
		return Key{}, invalidf("no parts after scope %q; pass what identifies the operation, such as the customer ID and billing period", scope)
	}
	if len(parts) > maxParts {
		return Key{}, invalidf("%d parts, over the limit of %d", len(parts), maxParts)
	}
	for i, p := range parts {
		if err := check("parts", i, p, maxPartBytes); err != nil {
			return Key{}, err
		}
	}

	var stack [512]byte
	sum := sha256.Sum256(encode(stack[:0], scope, parts))
	var out [len(prefix) + 2*sha256.Size]byte
	copy(out[:], prefix)
	hex.Encode(out[len(prefix):], sum[:])
	return Key{s: string(out[:])}, nil
}

// encode appends the unambiguous encoding of scope and parts to buf: each
// string preceded by its byte length as a 4-byte big-endian integer.
func encode(buf []byte, scope string, parts []string) []byte {
	buf = appendField(buf, scope)
	for _, p := range parts {
		buf = appendField(buf, p)
	}
	return buf
}

func appendField(buf []byte, s string) []byte {
	n := uint32(len(s))
	buf = append(buf, byte(n>>24), byte(n>>16), byte(n>>8), byte(n))
	return append(buf, s...)
}

// Legacy returns the key JVM billing services commonly compute: the first 32
// lowercase hex characters of SHA-256 over customer + ":" + period + ":" +
// suffix. Use it only while Go and JVM code bill the same customers and
// must send the same keys, for example during a migration; use [For]
// everywhere else.
//
// The format is ambiguous: a plain ":" join cannot tell ("a:b", "c") from
// ("a", "b:c"), so two different operations can share a key and Stripe
// would replay one's charge for the other. Legacy therefore refuses a
// customer or period containing ':' (the suffix may contain it: with no ':'
// before it, the split is unique). It applies the same checks as [For]
// otherwise (each of the three at most 255 bytes), and its errors wrap
// [ErrInvalid]. Legacy keys are 32 hex
// characters and never equal a [For] key.
func Legacy(customer, period, suffix string) (Key, error) {
	for _, f := range [...]struct{ name, v string }{{"customer", customer}, {"period", period}, {"suffix", suffix}} {
		if err := check(f.name, -1, f.v, maxPartBytes); err != nil {
			return Key{}, err
		}
	}
	for _, f := range [...]struct{ name, v string }{{"customer", customer}, {"period", period}} {
		if strings.IndexByte(f.v, ':') >= 0 {
			return Key{}, invalidf("%s %q contains ':', which makes the legacy format ambiguous; use For for such identities", f.name, f.v)
		}
	}

	var stack [512]byte
	buf := append(stack[:0], customer...)
	buf = append(buf, ':')
	buf = append(buf, period...)
	buf = append(buf, ':')
	buf = append(buf, suffix...)
	sum := sha256.Sum256(buf)
	var out [legacyHexLen]byte
	hex.Encode(out[:], sum[:legacyHexLen/2])
	return Key{s: string(out[:])}, nil
}

// Parse turns a key read back from storage (a claim row, a log line) into a
// Key. It accepts any string the Idempotency-Key header can carry safely:
// 1 to 255 bytes (Stripe's limit) of printable ASCII without spaces. It does not
// check the format: keys made by older code stay usable. Errors wrap
// [ErrInvalid].
func Parse(s string) (Key, error) {
	if s == "" {
		return Key{}, invalidf("empty key")
	}
	if len(s) > maxKeyBytes {
		return Key{}, invalidf("key is %d bytes, over the limit of %d", len(s), maxKeyBytes)
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; c <= ' ' || c > '~' {
			return Key{}, invalidf("key has byte %#02x at offset %d; keys are printable ASCII without spaces", c, i)
		}
	}
	return Key{s: s}, nil
}

// check validates one element of a key. The field name is built only on
// failure, keeping the success path free of allocations.
func check(field string, index int, s string, max int) error {
	if p := problem(s, max); p != "" {
		if index >= 0 {
			field = fmt.Sprintf("%s[%d]", field, index)
		}
		return invalidf("%s %s", field, p)
	}
	return nil
}

// problem says what is wrong with s, or returns "" if nothing is.
func problem(s string, max int) string {
	if s == "" {
		return "is empty; every element must identify the operation"
	}
	if len(s) > max {
		return fmt.Sprintf("is %d bytes, over the limit of %d", len(s), max)
	}
	for i, r := range s {
		if r == utf8.RuneError {
			if _, size := utf8.DecodeRuneInString(s[i:]); size == 1 {
				return fmt.Sprintf("is not valid UTF-8 (byte %d)", i)
			}
		}
		if unicode.IsControl(r) {
			return fmt.Sprintf("contains control character %U at byte %d", r, i)
		}
	}
	first, _ := utf8.DecodeRuneInString(s)
	last, _ := utf8.DecodeLastRuneInString(s)
	if unicode.IsSpace(first) || unicode.IsSpace(last) {
		return fmt.Sprintf("%q has leading or trailing white space; trim it so one identity always gives one key", s)
	}
	return ""
}

func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}
