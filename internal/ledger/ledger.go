// Package ledger is the oracle of every exactly-once test: from the
// payments a fake Stripe made, it tells which customer's period was charged
// more than once, which was never charged, and which was charged when it
// should not have been. Money is counted at the fake, never in the code
// under test. The chaos harnesses, the deterministic simulation and
// billingtest's RequireChargedOnce all judge with it.
package ledger

import (
	"cmp"
	"maps"
	"slices"
)

// Slot is one customer's billing period.
type Slot struct{ Customer, Period string }

// Payment is what the oracle needs of one payment at the fake.
type Payment struct {
	Customer, Period string
	Paid             bool // money moved
}

// Result is what [Check] found.
type Result struct {
	// Paid holds, for every slot charged at least once, the indexes of its
	// payments that moved money, in the order given.
	Paid map[Slot][]int
	// Duplicates lists every slot charged more than once, wanted or not,
	// sorted; each holds len(Paid[s])-1 extra charges.
	Duplicates []Slot
	// Missing lists the slots wanted once and never charged, sorted.
	Missing []Slot
	// Unexpected lists the slots charged that are wanted never, or not
	// named in the wants at all, sorted.
	Unexpected []Slot
}

// Check judges payments against want: a slot mapped to true must be
// charged exactly once, a slot mapped to false never; a slot not in want
// must not be charged either (pass want nil to learn only Paid and
// Duplicates, and ignore Unexpected).
func Check(payments []Payment, want map[Slot]bool) Result {
	r := Result{Paid: map[Slot][]int{}}
	for i, p := range payments {
		if p.Paid {
			s := Slot{p.Customer, p.Period}
			r.Paid[s] = append(r.Paid[s], i)
		}
	}
	for _, s := range sorted(r.Paid) {
		if len(r.Paid[s]) > 1 {
			r.Duplicates = append(r.Duplicates, s)
		}
		if !want[s] {
			r.Unexpected = append(r.Unexpected, s)
		}
	}
	for _, s := range sorted(want) {
		if want[s] && len(r.Paid[s]) == 0 {
			r.Missing = append(r.Missing, s)
		}
	}
	return r
}

func sorted[V any](m map[Slot]V) []Slot {
	return slices.SortedFunc(maps.Keys(m), func(a, b Slot) int {
		return cmp.Or(cmp.Compare(a.Period, b.Period), cmp.Compare(a.Customer, b.Customer))
	})
}
