package claim_test

import (
	"fmt"
	"testing"

	"github.com/billonce/billonce/claim"
)

// Every State prints a word, the zero State (no claim: the Claim of a
// lookup that found none) included.
func TestStatesPrintWords(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		s    claim.State
		want string
	}{
		{"", "none"},
		{claim.StatePending, "pending"},
		{claim.StateProcessing, "processing"},
		{claim.StateSucceeded, "succeeded"},
		{claim.StateFailed, "failed"},
	} {
		if got := fmt.Sprint(c.s); got != c.want {
			t.Errorf("State %q prints %q; want %q", string(c.s), got, c.want)
		}
	}
	if got := fmt.Sprint(claim.Claim{}.State); got != "none" {
		t.Errorf("a zero Claim's State prints %q; want none", got)
	}
}
