//go:build !race

package billing_test

const raceOn = false
