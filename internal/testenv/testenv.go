// Package testenv tells billonce's tests whether the long suite was asked
// for.
//
// The default `go test ./...` is quick: every exactly-once property is
// proved there by at least one small test. The long runs (many simulation
// seeds, the chaos harnesses at full size, multi-process soaks, runs of a
// thousand customers) run when the environment variable BILLONCE_LONG is
// set to 1, as CI does:
//
//	BILLONCE_LONG=1 go test -race ./...
package testenv

import (
	"os"
	"testing"
)

// Var is the environment variable that asks for the long suite.
const Var = "BILLONCE_LONG"

// Enabled reports whether the long suite was asked for (BILLONCE_LONG=1).
func Enabled() bool { return os.Getenv(Var) == "1" }

// Long skips tb unless the long suite was asked for, saying how to run it.
func Long(tb testing.TB) {
	tb.Helper()
	if !Enabled() {
		tb.Skip("long test: run with " + Var + "=1")
	}
}

// Size returns long when the long suite was asked for and quick otherwise:
// the number of seeds, customers or iterations a test runs.
func Size(quick, long int) int {
	if Enabled() {
		return long
	}
	return quick
}
