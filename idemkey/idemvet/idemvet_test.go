package idemvet_test

import (
	"testing"

	"golang.org/x/tools/go/analysis/analysistest"

	"github.com/billonce/billonce/idemkey/idemvet"
)

// Each package under testdata/src holds, for one rule, code that must be
// reported (marked // want) and near misses that must not be:
//
//	retrykey    keys made inside a retried function, loop or RoundTrip
//	freshkey    random keys made for one request
//	fixedkey    one key for many operations
//	nokey       stripe-go writes without a key
//	locks       advisory locks through a pool (poollock, xactlock)
//	ignore      the //idemvet:ignore directive
//	usehelpers  facts: a helper in another package (helpers) that takes the
//	            key as an argument or returns a new value per call
//
// They are loaded together: loading is most of the test's time.
func TestAnalyzer(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.Analyzer,
		"retrykey", "freshkey", "fixedkey", "nokey", "locks", "ignore", "usehelpers")
}
