package billing

import (
	"cmp"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
	"unicode"
)

// Limits on identifiers.
const (
	maxIDLen    = 255
	maxOwnerLen = 200 // leaves room for the per-claim suffix
)

var periodRE = regexp.MustCompile(`^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$`)

// ValidatePeriod reports whether period is a billing period billonce
// accepts: a month ("2026-09") or a day ("2026-09-15"). Charge and Run
// check it themselves; call it to check a period given on a command line
// before anything else. A month and a day in it are different periods,
// each billed once: a customer billed for both is charged twice.
func ValidatePeriod(period string) error { return checkPeriod(period) }

func checkPeriod(period string) error {
	if !periodRE.MatchString(period) {
		return invalid("period %q: use a month like 2026-09 or a day like 2026-09-15", clip(period))
	}
	if len(period) == 10 {
		if _, err := time.Parse(time.DateOnly, period); err != nil {
			return invalid("period %q is not a calendar day", period)
		}
	}
	return nil
}

// Validate reports whether p can be charged with api: a positive amount up
// to Stripe's limit, a currency Stripe charges in (any case), and a payment
// method when api is PaymentIntents. Its errors wrap [ErrInvalid].
func (p Price) Validate(api API) error {
	_, err := checkPrice(p, api)
	return err
}

// Validate reports whether it can be billed with api: a customer ID of 1
// to 255 bytes without white space or control characters, an Account
// that is empty or a connected account's id, and, when it carries one, a
// price that passes [Price.Validate]; for a refund item, a customer, a
// refund id and a positive amount (whether its period was paid, and how
// much of it is left, is Run's to find); or, for a transfer or payout
// item, an Account, one amount, and nothing else. Use it to check a whole
// input file before a run; Run checks every item itself.
func (it Item) Validate(api API) error {
	if err := it.mixed(); err != nil {
		return err
	}
	if it.Transfer != nil || it.Payout != nil {
		if err := checkAccount(it.Account); err != nil {
			return err
		}
		_, err := checkPrice(*cmp.Or(it.Transfer, it.Payout), Charges)
		return err
	}
	if err := errors.Join(checkAccount(it.Account), checkID("customer ID", it.Customer)); err != nil {
		return err
	}
	if it.Refund != nil {
		if err := checkRefund(it.Refund.ID, it.Refund.Amount); err != nil {
			return fmt.Errorf("customer %s: %w", it.Customer, err)
		}
	}
	if it.Invoice != nil {
		if _, _, err := checkInvoice(*it.Invoice); err != nil {
			return fmt.Errorf("customer %s: %w", it.Customer, err)
		}
	}
	if it.Price != nil {
		if err := it.Price.Validate(api); err != nil {
			return fmt.Errorf("customer %s: %w", it.Customer, err)
		}
	}
	return nil
}

// mixed reports an item that names more than one thing to do: a bill
// (a Price, an Invoice or neither), a refund, a transfer, a payout.
func (it Item) mixed() error {
	out := it.Transfer != nil || it.Payout != nil
	switch {
	case out && ((it.Transfer == nil) == (it.Payout == nil) || it.Customer != "" || it.Price != nil || it.Invoice != nil || it.Refund != nil):
		return invalid("the item names a Transfer or a Payout and something else: a transfer or payout item has an Account and one amount, and no Customer, Price, Invoice or Refund")
	case out && it.Account == "":
		return invalid("account is empty: a transfer or payout item goes to a connected account (acct_…)")
	case it.Refund != nil && (it.Price != nil || it.Invoice != nil):
		return invalid("the item has a Refund and a Price or an Invoice: a refund item has a Customer and a Refund, and refunds the payment that billed the period")
	case it.Invoice != nil && it.Price != nil:
		return invalid("the item has both a Price and an Invoice; give one")
	}
	return nil
}

func checkID(what, id string) error {
	switch {
	case id == "":
		return invalid("%s is empty", what)
	case len(id) > maxIDLen:
		return invalid("%s is %d bytes long; the limit is %d", what, len(id), maxIDLen)
	case strings.ContainsFunc(id, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) || r == unicode.ReplacementChar }):
		return invalid("%s %q contains white space, control characters or invalid UTF-8", what, clip(id))
	}
	return nil
}

func checkPrice(p Price, api API) (Price, error) {
	if p.Amount <= 0 {
		return p, invalid("amount %d: must be a positive number of the currency's smallest unit (cents)", p.Amount)
	}
	if p.Amount > maxAmount {
		return p, invalid("amount %d is above Stripe's largest amount %d", p.Amount, maxAmount)
	}
	c := strings.ToLower(p.Currency)
	if !currencies[c] {
		return p, invalid("currency %q is not a currency Stripe charges in; use a three-letter ISO code such as usd or eur", clip(p.Currency))
	}
	p.Currency = c
	if api == PaymentIntents {
		if p.PaymentMethod == "" {
			return p, invalid("the PaymentIntents API needs Price.PaymentMethod (a saved pm_… for off-session charges)")
		}
		if err := checkID("payment method", p.PaymentMethod); err != nil {
			return p, err
		}
	}
	return p, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// maxAmount is Stripe's largest amount: eight digits for most currencies.
const maxAmount = 99_999_999

// currencies Stripe can charge in (ISO 4217, lowercase).
var currencies = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range strings.Fields(`usd aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob brl
		bsd bwp byn bzd cad cdf chf clp cny cop crc cve czk djf dkk dop dzd egp etb eur fjd fkp gbp gel gip gmd gnf
		gtq gyd hkd hnl htg huf idr ils inr isk jmd jod jpy kes kgs khr kmf krw kwd kyd kzt lak lbp lkr lrd lsl mad
		mdl mga mkd mmk mnt mop mur mvr mwk mxn myr mzn nad ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar
		ron rsd rub rwf sar sbd scr sek sgd shp sle sos srd std szl thb tjs tnd top try ttd twd tzs uah ugx uyu uzs
		vnd vuv wst xaf xcd xof xpf yer zar zmw`) {
		m[c] = true
	}
	return m
}()
