package idemkey

import (
	"encoding/binary"
	"errors"
	"slices"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// decode is the inverse of encode. That it recovers every input proves
// the encoding injective: two different tuples never hash the same bytes.
func decode(tb testing.TB, b []byte) []string {
	tb.Helper()
	var out []string
	for len(b) > 0 {
		if len(b) < 4 {
			tb.Fatalf("encoding ends in a truncated length: %x", b)
		}
		n := binary.BigEndian.Uint32(b)
		b = b[4:]
		if uint64(n) > uint64(len(b)) {
			tb.Fatalf("length %d overruns the remaining %d bytes", n, len(b))
		}
		out = append(out, string(b[:n]))
		b = b[n:]
	}
	return out
}

// valid is an independent statement of the input rules For documents.
func valid(s string, max int) bool {
	return s != "" && len(s) <= max && utf8.ValidString(s) &&
		strings.IndexFunc(s, unicode.IsControl) < 0 && strings.TrimSpace(s) == s
}

func FuzzFor(f *testing.F) {
	f.Add("monthly-charge", "cus_A", "2026-01", uint(3))
	f.Add("charge", "a:b", "c", uint(1))
	f.Add("charge:", "a", "", uint(0))
	f.Add("日", "😀:", "é|\\", uint(5))
	f.Add("s", "\x00\x00\x00\x01a", "b", uint(2))
	f.Add("s", " a", "b\n", uint(9))
	f.Add("s", "\xff", "\u0085", uint(1))
	f.Fuzz(func(t *testing.T, scope, a, b string, cut uint) {
		k, err := For(scope, a, b)
		wantOK := valid(scope, MaxScopeBytes) && valid(a, MaxPartBytes) && valid(b, MaxPartBytes)
		if (err == nil) != wantOK {
			t.Fatalf("For(%q, %q, %q) error = %v, want error: %v", scope, a, b, err, !wantOK)
		}
		if err != nil {
			if !errors.Is(err, ErrInvalid) || !k.IsZero() {
				t.Fatalf("For(%q, %q, %q) = %q, %v; want the zero key and ErrInvalid", scope, a, b, k, err)
			}
			return
		}

		s := k.String()
		if len(s) != 68 || !strings.HasPrefix(s, prefix) || strings.Trim(s[4:], "0123456789abcdef") != "" {
			t.Fatalf("key %q: want bo1_ and 64 lowercase hex characters", s)
		}
		if p, err := Parse(s); err != nil || p != k {
			t.Fatalf("Parse(%q) = %q, %v", s, p, err)
		}
		if again, _ := For(scope, a, b); again != k {
			t.Fatalf("For is not deterministic: %s then %s", k, again)
		}
		if got, want := decode(t, encode(nil, scope, []string{a, b})), []string{scope, a, b}; !slices.Equal(got, want) {
			t.Fatalf("decode(encode(%q)) = %q", want, got)
		}

		// Moving the boundary between the parts, or between the scope and
		// the first part, or merging the parts, must change the key.
		differs := func(what string, scope2 string, parts2 ...string) {
			k2, err := For(scope2, parts2...)
			if err == nil && k2 == k {
				t.Fatalf("%s: For(%q, %q, %q) and For(%q, %q) share key %s", what, scope, a, b, scope2, parts2, k)
			}
		}
		joined := a + b
		c := int(cut % uint(len(joined)+1))
		if joined[:c] != a {
			differs("re-split", scope, joined[:c], joined[c:])
		}
		differs("merged", scope, joined)
		differs("merged with ':'", scope, a+":"+b)
		sa := scope + a
		c = int(cut % uint(len(sa)+1))
		if sa[:c] != scope {
			differs("scope boundary", sa[:c], sa[c:], b)
		}
	})
}
