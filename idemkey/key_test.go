package idemkey_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/billonce/billonce/idemkey"
)

// The expected values below were computed outside Go, with Python's hashlib
// and sha256sum, from the format documented on For and Legacy.
func TestKnownAnswers(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		got  func() (idemkey.Key, error)
		want string
	}{
		{"For charge", func() (idemkey.Key, error) { return idemkey.For("monthly-charge", "cus_A", "2026-01", "1") },
			"bo1_60a26cf59a2124b696acfc108499d2e9c422019105d8a0f5be2b8d599634fe0e"},
		{"For a:b,c", func() (idemkey.Key, error) { return idemkey.For("charge", "a:b", "c") },
			"bo1_555499e733002d1f5cd2c1f7b09278b33f5a74811577e9daed1acfc68edcc6c8"},
		{"For a,b:c", func() (idemkey.Key, error) { return idemkey.For("charge", "a", "b:c") },
			"bo1_0dc816e3b89630c01210a75add28a009ed23e014bf5c1af5f6742ec7b8afc4d6"},
		{"Legacy http4k", func() (idemkey.Key, error) { return idemkey.Legacy("cus_A", "2026-01", "http4k-billing") },
			"4371644837a7a968c6bfaf926b55bf16"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := tt.got()
			if err != nil {
				t.Fatal(err)
			}
			if k.String() != tt.want {
				t.Errorf("key = %s, want %s", k, tt.want)
			}
		})
	}
}

// Key from intent: a key is a pure function of its input.
func TestForDeterministic(t *testing.T) {
	t.Parallel()
	a, err := idemkey.For("charge", "cus_A", "2026-01")
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		b, err := idemkey.For("charge", "cus_A", "2026-01")
		if err != nil {
			t.Fatal(err)
		}
		if a != b {
			t.Fatalf("For gave %s then %s for the same input", a, b)
		}
	}
}

func TestForIsUnambiguous(t *testing.T) {
	t.Parallel()
	// Each pair is (scope, parts...) twice; a plain ":" join or plain
	// concatenation maps both tuples of every pair to one string.
	pairs := [][2][]string{
		{{"charge", "a:b", "c"}, {"charge", "a", "b:c"}},
		{{"charge", "ab", "c"}, {"charge", "a", "bc"}},
		{{"charge", "a:bc"}, {"charge", "a", "bc"}},
		{{"charge:cus_A", "2026-01"}, {"charge", "cus_A:2026-01"}},
		{{"charge", "cus_A", "2026-01:1"}, {"charge", "cus_A", "2026-01", "1"}},
	}
	for _, p := range pairs {
		if strings.Join(p[0], ":") != strings.Join(p[1], ":") && strings.Join(p[0], "") != strings.Join(p[1], "") {
			t.Fatalf("test data: %q and %q are not ambiguous under a join", p[0], p[1])
		}
		k1, err1 := idemkey.For(p[0][0], p[0][1:]...)
		k2, err2 := idemkey.For(p[1][0], p[1][1:]...)
		if err1 != nil || err2 != nil {
			t.Fatal(err1, err2)
		}
		if k1 == k2 {
			t.Errorf("%q and %q share key %s", p[0], p[1], k1)
		}
	}
}

func TestForShape(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("x", idemkey.MaxPartBytes)
	parts := make([]string, idemkey.MaxParts)
	for i := range parts {
		parts[i] = long
	}
	k, err := idemkey.For(strings.Repeat("s", idemkey.MaxScopeBytes), parts...)
	if err != nil {
		t.Fatalf("input at every limit refused: %v", err)
	}
	s := k.String()
	if !strings.HasPrefix(s, "bo1_") || len(s) != 68 || len(s) > 255 {
		t.Fatalf("key %q: want bo1_ and 64 hex characters", s)
	}
	if strings.Trim(s[4:], "0123456789abcdef") != "" {
		t.Fatalf("key %q is not lowercase hex after the prefix", s)
	}
	if p, err := idemkey.Parse(s); err != nil || p != k {
		t.Fatalf("Parse(%q) = %v, %v; want the same key", s, p, err)
	}
}

