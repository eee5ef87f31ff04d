package main

import (
	"strings"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/claim"
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

// The kinds of claims, as status, inspect and export name them.
const (
	kindCharge     = "charge"
	kindInvoice    = "invoice"
	kindMeterEvent = "meter_event"
	kindRefund     = "refund"
	kindCreditNote = "credit_note"
	kindTransfer   = "transfer"
	kindPayout     = "payout"
)

// kinds are the claim kinds of billing's endpoints.
var kinds = map[string]string{
	"charges": kindCharge, "payment_intents": kindCharge, endpointInvoices: kindInvoice, endpointMeterEvents: kindMeterEvent,
	"refunds": kindRefund, "credit_notes": kindCreditNote, "transfers": kindTransfer, "payouts": kindPayout,
}

// kindOf is what c's claim is for: its endpoint's kind, or, for a claim
// that does not record its endpoint, what billing names its period by
// (a usage report's, a refund's, a transfer's or payout's); else a charge.
func kindOf(c claim.Claim) string {
	if k, ok := kinds[c.Endpoint]; ok {
		return k
	}
	switch {
	case strings.HasPrefix(c.Period, "usage "):
		return kindMeterEvent
	case strings.HasPrefix(c.Period, kindTransfer+" "):
		return kindTransfer
	case strings.HasPrefix(c.Period, kindPayout+" "):
		return kindPayout
	case c.RefundOf != "" || strings.Contains(c.Period, refundInfix):
		return kindRefund
	}
	return kindCharge
}

// refundInfix joins a refund's period: its payment's period, then this,
// then the refund's id.
const refundInfix = " refund "

// periodClaims are the periods, and the prefixes of periods, of the
// claims of period P and of those made for it: P's own (bills, or a
// usage report), its refunds and credit notes ("P refund ID"), and its
// transfers and payouts ("transfer P", "payout P").
func periodClaims(p string) (periods, prefixes []string) {
	return []string{p, kindTransfer + " " + p, kindPayout + " " + p}, []string{p + refundInfix}
}

// onAccount reports whether c is on account, or pays it: a claim whose
// key went to account, or a transfer to it (made on the platform, its
// customer is the account it pays). Every claim is, when account is "".
func onAccount(c claim.Claim, account string) bool {
	return account == "" || c.Account == account || (kindOf(c) == kindTransfer && c.Customer == account)
}

// onText is " on account A", or "" for the platform's own.
func onText(account string) string {
	if account == "" {
		return ""
	}
	return " on account " + account
}
