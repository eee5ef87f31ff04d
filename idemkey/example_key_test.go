package idemkey_test

import (
	"errors"
	"fmt"

	"github.com/billonce/billonce/idemkey"
)

func ExampleFor() {
	// Scope, customer, billing period, and the attempt a person chose.
	key, err := idemkey.For("monthly-charge", "cus_A", "2026-01", "1")
	if err != nil {
		panic(err)
	}
	fmt.Println(key)

	// Separators inside parts cannot make two operations share a key.
	k1, _ := idemkey.For("charge", "a:b", "c")
	k2, _ := idemkey.For("charge", "a", "b:c")
	fmt.Println(k1 == k2)

	// Bad input is an error, never a key.
	_, err = idemkey.For("monthly-charge", "", "2026-01")
	fmt.Println(errors.Is(err, idemkey.ErrInvalid))
	fmt.Println(err)
	// Output:
	// bo1_60a26cf59a2124b696acfc108499d2e9c422019105d8a0f5be2b8d599634fe0e
	// false
	// true
	// idemkey: invalid input: parts[0] is empty; every element must identify the operation
}

func ExampleLegacy() {
	// The same key as sha256("cus_A:2026-01:http4k-billing")[:32] on the JVM.
	key, err := idemkey.Legacy("cus_A", "2026-01", "http4k-billing")
	if err != nil {
		panic(err)
	}
	fmt.Println(key)

	// Where the ":" join would be ambiguous, Legacy refuses.
	_, err = idemkey.Legacy("cus:A", "2026-01", "http4k-billing")
	fmt.Println(err)
	// Output:
	// 4371644837a7a968c6bfaf926b55bf16
	// idemkey: invalid input: customer "cus:A" contains ':', which makes the legacy format ambiguous; use For for such identities
}
