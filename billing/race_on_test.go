//go:build race

package billing_test

// raceOn is set when the tests run under the race detector, which makes
// each simulation seed several times slower.
const raceOn = true
