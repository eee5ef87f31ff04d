package chaos

import (
	"maps"
	"slices"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// TestVerifyCatches feeds the ledger check a broken ledger: it must count
// each kind of breakage, or a green chaos run would prove nothing.
func TestVerifyCatches(t *testing.T) {
	const period, other = "2026-09", "2030-01"
	pay := func(id, period string, i int, amount int64) billingtest.Payment {
		return billingtest.Payment{ID: id, Customer: CustomerID(i), Amount: amount, Currency: "usd", Paid: true, Period: period}
	}
	ok := func(i int) int64 { return Price(i).Amount }
	good := []billingtest.Payment{
		pay("ch_0", period, 0, ok(0)), pay("ch_1", period, 1, ok(1)), pay("ch_2", period, 2, ok(2)), pay("ch_3", period, 3, ok(3)),
		pay("ch_o0", other, 0, ok(0)), pay("ch_o1", other, 1, ok(1)),
	}
	goodClaims := map[key]claimRow{
		{period, CustomerID(0)}: {"succeeded", "ch_0"}, {period, CustomerID(1)}: {"succeeded", "ch_1"},
		{period, CustomerID(2)}: {"succeeded", "ch_2"}, {period, CustomerID(3)}: {"succeeded", "ch_3"},
		{period, CustomerID(4)}: {"failed", ""},
		{other, CustomerID(0)}:  {"succeeded", "ch_o0"}, {other, CustomerID(1)}: {"succeeded", "ch_o1"},
	}
	periods := map[string]int{period: 5, other: 2}
	declined := map[string]bool{CustomerID(4): true}

	tests := []struct {
		name                            string
		payments                        []billingtest.Payment
		claims                          map[key]claimRow
		duplicates, missing, mismatches int
	}{
		{"clean", good, goodClaims, 0, 0, 0},
		{"second charge", append(slices.Clone(good), pay("ch_9", period, 2, ok(2))), goodClaims, 1, 0, 0},
		{"third charge", append(slices.Clone(good), pay("ch_8", period, 2, ok(2)), pay("ch_9", period, 2, ok(2))), goodClaims, 2, 0, 0},
		{"second charge, other period", append(slices.Clone(good), pay("ch_9", other, 1, ok(1))), goodClaims, 1, 0, 0},
		{"missing charge", good[1:], goodClaims, 0, 1, 1},
		{"missing charge, other period", good[:5], goodClaims, 0, 1, 1},
		{"wrong amount", append([]billingtest.Payment{pay("ch_0", period, 0, ok(0)+1)}, good[1:]...), goodClaims, 0, 0, 1},
		{"declined customer charged", append(slices.Clone(good), pay("ch_4", period, 4, ok(4))), goodClaims, 0, 0, 1},
		{"charge without succeeded claim", good, with(goodClaims, key{period, CustomerID(1)}, claimRow{"pending", ""}), 0, 0, 1},
		{"claim names another charge", good, with(goodClaims, key{period, CustomerID(1)}, claimRow{"succeeded", "ch_x"}), 0, 0, 1},
		{"claim for unknown customer", good, with(goodClaims, key{period, "cus_x"}, claimRow{"succeeded", "ch_x"}), 0, 0, 1},
		{"charge for a period not billed", append(slices.Clone(good), pay("ch_9", "2031-01", 0, ok(0))), goodClaims, 0, 0, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var l Ledger
			verify(period, periods, tt.payments, tt.claims, declined, &l)
			if l.Duplicates != tt.duplicates || l.Missing != tt.missing || l.Mismatches != tt.mismatches {
				t.Errorf("duplicates %d, missing %d, mismatches %d; want %d, %d, %d (%v)",
					l.Duplicates, l.Missing, l.Mismatches, tt.duplicates, tt.missing, tt.mismatches, l.Problems)
			}
			if l.OK() != (tt.duplicates+tt.missing+tt.mismatches == 0) {
				t.Errorf("OK() = %v with %v", l.OK(), l.Problems)
			}
			if tt.name == "clean" && (l.Paid != 4 || l.Declined != 1) {
				t.Errorf("paid %d, declined %d in %s; want 4, 1", l.Paid, l.Declined, period)
			}
		})
	}
}

func with(m map[key]claimRow, k key, v claimRow) map[key]claimRow {
	m = maps.Clone(m)
	m[k] = v
	return m
}
