//go:build !race

package idemvet_test

const raceDetector = false
