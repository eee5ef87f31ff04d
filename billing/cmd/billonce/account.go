package main

import (
	"strings"

	"github.com/billonce/billonce/billing"
)

// accountFlag registers -account, the connected account a subcommand
// bills on, or whose claims a reading subcommand shows.
func accountFlag(f *flags, usage string) *string {
	return f.String("account", "", usage)
}

// checkAccount checks -account, when given, with billing's own check of
// an account id, before anything is opened: an empty value (white space
// only) is refused rather than read as the platform's own account, which
// is what leaving -account out means.
func checkAccount(f *flags, account string) error {
	if !f.set("account") {
		return nil
	}
	if strings.TrimSpace(account) == "" {
		return usageError("-account is empty: give a connected account's id (acct_…), or leave -account out for the platform's own account")
	}
	if err := (billing.Item{Customer: "c", Account: account}).Validate(billing.Charges); err != nil {
		return usageError("-%s", reason(err))
	}
	return nil
}

// onText is " on account A", or "" for the platform's own.
func onText(account string) string {
	if account == "" {
		return ""
	}
	return " on account " + account
}