func TestForRejectsBadInput(t *testing.T) {
	t.Parallel()
	tooMany := make([]string, idemkey.MaxParts+1)
	for i := range tooMany {
		tooMany[i] = "p"
	}
	tests := []struct {
		name  string
		scope string
		parts []string
		in    string // the error must name the bad element
	}{
		{"empty scope", "", []string{"cus_A"}, "scope is empty"},
		{"no parts", "charge", nil, "no parts"},
		{"empty part", "charge", []string{"cus_A", ""}, "parts[1] is empty"},
		{"long scope", strings.Repeat("s", idemkey.MaxScopeBytes+1), []string{"cus_A"}, "scope is 65 bytes"},
		{"long part", "charge", []string{strings.Repeat("p", idemkey.MaxPartBytes+1)}, "parts[0] is 256 bytes"},
		{"too many parts", "charge", tooMany, "17 parts"},
		{"NUL", "charge", []string{"cus\x00A"}, "parts[0] contains control character U+0000"},
		{"newline", "charge", []string{"cus_A\n"}, "control character U+000A"},
		{"DEL", "charge\x7f", []string{"cus_A"}, "scope contains control character U+007F"},
		{"C1 control", "charge", []string{"cus\u0085"}, "control character U+0085"},
		{"invalid UTF-8", "charge", []string{"cus_\xff"}, "parts[0] is not valid UTF-8"},
		{"leading space", "charge", []string{" cus_A"}, "leading or trailing white space"},
		{"trailing NBSP", "charge", []string{"cus_A\u00a0"}, "leading or trailing white space"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := idemkey.For(tt.scope, tt.parts...)
			if !errors.Is(err, idemkey.ErrInvalid) {
				t.Fatalf("For = %v, %v; want an error wrapping ErrInvalid", k, err)
			}
			if !k.IsZero() {
				t.Errorf("For returned key %s with its error", k)
			}
			if !strings.Contains(err.Error(), tt.in) {
				t.Errorf("error %q does not say %q", err, tt.in)
			}
		})
	}
}

func TestForAcceptsInnerSpaceAndUnicode(t *testing.T) {
	t.Parallel()
	for _, p := range []string{"a b", "日本語", "😀", "é", "a:b|c\\d"} {
		if _, err := idemkey.For("charge", p); err != nil {
			t.Errorf("For(%q): %v", p, err)
		}
	}
}

func TestLegacy(t *testing.T) {
	t.Parallel()
	k, err := idemkey.Legacy("cus_A", "2026-01", "billing:v2")
	if err != nil {
		t.Fatalf("a ':' in the suffix is unambiguous and must be accepted: %v", err)
	}
	if len(k.String()) != 32 || strings.Trim(k.String(), "0123456789abcdef") != "" {
		t.Fatalf("Legacy key %q: want 32 lowercase hex characters", k)
	}

	tests := []struct {
		name                     string
		customer, period, suffix string
		in                       string
	}{
		{"colon in customer", "cus:A", "2026-01", "s", `customer "cus:A" contains ':'`},
		{"colon in period", "cus_A", "2026:01", "s", `period "2026:01" contains ':'`},
		{"empty customer", "", "2026-01", "s", "customer is empty"},
		{"empty period", "cus_A", "", "s", "period is empty"},
		{"empty suffix", "cus_A", "2026-01", "", "suffix is empty"},
		{"control", "cus_A", "2026-01\r", "s", "period contains control character"},
		{"invalid UTF-8", "cus_\xc3", "2026-01", "s", "customer is not valid UTF-8"},
		{"long suffix", "cus_A", "2026-01", strings.Repeat("s", idemkey.MaxPartBytes+1), "suffix is 256 bytes"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			k, err := idemkey.Legacy(tt.customer, tt.period, tt.suffix)
			if !errors.Is(err, idemkey.ErrInvalid) || !k.IsZero() {
				t.Fatalf("Legacy = %v, %v; want the zero key and an error wrapping ErrInvalid", k, err)
			}
			if !strings.Contains(err.Error(), tt.in) {
				t.Errorf("error %q does not say %q", err, tt.in)
			}
		})
	}
}

