package ledger

import (
	"slices"
	"testing"
)

func TestCheck(t *testing.T) {
	paid := func(c, p string) Payment { return Payment{Customer: c, Period: p, Paid: true} }
	declined := func(c, p string) Payment { return Payment{Customer: c, Period: p} }
	a, b, c := Slot{"cus_a", "2026-09"}, Slot{"cus_b", "2026-09"}, Slot{"cus_c", "2026-09"}
	want := map[Slot]bool{a: true, b: true, c: false}

	tests := []struct {
		name                            string
		payments                        []Payment
		duplicates, missing, unexpected []Slot
	}{
		{"each once", []Payment{paid("cus_a", "2026-09"), declined("cus_c", "2026-09"), paid("cus_b", "2026-09")}, nil, nil, nil},
		{"twice", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_a", "2026-09")}, []Slot{a}, nil, nil},
		{"three times", []Payment{paid("cus_a", "2026-09"), paid("cus_a", "2026-09"), paid("cus_a", "2026-09"), paid("cus_b", "2026-09")}, []Slot{a}, nil, nil},
		{"declined only", []Payment{paid("cus_a", "2026-09"), declined("cus_b", "2026-09")}, nil, []Slot{b}, nil},
		{"never", nil, nil, []Slot{a, b}, nil},
		{"wanted never, charged", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_c", "2026-09")}, nil, nil, []Slot{c}},
		{"another period", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_a", "2026-10")}, nil, nil, []Slot{{"cus_a", "2026-10"}}},
		{"twice where not wanted", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_x", "2026-09"), paid("cus_x", "2026-09")},
			[]Slot{{"cus_x", "2026-09"}}, nil, []Slot{{"cus_x", "2026-09"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.payments, want)
			if !slices.Equal(r.Duplicates, tt.duplicates) || !slices.Equal(r.Missing, tt.missing) || !slices.Equal(r.Unexpected, tt.unexpected) {
				t.Errorf("duplicates %v, missing %v, unexpected %v; want %v, %v, %v",
					r.Duplicates, r.Missing, r.Unexpected, tt.duplicates, tt.missing, tt.unexpected)
			}
		})
	}
	r := Check([]Payment{paid("cus_a", "2026-09"), declined("cus_a", "2026-09"), paid("cus_a", "2026-09")}, nil)
	if got := r.Paid[a]; !slices.Equal(got, []int{0, 2}) {
		t.Errorf("Paid[a] = %v; want the indexes of the payments that moved money, [0 2]", got)
	}
}
