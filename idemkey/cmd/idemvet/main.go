// Command idemvet reports code that can make Stripe charge a customer
// twice: idempotency keys that change between attempts or are shared by
// different operations, Stripe writes without a key, and advisory locks
// taken or released through a connection pool. The reports are described in
// package github.com/billonce/billonce/idemkey/idemvet.
//
// Run it by itself:
//
//	idemvet ./...
//
// or under go vet, which also checks test files and caches results:
//
//	go vet -vettool=$(which idemvet) ./...
//
// It exits with status 3 (standalone) or 1 (go vet) when it reports
// anything. Silence a deliberate case with a comment on the reported line
// or the line above it: //idemvet:ignore <reason>.
package main

import (
	"golang.org/x/tools/go/analysis/singlechecker"

	"github.com/billonce/billonce/idemkey/idemvet"
)

func main() { singlechecker.Main(idemvet.Analyzer) }