func TestParse(t *testing.T) {
	t.Parallel()
	for _, s := range []string{"bo1_abc", "4371644837a7a968c6bfaf926b55bf16", "3f4a9b2c-e1d7-4a8f-b0c3-9e5f2a1d7b6e", strings.Repeat("k", 255)} {
		k, err := idemkey.Parse(s)
		if err != nil || k.String() != s {
			t.Errorf("Parse(%q) = %q, %v", s, k, err)
		}
	}
	for _, s := range []string{"", "a b", "a\nb", "ключ", strings.Repeat("k", 256), "a\x7f"} {
		k, err := idemkey.Parse(s)
		if !errors.Is(err, idemkey.ErrInvalid) || !k.IsZero() {
			t.Errorf("Parse(%q) = %q, %v; want an error wrapping ErrInvalid", s, k, err)
		}
	}
}

func TestZeroKey(t *testing.T) {
	t.Parallel()
	var zero idemkey.Key
	if !zero.IsZero() || zero.String() != "" {
		t.Fatalf("zero Key: IsZero=%v String=%q", zero.IsZero(), zero)
	}
	k, _ := idemkey.For("charge", "cus_A")
	if k.IsZero() {
		t.Fatal("a key from For reports IsZero")
	}
}

// A large set of distinct tuples built from separators, white space inside
// parts and multi-byte characters must give as many distinct keys. The same
// set gives collisions under a plain ":" join, which shows it exercises the
// ambiguity that the length prefixes remove.
func TestForNoCollisions(t *testing.T) {
	t.Parallel()
	alphabet := []string{"a", "b", ":", "|", "_", "\\", "0", " ", "é", "日", "😀", "\u200b"}
	var upTo1, upTo2, upTo3 []string
	var gen func(prefix string, n int)
	gen = func(prefix string, n int) {
		if prefix != "" && strings.TrimSpace(prefix) == prefix {
			switch n := len([]rune(prefix)); {
			case n == 1:
				upTo1 = append(upTo1, prefix)
				fallthrough
			case n == 2:
				upTo2 = append(upTo2, prefix)
				fallthrough
			default:
				upTo3 = append(upTo3, prefix)
			}
		}
		if n == 0 {
			return
		}
		for _, c := range alphabet {
			gen(prefix+c, n-1)
		}
	}
	gen("", 3)

	var tuples [][]string
	for _, scope := range []string{"charge", "charge:", "c", "c|a", "日"} {
		for _, p := range upTo3 {
			tuples = append(tuples, []string{scope, p})
		}
		for _, p := range upTo2 {
			for _, q := range upTo2 {
				tuples = append(tuples, []string{scope, p, q})
			}
		}
		for _, p := range upTo1 {
			for _, q := range upTo1 {
				for _, r := range upTo1 {
					tuples = append(tuples, []string{scope, p, q, r})
				}
			}
		}
	}

	seen := make(map[idemkey.Key]int, len(tuples))
	joined := make(map[string]bool, len(tuples))
	joinCollisions := 0
	for i, tu := range tuples {
		k, err := idemkey.For(tu[0], tu[1:]...)
		if err != nil {
			t.Fatalf("For(%q): %v", tu, err)
		}
		if j, dup := seen[k]; dup {
			t.Fatalf("%q and %q share key %s", tuples[j], tu, k)
		}
		seen[k] = i
		j := strings.Join(tu, ":")
		if joined[j] {
			joinCollisions++
		}
		joined[j] = true
	}
	if len(seen) < 100_000 {
		t.Fatalf("only %d tuples generated; the set is meant to be large", len(seen))
	}
	if joinCollisions == 0 {
		t.Fatal("a plain ':' join had no collisions: the generated set does not exercise ambiguity")
	}
	t.Logf("%d distinct tuples, %d distinct keys; a ':' join would have %d collisions", len(tuples), len(seen), joinCollisions)
}

var sink idemkey.Key

func BenchmarkFor(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		k, err := idemkey.For("monthly-charge", "cus_NffrFeUfNV2Hib", "2026-01", "1")
		if err != nil {
			b.Fatal(err)
		}
		sink = k
	}
}

func BenchmarkLegacy(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		k, err := idemkey.Legacy("cus_NffrFeUfNV2Hib", "2026-01", "billing")
		if err != nil {
			b.Fatal(err)
		}
		sink = k
	}
}
