package main

import (
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// A period that run refuses is refused by every subcommand that takes
// one, before it reads anything: a status or an export of "2026-9" would
// otherwise report zeros for a period that cannot exist, and inspect
// would say the customer was never billed.
func TestEverySubcommandRefusesAPeriodRunRefuses(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	for _, p := range []string{"2026-9", "2026-09 ", " 2026-09", "2026-13", "2026-02-30", "usage api_calls 2026-11-30T10:00:00Z increment "} {
		for _, args := range [][]string{
			{"run", "-period", p, "-amount", "100", "-currency", "usd"},
			{"status", "-period", p},
			{"export", "-period", p},
			{"inspect", "-customer", "cus_a", "-period", p},
			{"rebill", "-customer", "cus_a", "-period", p, "-attempt", "2"},
		} {
			r := e.billonce("cus_a\n", args...).want(t, exitUsage)
			if !strings.Contains(r.stderr, "-period "+quote(p)) || !strings.Contains(r.stderr, "2026-09") {
				t.Errorf("%s -period %q: stderr %q; want the period and what a period looks like", args[0], p, r.stderr)
			}
		}
	}
	// A usage report's period, as status shows it, is a period of the
	// reading subcommands, not of run.
	up := "usage api_calls 2026-11-30T10:00:00Z increment"
	for _, args := range [][]string{{"status", "-period", up}, {"export", "-period", up}, {"status", "-period", "usage seats 2026-11-30T10:00:00Z total 2"}} {
		e.billonce("", args...).want(t, exitOK)
	}
	e.billonce("cus_a\n", "run", "-period", up, "-amount", "100", "-currency", "usd").want(t, exitUsage)
	if n := e.fake.Stats().Created; n != 1 {
		t.Errorf("%d objects created at Stripe; want only cus_a's first charge", n)
	}
}

func quote(s string) string { return `"` + s + `"` }
