package idemvet_test

import (
	"go/ast"
	"go/token"
	"maps"
	"slices"
	"strings"
	"testing"

	"golang.org/x/tools/go/analysis"
	"golang.org/x/tools/go/analysis/checker"
	"golang.org/x/tools/go/packages"

	"github.com/billonce/billonce/idemkey/idemvet"
	"github.com/billonce/billonce/internal/testenv"
)

// TestFailureModes runs the analyzer over examples/failure-modes, whose
// unsafe code shows sixteen ways to bill, refund or pay out twice (or not
// at all), and pins what it finds: rows 1 to 7, 9, 10, 13 and 16 (one key
// for two merchants' charges), each once, and the keyless writes
// of rows 11 and 12, under the function that shows the row, and nothing
// else. Rows 8 and 15 (a stable key resent after Stripe forgot it, 25
// hours later) are correct code on any given day: no static rule can tell; nor
// can one tell that row 14's stable key, from the payment and the amount,
// leaves out what tells two refunds apart.
//
// It loads the example and all its dependencies (stripe-go, pgx) from
// source: tens of seconds, and minutes under the race detector, so it is
// part of the long suite, a -race build skips it, and .ci/run runs it
// without -race.
func TestFailureModes(t *testing.T) {
	testenv.Long(t)
	if raceDetector {
		t.Skip("type-checks every dependency from source: run without -race")
	}
	const path = "github.com/billonce/billonce/examples/failure-modes"
	want := map[string]string{ // function -> category
		"naiveRetriedClosure":     "retrykey", // 1: the retried closure makes the key
		"keyPerRequest.RoundTrip": "retrykey", // 2: a RoundTripper makes the key
		"naiveSharedKey":          "fixedkey", // 3: one key for three customers
		"naiveGoroutineRetry":     "retrykey", // 4: a new goroutine and key per attempt
		"naive409":                "retrykey", // 5: a new key after 409 in flight
		"naiveReplicas":           "freshkey", // 6: a random key per replica
		"naiveCrash":              "freshkey", // 7: a random key per run
		"naiveUsageCrash":         "freshkey", // 9: a random key per usage report
		"naiveUsageDuplicate":     "freshkey", // 10: a random key per attempt
		"naiveInvoice":            "nokey",    // 11 and 12: invoice writes without keys
		"naiveRefundFreshKey":     "freshkey", // 13: a random key per refund click
		"naiveAccountKey":         "fixedkey", // 16: one key for two merchants' charges
	}

	cfg := &packages.Config{Mode: packages.LoadAllSyntax}
	pkgs, err := packages.Load(cfg, path)
	if err != nil {
		t.Fatal(err)
	}
	if n := packages.PrintErrors(pkgs); n > 0 || len(pkgs) != 1 {
		t.Fatalf("loading %s: %d errors, %d packages", path, n, len(pkgs))
	}
	graph, err := checker.Analyze([]*analysis.Analyzer{idemvet.Analyzer}, pkgs, nil)
	if err != nil {
		t.Fatal(err)
	}
	pkg := pkgs[0]
	got := map[string]string{}
	for act := range graph.All() {
		if !act.IsRoot {
			continue
		}
		if act.Err != nil {
			t.Fatal(act.Err)
		}
		for _, d := range act.Diagnostics {
			fn := enclosingFunc(pkg.Syntax, d.Pos)
			pos := pkg.Fset.Position(d.Pos)
			t.Logf("%s:%d [%s] in %s", pos.Filename[strings.LastIndex(pos.Filename, "/")+1:], pos.Line, d.Category, fn)
			// A function with several keyless writes has a nokey report
			// at each; every other rule reports a function once.
			if prev, dup := got[fn]; dup && (prev != d.Category || d.Category != idemvet.NoKey) {
				t.Errorf("%s reported twice: [%s] and [%s] at %s", fn, prev, d.Category, pos)
			}
			got[fn] = d.Category
		}
	}
	for _, fn := range slices.Sorted(maps.Keys(want)) {
		if got[fn] != want[fn] {
			t.Errorf("%s: reported [%s], want [%s]", fn, got[fn], want[fn])
		}
	}
	for fn, cat := range got {
		if _, ok := want[fn]; !ok {
			t.Errorf("unexpected report [%s] in %s", cat, fn)
		}
	}
}

// enclosingFunc names the function declaration holding pos: "f" or
// "T.m".
func enclosingFunc(files []*ast.File, pos token.Pos) string {
	for _, f := range files {
		for _, decl := range f.Decls {
			fd, ok := decl.(*ast.FuncDecl)
			if !ok || pos < fd.Pos() || pos > fd.End() {
				continue
			}
			if fd.Recv == nil || len(fd.Recv.List) == 0 {
				return fd.Name.Name
			}
			typ := fd.Recv.List[0].Type
			if star, ok := typ.(*ast.StarExpr); ok {
				typ = star.X
			}
			if id, ok := typ.(*ast.Ident); ok {
				return id.Name + "." + fd.Name.Name
			}
			return fd.Name.Name
		}
	}
	return "(outside any function)"
}
