package main

import (
	"strconv"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
)

// checkPeriod is every subcommand's check of -period: a billing period as
// billing.ValidatePeriod takes it, or, when reports is set (the
// subcommands that read claims), also the period of a usage report's
// claim as billonce usage makes it and status shows it: "usage METER START
// increment" or "usage METER START total N". Nothing is trimmed or
// completed: "2026-9" or "2026-09 " names no claim, and is refused rather
// than read as an empty period.
func checkPeriod(p string, reports bool) error {
	if p == "" {
		return usageError("-period required")
	}
	err := billing.ValidatePeriod(p)
	if err == nil || (reports && isUsagePeriod(p)) {
		return nil
	}
	msg := "a month like 2026-09 or a day like 2026-09-15"
	if reports {
		msg += `, or a usage report's period as status shows it ("usage api_calls 2026-11-30T10:00:00Z increment")`
	}
	return usageError("-period %q: want %s", p, msg)
}

// isUsagePeriod reports whether p is, exactly, the period of a usage
// report's claim: billing writes "usage", the meter, the window's start in
// RFC 3339, and "increment" or "total" with the total's revision, one
// space apart.
func isUsagePeriod(p string) bool {
	f := strings.Split(p, " ")
	if len(f) < 4 || f[0] != "usage" || f[1] == "" || strings.ContainsFunc(f[1], func(r rune) bool { return r < ' ' || r == 0x7f }) {
		return false
	}
	if t, err := time.Parse(time.RFC3339, f[2]); err != nil || t.Format(time.RFC3339) != f[2] {
		return false
	}
	switch {
	case len(f) == 4:
		return f[3] == "increment"
	case len(f) == 5 && f[3] == "total":
		n, err := strconv.Atoi(f[4])
		return err == nil && n >= 1 && strconv.Itoa(n) == f[4]
	}
	return false
}
