//go:build race

package idemvet_test

// raceDetector is true in a binary built with -race, where type-checking
// every dependency from source takes minutes instead of seconds.
const raceDetector = true
