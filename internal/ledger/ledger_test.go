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
		extra                           int
	}{
		{"each once", []Payment{paid("cus_a", "2026-09"), declined("cus_c", "2026-09"), paid("cus_b", "2026-09")}, nil, nil, nil, 0},
		{"twice", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_a", "2026-09")}, []Slot{a}, nil, nil, 1},
		{"three times", []Payment{paid("cus_a", "2026-09"), paid("cus_a", "2026-09"), paid("cus_a", "2026-09"), paid("cus_b", "2026-09")}, []Slot{a}, nil, nil, 2},
		{"declined only", []Payment{paid("cus_a", "2026-09"), declined("cus_b", "2026-09")}, nil, []Slot{b}, nil, 0},
		{"never", nil, nil, []Slot{a, b}, nil, 0},
		{"wanted never, charged", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_c", "2026-09")}, nil, nil, []Slot{c}, 0},
		{"another period", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_a", "2026-10")}, nil, nil, []Slot{{"cus_a", "2026-10"}}, 0},
		{"twice where not wanted", []Payment{paid("cus_a", "2026-09"), paid("cus_b", "2026-09"), paid("cus_x", "2026-09"), paid("cus_x", "2026-09")},
			[]Slot{{"cus_x", "2026-09"}}, nil, []Slot{{"cus_x", "2026-09"}}, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := Check(tt.payments, want)
			if !slices.Equal(r.Duplicates, tt.duplicates) || !slices.Equal(r.Missing, tt.missing) || !slices.Equal(r.Unexpected, tt.unexpected) || r.Extra() != tt.extra {
				t.Errorf("duplicates %v, missing %v, unexpected %v, extra %d; want %v, %v, %v, %d",
					r.Duplicates, r.Missing, r.Unexpected, r.Extra(), tt.duplicates, tt.missing, tt.unexpected, tt.extra)
			}
		})
	}
	r := Check([]Payment{paid("cus_a", "2026-09"), declined("cus_a", "2026-09"), paid("cus_a", "2026-09")}, nil)
	if got := r.Paid[a]; !slices.Equal(got, []int{0, 2}) {
		t.Errorf("Paid[a] = %v; want the indexes of the payments that moved money, [0 2]", got)
	}
}
