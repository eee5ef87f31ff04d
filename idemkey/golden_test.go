package idemkey_test

import (
	"encoding/json"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/billonce/billonce/idemkey"
)

var update = flag.Bool("update", false, "rewrite ../testdata/idemkey_golden.json from the current code")

const goldenFile = "../testdata/idemkey_golden.json"

// vector is one frozen input and its key. For For, In is the scope then the
// parts; for Legacy, In is customer, period, suffix.
type vector struct {
	Func string   `json:"func"`
	In   []string `json:"in"`
	Key  string   `json:"key"`
}

// goldenInputs are the inputs whose keys are frozen in goldenFile. Add to
// the end and run with -update; never change an existing key: services in
// production have sent it to Stripe.
var goldenInputs = []vector{
	{Func: "For", In: []string{"monthly-charge", "cus_A", "2026-01", "1"}},
	{Func: "For", In: []string{"monthly-charge", "cus_B", "2026-01", "1"}},
	{Func: "For", In: []string{"monthly-charge", "cus_A", "2026-02", "1"}},
	{Func: "For", In: []string{"monthly-charge", "cus_A", "2026-01", "2"}},
	{Func: "For", In: []string{"charge", "a:b", "c"}},
	{Func: "For", In: []string{"charge", "a", "b:c"}},
	{Func: "For", In: []string{"charge:a", "b"}},
	{Func: "For", In: []string{"c", "x"}},
	{Func: "For", In: []string{"invoice", "客户-42", "2026年1月"}},
	{Func: "For", In: []string{"invoice", "😀", "é", "e\u0301"}},
	{Func: "For", In: []string{"refund", "re_1 with inner space", "ch_9|x\\y%z"}},
	{Func: "For", In: append([]string{strings.Repeat("s", idemkey.MaxScopeBytes)}, repeat(strings.Repeat("p", idemkey.MaxPartBytes), idemkey.MaxParts)...)},
	{Func: "Legacy", In: []string{"cus_A", "2026-01", "http4k-billing"}},
	{Func: "Legacy", In: []string{"cus_A", "2026-01", "spring-billing"}},
	{Func: "Legacy", In: []string{"cus_A", "2026-01", "armeria-billing"}},
	{Func: "Legacy", In: []string{"cus_A", "2026-01", "resilience4j-billing"}},
	{Func: "Legacy", In: []string{"客户", "2026-01", "suffix:with:colons"}},
}

func repeat(s string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = s
	}
	return out
}

func keyOf(tb testing.TB, v vector) string {
	tb.Helper()
	var k idemkey.Key
	var err error
	switch v.Func {
	case "For":
		k, err = idemkey.For(v.In[0], v.In[1:]...)
	case "Legacy":
		if len(v.In) != 3 {
			tb.Fatalf("Legacy vector %q: want 3 inputs", v.In)
		}
		k, err = idemkey.Legacy(v.In[0], v.In[1], v.In[2])
	default:
		tb.Fatalf("unknown func %q in %s", v.Func, goldenFile)
	}
	if err != nil {
		tb.Fatalf("%s(%q): %v", v.Func, v.In, err)
	}
	return k.String()
}

// TestGolden freezes the key formats: a change to the encoding, the hash or
// the prefix changes these keys, and a key that changes between releases
// bills a customer twice.
func TestGolden(t *testing.T) {
	if *update {
		out := make([]vector, len(goldenInputs))
		for i, v := range goldenInputs {
			v.Key = keyOf(t, v)
			out[i] = v
		}
		data, err := json.MarshalIndent(out, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.FromSlash(goldenFile), append(data, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
		t.Logf("wrote %d vectors to %s", len(out), goldenFile)
	}

	data, err := os.ReadFile(filepath.FromSlash(goldenFile))
	if err != nil {
		t.Fatalf("%v (run go test -run TestGolden -update to create it)", err)
	}
	var frozen []vector
	if err := json.Unmarshal(data, &frozen); err != nil {
		t.Fatalf("%s: %v", goldenFile, err)
	}
	if len(frozen) < len(goldenInputs) {
		t.Fatalf("%s has %d vectors, the test lists %d: run with -update to add the new ones", goldenFile, len(frozen), len(goldenInputs))
	}
	for i, v := range goldenInputs {
		if frozen[i].Func != v.Func || !reflect.DeepEqual(frozen[i].In, v.In) {
			t.Fatalf("%s vector %d is %s(%q), the test lists %s(%q): append new inputs, never edit old ones", goldenFile, i, frozen[i].Func, frozen[i].In, v.Func, v.In)
		}
	}
	for _, v := range frozen {
		if got := keyOf(t, v); got != v.Key {
			t.Errorf("%s(%q) = %s, frozen as %s", v.Func, v.In, got, v.Key)
		}
	}
}
