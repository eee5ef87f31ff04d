package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/stripe/stripe-go/v79"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// Invoice is what [Biller.Invoice] bills a customer for a period: one
// Stripe invoice with these lines.
type Invoice struct {
	// Currency is the invoice's currency, a three-letter ISO code (any
	// case), as for a [Price].
	Currency string
	// Account, when set, makes the invoice on this connected account
	// (see ChargeOptions.Account). In a Run, Item.Account names it too;
	// two different accounts are refused.
	Account string
	// Lines are the invoice's lines, 1 to 250, each added to the invoice
	// as an invoice item of its own.
	Lines []InvoiceLine
	// DaysUntilDue 0 (the default) makes an invoice Stripe charges to the
	// customer's payment method at once (collection_method
	// charge_automatically): billonce pays it as soon as it is final.
	// From 1 to 365, it is sent to the customer (send_invoice), due in
	// that many days; billonce sends it and the claim stays processing
	// until the customer pays.
	DaysUntilDue int
	// Description is the invoice's memo, at most 500 bytes; optional.
	Description string
}

// InvoiceLine is one line of an [Invoice].
type InvoiceLine struct {
	// Description is what the line bills for, at most 500 bytes.
	Description string
	// Amount is in the currency's smallest unit, positive: billonce takes
	// no credit lines, so that an invoice's total is never below one of
	// its lines.
	Amount int64
}

// Invoice bills customer for period exactly once, as one Stripe invoice
// with inv's lines (nil inv: Config.Invoice's answer). Call it as often as
// you like, from as many replicas as you like: one invoice is made, each
// of its lines is added once, it is finalized once and paid (or sent)
// once. Receipt.StripeID is the invoice ("in_…") and Receipt.Amount its
// total.
//
// The invoice is made in steps, each one request with its own key
// derived from the claim's key and the step: the draft (auto_advance
// false, and pending_invoice_items_behavior exclude, so that no pending
// item of the customer is swept in), each line, the finalization
// (auto_advance still false: Stripe collects an open invoice with it on
// by itself, an hour later, whatever its total), then, once its total is
// the claim's, the payment (DaysUntilDue 0, after turning Stripe's
// automatic collection on) or the sending. Nothing of the invoice is
// recorded on the claim before its outcome: what a step made is found
// again at Stripe. A call that finds the claim part way (another runner
// gave up, or crashed) lists the customer's invoices made since the claim
// for the one carrying its key (a list, unlike a search, shows it at
// once), or reads the invoice a runner that gave up recorded, and resumes
// from where Stripe shows it, with the same keys, after listing the
// draft's lines: the lines a dead runner added are taken, not sent again.
// Only an invoice of the customer in the invoice's currency counts, and a
// final one only with billonce's lines: other code may copy the metadata
// onto an invoice of its own, which leaves the claim pending with
// ErrNeedsReconciliation. billonce's invoice voided by a person, or its
// draft deleted by a person (found by its invoice.deleted event), fails
// the claim: billonce invoices that period no more. Past a step's deadline (see
// the package documentation), what exists is found the same way before
// anything is written. So is every step of a claim made with another
// credential (a rotated secret key), and finding nothing is trusted only
// once the key's window has passed, as for a charge: until then the error
// is [ErrSentElsewhere], with Until, and nothing is sent.
//
// The claim records the invoice's total, which Receipt.Amount reports,
// and a draft is anyone's to change between two steps. So the draft's
// lines are listed before it is finalized: an item billonce did not add
// (a person's on Stripe's dashboard, other code's), or lines other than
// inv's (Config.Invoice changed, with the same total, while the invoice
// was part way), leave the invoice a draft and the claim pending, with
// [ErrNeedsReconciliation] naming them (or [ErrKeyReused], when Stripe
// refuses a line sent again with its key and another amount). A person deletes the items
// billonce did not add from the draft (or calls again with the lines the
// invoice was begun with), and the next call finalizes and pays it. The
// finalized invoice's total is checked too, before it is paid or sent:
// one that is not the claim's (an item added as it was finalized, a
// discount or tax Stripe applied) is left unpaid (open, or uncollectible
// if a person marked it so, which can still be paid), with Stripe's
// automatic collection of it off (as it is from its finalization until
// its total is checked, however long a runner stopped in between), and the claim pending with
// ErrNeedsReconciliation. One that Stripe marked paid as it was finalized,
// with another total (zero, after a credit item someone added), was not
// paid for the claim's total: the call returns ErrNeedsReconciliation
// with the amount paid, and the claim stays pending for a person, who
// bills what is owed and records the claim with billonce resolve.
// Otherwise a person voids it, and the invoice.voided
// event fails the claim (billonce invoices that period no more), or, if
// its total is what the customer owes, pays it by hand, and invoice.paid
// settles the claim, which keeps the total of billonce's lines.
//
// A payment the customer's card declines leaves the invoice open, and
// Stripe goes on collecting it: the claim becomes processing (a second
// invoice is never made), the decline is logged and reported to
// Config.Observe (EventSettled with an [ErrDeclined] *ChargeError), and the
// receipt has Processing set, with a nil error. An invoice a person
// marked uncollectible before billonce paid it is not paid either: its
// claim is processing too. The claim settles by
// webhook (invoice.paid, invoice.voided) or by Reconcile reading the
// invoice.
//
// A customer and period are billed once whatever the way: a customer
// charged for a period cannot be invoiced for it, nor the other way round
// (the second call's claim is refused with a *claim.MismatchError).
//
// Every error is a [*ChargeError], with the kinds of a charge's errors.
// Once the draft exists the claim is never failed by a refusal of Stripe
// (a 4xx on a later step): it stays pending with [ErrNeedsReconciliation],
// and the error names the invoice. A person fixes the cause and calls
// again, which resumes it; or voids the invoice once it is open, and the
// invoice.voided event fails the claim.
func (b *Biller) Invoice(ctx context.Context, customer, period string, inv *Invoice) (Receipt, error) {
	j, err := b.prepareInvoice(ctx, "", customer, period, inv)
	if err != nil {
		return Receipt{}, err
	}
	return b.claimLoop(ctx, j, time.Now())
}

// prepareInvoice checks one invoice and derives its key. Its errors are
// *ChargeError.
func (b *Biller) prepareInvoice(ctx context.Context, account, customer, period string, inv *Invoice) (job, error) {
	j := job{account: account, customer: customer, period: period, attempt: 1}
	if err := checkID("customer ID", customer); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	if err := checkPeriod(period); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	var v Invoice
	switch {
	case inv != nil:
		v = *inv
	case b.cfg.Invoice == nil:
		return j, chargeErr(j, nil, "", invalid("no invoice: set Config.Invoice or pass an *Invoice"))
	default:
		var err error
		if v, err = b.cfg.Invoice(ctx, customer, period); err != nil {
			return j, chargeErr(j, nil, "Config.Invoice", err)
		}
	}
	switch {
	case account == "":
		account = v.Account
	case v.Account != "" && v.Account != account:
		return j, chargeErr(j, nil, "", invalid("the invoice is for account %s, and the call names account %s: give one", v.Account, account))
	}
	j.account = account
	if err := checkAccount(account); err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	v, total, err := checkInvoice(v)
	if err != nil {
		return j, chargeErr(j, nil, "", err)
	}
	key, err := idemkey.For(b.cfg.Scope, onAccountParts(account, "invoice", customer, period, "1")...)
	if err != nil {
		return j, chargeErr(j, nil, "", invalid("%v", err))
	}
	j.kind, j.price, j.key, j.owner = invoices{inv: &v}, Price{Amount: total, Currency: v.Currency}, key, b.newOwner()
	return j, nil
}

// checkInvoice checks inv and returns a copy with its currency in lower
// case, and its total.
func checkInvoice(inv Invoice) (Invoice, int64, error) {
	c := strings.ToLower(inv.Currency)
	if !currencies[c] {
		return inv, 0, invalid("invoice currency %q is not a currency Stripe charges in; use a three-letter ISO code such as usd or eur", clip(inv.Currency))
	}
	inv.Currency = c
	switch n := len(inv.Lines); {
	case n == 0:
		return inv, 0, invalid("the invoice has no lines; give 1 to %d", maxInvoiceLines)
	case n > maxInvoiceLines:
		return inv, 0, invalid("the invoice has %d lines; the limit is %d", n, maxInvoiceLines)
	}
	if inv.DaysUntilDue < 0 || inv.DaysUntilDue > maxDaysUntilDue {
		return inv, 0, invalid("Invoice.DaysUntilDue %d: use 0 to charge at once, or 1 to %d days for an invoice sent to the customer", inv.DaysUntilDue, maxDaysUntilDue)
	}
	if err := checkText("Invoice.Description", inv.Description); err != nil {
		return inv, 0, err
	}
	var total int64
	for i, l := range inv.Lines {
		if l.Amount <= 0 || l.Amount > maxAmount {
			return inv, 0, invalid("invoice line %d: amount %d must be positive (billonce takes no credit lines) and at most %d", i, l.Amount, maxAmount)
		}
		if err := checkText(fmt.Sprintf("invoice line %d: description", i), l.Description); err != nil {
			return inv, 0, err
		}
		total += l.Amount
	}
	if total > maxAmount {
		return inv, 0, invalid("the invoice's total %d is above Stripe's largest amount %d", total, maxAmount)
	}
	inv.Lines = append([]InvoiceLine(nil), inv.Lines...)
	return inv, total, nil
}

// invoices is the kind of an invoice: a Stripe invoice made in steps,
// each one write with its own key derived from the claim's (see
// Biller.Invoice). Past a step's window, what the step made is found by
// a search (the draft), by listing the draft's lines, or by reading the
// invoice.
type invoices struct{ inv *Invoice }

func (invoices) endpoint(*Biller) string       { return endpointInvoices }
func (invoices) describe(*claimengine.Request) {}

// ready has nothing to check: each step looks at Stripe first where its
// key may have gone with another credential (see invoiceSteps.step).
func (invoices) ready(context.Context, *Biller, *job, claim.Claim) (Receipt, bool, error) {
	return Receipt{}, false, nil
}

func (k invoices) send(ctx context.Context, b *Biller, j job, c claim.Claim) (Receipt, error) {
	return b.sendInvoice(ctx, j, c, k.inv)
}

// failed: an invoice is voided, or its draft refused, for good; billonce
// invoices that period no more.
func (invoices) failed(_ context.Context, _ *Biller, j job, c claim.Claim) (Receipt, error) {
	return Receipt{}, failedFrom(c)
}

// invoiceSteps is one call's work on an invoice claim; its job holds the
// draft once it exists.
type invoiceSteps struct {
	b   *Biller
	j   job
	inv *Invoice
	// c is the claim as this call found it.
	c claim.Claim
	// verify: the next step's key may have gone with another credential,
	// whose requests this Biller's would not meet at Stripe. The step is
	// looked for before anything is written, and finding nothing is
	// trusted only as missUntrusted says.
	verify bool
	// final is the invoice as Stripe last showed it (an answer, or a
	// read), once it is final; nil until then.
	final *stripe.Invoice
	// listed is the draft's lines as a line's lookup last listed them.
	listed []*stripe.InvoiceLineItem
	// fresh: this call made the draft of a claim it won, so no line of
	// it was ever sent.
	fresh bool
	// deleted: the claim's draft was deleted by hand (see findDeleted).
	deleted bool
}

// sendInvoice takes an invoice claim from its recorded step to its end.
// Its errors are *ChargeError.
func (b *Biller) sendInvoice(ctx context.Context, j job, c claim.Claim, inv *Invoice) (Receipt, error) {
	stop := b.renewWhileSending(ctx, j, c)
	defer stop()
	j.holds = c.StripeID
	// Every step's key derives from the claim's, which no request carried
	// before a Run won it: the first attempt of each step takes the
	// first-send shortcut while it holds.
	j.firstSendBy = b.firstSendSafe(j, c)
	v := &invoiceSteps{b: b, j: j, inv: inv, c: c, verify: c.Credential != b.credential}
	next, err := v.resumeAt(ctx)
	if err != nil {
		return Receipt{}, err
	}
	if v.deleted {
		return v.settle(ctx, "deleted")
	}
	if v.final == nil && c.Step != stepFinalized {
		if err := v.build(ctx, next); err != nil {
			return Receipt{}, err
		}
	}
	status, err := v.checkTotal(ctx)
	if err != nil {
		return Receipt{}, err
	}
	return v.collect(ctx, status)
}

// resumeAt returns the first line still to add, from what the claim
// records. A claim without an invoice is begun (see begin). One that
// records its invoice but no step was released part way: the invoice is
// read, since it may be final by now. A claim at the draft resumes at line
// 0: the lines are not recorded one by one (see build). A step "line i"
// is recorded only where a lookup reopened a step's window (see reopen);
// "draft" and "finalized" are what earlier versions recorded.
func (v *invoiceSteps) resumeAt(ctx context.Context) (int, error) {
	c, j := v.c, v.j
	next := 0
	switch {
	case c.Step != "" && c.StripeID == "":
		return 0, chargeErr(j, nil, "", fmt.Errorf("billing: the claim records step %q but no invoice", c.Step))
	case c.Step == "" && c.StripeID != "":
		if err := v.read(ctx); err != nil {
			return 0, err
		}
	case c.Step == "":
		if err := v.begin(ctx); err != nil {
			return 0, err
		}
	case c.Step == stepDraft:
	case strings.HasPrefix(c.Step, stepLine):
		i, err := strconv.Atoi(strings.TrimPrefix(c.Step, stepLine))
		if err != nil || i < 0 {
			return 0, chargeErr(j, nil, "", fmt.Errorf("billing: the claim records an unknown step %q", c.Step))
		}
		next = i + 1
	case c.Step == stepFinalized:
		next = len(v.inv.Lines)
	default:
		return 0, chargeErr(j, nil, "", fmt.Errorf("billing: the claim records an unknown step %q", c.Step))
	}
	if next > len(v.inv.Lines) {
		return 0, v.b.needs(ctx, v.j, fmt.Sprintf("invoice %s has %d lines done, but Config.Invoice gives %d lines now; nothing was sent", v.j.holds, next, len(v.inv.Lines)), nil)
	}
	return next, nil
}

// begin makes the claim's draft. A claim a call before this one made (it
// stopped, or crashed, part way) may have its invoice already, made and
// perhaps finalized and paid since, but not recorded: nothing of an
// invoice is recorded before its outcome, since what exists is found
// again cheaply. So the customer's invoices are listed first (a list,
// unlike a search, shows an invoice at once), and an invoice found is
// taken on from where Stripe shows it. Only when none is found is the
// draft's request sent, with its key: a request of the earlier call still
// on its way is then the same request, which Stripe answers once.
func (v *invoiceSteps) begin(ctx context.Context) error {
	v.fresh = v.j.won
	if !v.fresh && !v.verify {
		// Where the key may have gone with another credential, step
		// looks first itself, and trusts a miss only as missUntrusted
		// says.
		_, err := readRetried(ctx, v.b, v.j, func(ctx context.Context) (bool, error) {
			_, found, err := v.findDraft(ctx)
			return found, err
		})
		if err != nil {
			if ctx.Err() != nil {
				return asChargeError(v.j, v.b.failure(ctx, v.j, err))
			}
			return v.needs(ctx, stepDraft, err.Error())
		}
	}
	if v.j.holds == "" {
		id, err := v.step(ctx, stepDraft, v.draft, v.findDraft)
		if err != nil {
			return err
		}
		v.j.holds = id // a claim that holds a draft is never abandoned
	}
	v.j.won = false
	return nil
}

// read reads the invoice a call before this one made and recorded as it
// stopped: it may have gone on since (finalized, paid or voided, by
// Stripe or a person, or deleted by a person while a draft, which fails
// the claim as findDeleted says).
func (v *invoiceSteps) read(ctx context.Context) error {
	if _, err := readRetried(ctx, v.b, v.j, v.get); err != nil {
		if ctx.Err() != nil {
			return asChargeError(v.j, v.b.failure(ctx, v.j, err))
		}
		var se *stripe.Error
		if errors.As(err, &se) && se.HTTPStatusCode == http.StatusNotFound {
			// Deleted by hand while a draft?
			if deleted, ferr := v.findDeleted(ctx, v.listedSince()); ferr == nil && slices.Contains(deleted, v.j.holds) {
				v.deleted = true
				return nil
			}
		}
		return v.needs(ctx, stepDraft, fmt.Sprintf("reading invoice %s failed: %v", v.j.holds, err))
	}
	return nil
}

// build adds the lines from next on, checks the draft's lines, and
// finalizes it.
//
// The lines are not recorded: a line is found again cheaply, by listing
// the draft's lines, so a resume from the draft lists them, takes those
// on the draft and sends each other one with its own key and, past the
// deadline or where the key may have gone with another credential, looks
// for each line first (see step). The deadline of every line, and of the
// finalization, starts when the draft is recorded, before any of them is
// first sent. The lines are sent one after the other, each once Stripe
// made the one before it, so a line found is no sign that the next one was
// never sent, and a line missing past missUntrusted's wait is a sign that
// none after it was.
func (v *invoiceSteps) build(ctx context.Context, next int) error {
	if !v.fresh && next < len(v.inv.Lines) {
		// A draft this call did not make from a claim it won is listed
		// before any line is sent: a line made under an earlier window
		// (the claim's step set back by hand, a row restored, a draft
		// found by search) has a key Stripe may have forgotten.
		lines, err := readRetried(ctx, v.b, v.j, v.lines)
		if err != nil {
			if ctx.Err() != nil {
				return asChargeError(v.j, v.b.failure(ctx, v.j, err))
			}
			return v.needs(ctx, stepLine+strconv.Itoa(next), err.Error())
		}
		v.listed = lines
	}
	for i := next; i < len(v.inv.Lines); i++ {
		if _, ok := v.listedLine(i, v.listed); ok {
			continue
		}
		if _, err := v.step(ctx, stepLine+strconv.Itoa(i), v.line(i), v.findLine(i)); err != nil {
			return err
		}
	}
	if err := v.checkLines(ctx); err != nil {
		return err
	}
	_, err := v.step(ctx, stepFinalized, v.finalize, v.findFinalized)
	return err
}

// collect has a final, open invoice whose total is the claim's paid
// (after turning Stripe's automatic collection of it on) or sent, and
// records its status.
func (v *invoiceSteps) collect(ctx context.Context, status string) (Receipt, error) {
	if status == string(stripe.InvoiceStatusOpen) && v.inv.DaysUntilDue == 0 && v.final != nil && !v.final.AutoAdvance {
		// The total is the claim's: Stripe may collect the invoice now,
		// and goes on collecting it if the payment below is declined.
		// Like turning it off, this is sent without looking first.
		verify := v.verify
		v.verify = false
		_, err := v.step(ctx, "collect", v.autoAdvance(true), v.findAdvancing(true))
		v.verify = verify
		if err != nil {
			return Receipt{}, err
		}
	}
	// Only an open invoice is paid or sent: an uncollectible one (a person
	// wrote it off) is one Stripe collects no more, and its claim is
	// processing, as its event makes it (see updateFromInvoice); a void
	// one fails the claim.
	if status == string(stripe.InvoiceStatusOpen) {
		var err error
		if v.inv.DaysUntilDue > 0 {
			status, err = v.step(ctx, "send", v.send, v.findSent)
		} else {
			status, err = v.step(ctx, "pay", v.pay, v.findPaid)
		}
		var se *stripe.Error
		if err != nil && errors.As(err, &se) && se.HTTPStatusCode == http.StatusPaymentRequired {
			return v.declined(ctx, se)
		}
		if err != nil {
			return Receipt{}, err
		}
	}
	return v.settle(ctx, status)
}

// keyOf is the key of one step: derived from the claim's key and the step.
func (v *invoiceSteps) keyOf(step string) (idemkey.Key, error) {
	return idemkey.For(v.b.cfg.Scope, v.j.key.String(), step)
}

// meta is the metadata of the invoice and of each of its items.
func (v *invoiceSteps) meta() map[string]string {
	return map[string]string{MetaKey: v.j.key.String(), MetaCustomer: v.j.customer, MetaPeriod: v.j.period}
}

// step runs one step's request under retry with the step's key, through
// the engine's guard (see Biller.guarded), as every write of every kind.
// Past the claim's deadline (or when the step's key may have gone with
// another credential), find looks for what the step would make: found,
// it is the step's result; not found, and missUntrusted trusts that as
// it does for a charge's search, the deadline starts again and the step
// is sent. It returns the step's result (an id or the invoice's status);
// its errors are *ChargeError.
func (v *invoiceSteps) step(ctx context.Context, step string, call func(context.Context, idemkey.Key) (string, error),
	find func(context.Context) (string, bool, error)) (string, error) {
	b := v.b
	key, err := v.keyOf(step)
	if err != nil {
		return "", chargeErr(v.j, nil, "", invalid("%v", err))
	}
	check := v.verify
	for reopened := false; ; reopened = true {
		if check {
			res, found, err := find(ctx)
			if err == nil && found {
				b.log.LogAttrs(ctx, slogInfo, "billonce: found an invoice step done at Stripe", attrs(v.j, "step", step, "invoice", v.j.holds)...)
				return res, nil
			}
			if v.verify && (step == stepDraft || strings.HasPrefix(step, stepLine)) {
				// The other credential's request may still land, and
				// would make a second draft or line. (A finalization, a
				// payment or a sending that lands after this call's is
				// refused by the invoice's status, or sends the customer
				// the same invoice again: those steps go on.)
				if wait := b.missUntrusted(ctx, v.j, v.c); wait != nil {
					b.release(context.WithoutCancel(ctx), v.j, wait)
					wait.StripeID = v.j.holds
					return "", wait
				}
			}
			if err != nil {
				return "", v.needs(ctx, step, err.Error())
			}
			if err := v.reopen(ctx, step); err != nil {
				return "", v.lost(ctx, step, err)
			}
		}
		out, err := b.guarded(ctx, &v.j, key, nil, func(ctx context.Context, key idemkey.Key) (object, error) {
			res, err := call(ctx, key)
			return object{id: res}, err
		})
		switch {
		case err == nil:
			return out.id, nil
		case errors.Is(err, claimengine.ErrWindowClosed) && !reopened:
			b.log.LogAttrs(ctx, slogWarn, "billonce: an invoice step's deadline has passed; looking for what exists before writing", attrs(v.j, "step", step, "invoice", v.j.holds)...)
			check = true
			continue
		case errors.Is(err, claimengine.ErrWindowClosed):
			return "", v.needs(ctx, step, "the step's window closed twice in one call")
		case errors.Is(err, claimengine.ErrLeaseLost):
			return "", chargeErr(v.j, ErrInProgress, "stopped at step "+step, err)
		case ctx.Err() == nil && outcomeUnknown(err):
			// Retries could not tell whether Stripe did the step (or
			// Stripe stored a 5xx for its key, which every replay
			// repeats). Looking may: what it finds is the truth; finding
			// nothing proves nothing (a request may still be on its way,
			// search lags), and the claim stays pending.
			if res, found, ferr := find(ctx); ferr == nil && found {
				b.log.LogAttrs(ctx, slogInfo, "billonce: settled an invoice step's unknown outcome by looking at Stripe", attrs(v.j, "step", step, "invoice", v.j.holds)...)
				return res, nil
			}
		}
		return "", asChargeError(v.j, b.failure(ctx, v.j, err))
	}
}

// reopen starts the window of step's key again, with this Biller's
// credential, once a lookup found nothing for it (see claim.Store.Reopen).
// The lines before it are recorded first: they are at Stripe (found, or
// made under a window that ends now), and a resume from the draft would
// send them again with keys that Stripe may have forgotten, or never
// received with this credential.
func (v *invoiceSteps) reopen(ctx context.Context, step string) error {
	last := -1
	switch {
	case step == stepFinalized:
		last = len(v.inv.Lines) - 1
	case strings.HasPrefix(step, stepLine):
		i, err := strconv.Atoi(strings.TrimPrefix(step, stepLine))
		if err != nil {
			return err
		}
		last = i - 1
	}
	ctx = context.WithoutCancel(ctx)
	b := v.b
	if last >= 0 {
		if err := b.claims.Advance(ctx, v.j.key.String(), v.j.owner, v.j.holds, stepLine+strconv.Itoa(last)); err != nil {
			return err
		}
	}
	if err := b.claims.Reopen(ctx, v.j.key.String(), v.j.owner, endpointInvoices, b.credential); err != nil {
		return err
	}
	v.verify = false
	return nil
}

// lost is the error of a record of step that failed: the claim stays at
// its previous step, and a resume repeats this one with the same key.
func (v *invoiceSteps) lost(ctx context.Context, step string, err error) error {
	if errors.Is(err, claimengine.ErrLeaseLost) {
		return chargeErr(v.j, ErrInProgress, "stopped at step "+step, err)
	}
	v.b.release(context.WithoutCancel(ctx), v.j, err)
	e := chargeErr(v.j, ErrNotRecorded, fmt.Sprintf("step %s of invoice %s; the next call repeats it with the same key", step, v.j.holds), err)
	e.StripeID = v.j.holds
	return e
}

// needs leaves the claim pending for a person (see Biller.needs): what
// exists at Stripe for step could not be told.
func (v *invoiceSteps) needs(ctx context.Context, step, reason string) error {
	return v.b.needs(ctx, v.j, fmt.Sprintf("step %s: %s", step, reason), nil)
}

// settle records the invoice's status once it is final. In a Run, a paid
// invoice is recorded by the run's recorder, as a charge is: many in one
// round trip.
func (v *invoiceSteps) settle(ctx context.Context, status string) (Receipt, error) {
	b, j := v.b, v.j
	if j.rec != nil && status == string(stripe.InvoiceStatusPaid) {
		j.rec.succeeded(j, object{id: j.holds, status: status})
		return Receipt{}, errRecording
	}
	rctx, cancel := recordCtx(callerOf(ctx, j))
	defer cancel()
	r := b.receipt(j, v.j.holds, Created)
	var err error
	switch stripe.InvoiceStatus(status) {
	case stripe.InvoiceStatusPaid:
		if err = b.claims.Succeed(rctx, j.key.String(), v.j.holds); err != nil {
			err = b.settledByEvent(rctx, j, object{id: v.j.holds}, err)
		}
	case stripe.InvoiceStatusOpen, stripe.InvoiceStatusUncollectible:
		// Either can still be paid: the claim holds the period until
		// the invoice is paid or voided.
		r.Processing = true
		err = b.claims.Process(rctx, j.key.String(), v.j.holds)
	default:
		reason := "invoice " + v.j.holds + " is " + status
		if ferr := b.claims.Fail(rctx, j.key.String(), v.j.holds, reason); ferr != nil {
			err = ferr
			break
		}
		return Receipt{}, chargeErr(j, ErrDeclined, reason, nil)
	}
	if err = recordErr(rctx, err); err != nil {
		e := chargeErr(j, ErrNotRecorded, "invoice "+v.j.holds+" is "+status, err)
		e.StripeID = v.j.holds
		return Receipt{}, e
	}
	return r, nil
}

// declined records a payment the customer's card declined: the invoice
// stays open and Stripe keeps collecting it, so the claim is processing.
func (v *invoiceSteps) declined(ctx context.Context, se *stripe.Error) (Receipt, error) {
	r, err := v.settle(ctx, string(stripe.InvoiceStatusOpen))
	if err != nil {
		return r, err
	}
	reason := string(se.Code)
	if se.DeclineCode != "" {
		reason += " (" + string(se.DeclineCode) + ")"
	}
	e := declined(v.j, ErrDeclined, "invoice "+v.j.holds+" stays open: "+reason+": "+se.Msg, nil, se)
	e.Code, e.DeclineCode, e.StripeID = string(se.Code), string(se.DeclineCode), v.j.holds
	v.b.invoiceDeclined(ctx, v.j.key.String(), e)
	return r, nil
}

// invoiceDeclined reports a failed payment of an invoice that stays open.
func (b *Biller) invoiceDeclined(ctx context.Context, key string, e *ChargeError) {
	b.log.LogAttrs(ctx, slogWarn, "billonce: an invoice's payment failed; the invoice stays open, Stripe keeps collecting it, and the claim is processing until it is paid or voided",
		attrs(job{customer: e.Customer, period: e.Period}, "key", key, "invoice", e.StripeID, "code", e.Code, "decline_code", e.DeclineCode)...)
	b.observe(Event{Kind: EventSettled, Object: objectOf(endpointInvoices), Customer: e.Customer, Period: e.Period, Key: key, StripeID: e.StripeID,
		State: string(claim.StateProcessing), Err: e})
}

// The steps' requests. Each receives a context carrying its key, and
// sends the key in its params as well.

func (v *invoiceSteps) draft(ctx context.Context, key idemkey.Key) (string, error) {
	inv := v.inv
	p := &stripe.InvoiceParams{
		Customer:                    stripe.String(v.j.customer),
		AutoAdvance:                 stripe.Bool(false),
		PendingInvoiceItemsBehavior: stripe.String("exclude"),
		Currency:                    stripe.String(inv.Currency),
		CollectionMethod:            stripe.String(string(stripe.InvoiceCollectionMethodChargeAutomatically)),
	}
	if inv.DaysUntilDue > 0 {
		p.CollectionMethod = stripe.String(string(stripe.InvoiceCollectionMethodSendInvoice))
		p.DaysUntilDue = stripe.Int64(int64(inv.DaysUntilDue))
	}
	if inv.Description != "" {
		p.Description = stripe.String(inv.Description)
	}
	p.Context, p.IdempotencyKey, p.Metadata = ctx, stripe.String(key.String()), v.meta()
	in, err := v.b.invoices.New(p)
	if err != nil {
		return "", err
	}
	if in.ID == "" || in.Status == "" {
		return "", notStripes(in.LastResponse, "is not an invoice")
	}
	return in.ID, nil
}

func (v *invoiceSteps) line(i int) func(context.Context, idemkey.Key) (string, error) {
	return func(ctx context.Context, key idemkey.Key) (string, error) {
		l := v.inv.Lines[i]
		meta := v.meta()
		meta[metaLine] = strconv.Itoa(i)
		p := &stripe.InvoiceItemParams{
			Customer: stripe.String(v.j.customer),
			Invoice:  stripe.String(v.j.holds),
			Amount:   stripe.Int64(l.Amount),
			Currency: stripe.String(v.inv.Currency),
		}
		if l.Description != "" {
			p.Description = stripe.String(l.Description)
		}
		p.Context, p.IdempotencyKey, p.Metadata = ctx, stripe.String(key.String()), meta
		it, err := v.b.items.New(p)
		if err != nil {
			return "", err
		}
		if it.ID == "" {
			return "", notStripes(it.LastResponse, "is not an invoice item")
		}
		return it.ID, nil
	}
}

func (v *invoiceSteps) finalize(ctx context.Context, key idemkey.Key) (string, error) {
	// An invoice is finalized with auto_advance off: Stripe collects an
	// open invoice with it on by itself an hour after, whatever its
	// total, and the total is checked first (see checkTotal). An invoice
	// charged automatically whose total is the claim's has it turned on
	// before billonce pays it, so that if that payment is declined,
	// Stripe's retries (and its dunning settings) go on collecting it.
	// One sent to the customer keeps it off: billonce sends it.
	p := &stripe.InvoiceFinalizeInvoiceParams{AutoAdvance: stripe.Bool(false)}
	p.Context, p.IdempotencyKey = ctx, stripe.String(key.String())
	in, err := v.b.invoices.FinalizeInvoice(v.j.holds, p)
	if err != nil {
		// "already finalized": read the invoice to be sure.
		return v.confirm(ctx, err, func(s stripe.InvoiceStatus) bool { return s != stripe.InvoiceStatusDraft })
	}
	return v.status(in)
}

func (v *invoiceSteps) pay(ctx context.Context, key idemkey.Key) (string, error) {
	p := &stripe.InvoicePayParams{}
	p.Context, p.IdempotencyKey = ctx, stripe.String(key.String())
	in, err := v.b.invoices.Pay(v.j.holds, p)
	if err != nil {
		// "already paid": read the invoice to be sure.
		return v.confirm(ctx, err, func(s stripe.InvoiceStatus) bool { return s == stripe.InvoiceStatusPaid })
	}
	return v.status(in)
}

func (v *invoiceSteps) send(ctx context.Context, key idemkey.Key) (string, error) {
	p := &stripe.InvoiceSendInvoiceParams{}
	p.Context, p.IdempotencyKey = ctx, stripe.String(key.String())
	in, err := v.b.invoices.SendInvoice(v.j.holds, p)
	if err != nil {
		return v.confirm(ctx, err, func(s stripe.InvoiceStatus) bool { return s == stripe.InvoiceStatusPaid })
	}
	return v.status(in)
}

// autoAdvance turns Stripe's automatic collection of the invoice on or
// off.
func (v *invoiceSteps) autoAdvance(on bool) func(context.Context, idemkey.Key) (string, error) {
	return func(ctx context.Context, key idemkey.Key) (string, error) {
		p := &stripe.InvoiceParams{AutoAdvance: stripe.Bool(on)}
		p.Context, p.IdempotencyKey = ctx, stripe.String(key.String())
		in, err := v.b.invoices.Update(v.j.holds, p)
		if err != nil {
			return "", err
		}
		return v.status(in)
	}
}

// confirm reads the invoice after Stripe refused a step with a 400 that
// may mean "already done", and returns its status if done says so; any
// other answer is err.
func (v *invoiceSteps) confirm(ctx context.Context, err error, done func(stripe.InvoiceStatus) bool) (string, error) {
	var se *stripe.Error
	if !errors.As(err, &se) || se.HTTPStatusCode != http.StatusBadRequest || se.Type != stripe.ErrorTypeInvalidRequest {
		return "", err
	}
	in, gerr := v.get(ctx)
	if gerr != nil || !done(in.Status) {
		return "", err
	}
	return string(in.Status), nil
}

func (v *invoiceSteps) status(in *stripe.Invoice) (string, error) {
	if in.ID != v.j.holds || in.Status == "" {
		return "", notStripes(in.LastResponse, "is not the invoice "+v.j.holds)
	}
	v.seen(in)
	return string(in.Status), nil
}

// seen keeps in, the invoice as Stripe showed it, once it is final.
func (v *invoiceSteps) seen(in *stripe.Invoice) {
	if in.Status != stripe.InvoiceStatusDraft {
		v.final = in
	}
}

// get reads the invoice.
func (v *invoiceSteps) get(ctx context.Context) (*stripe.Invoice, error) {
	if err := v.b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	in, err := v.b.invoices.Get(v.j.holds, &stripe.InvoiceParams{Params: stripe.Params{Context: ctx}})
	if err != nil {
		return nil, err
	}
	if in.ID != v.j.holds || in.Status == "" {
		return nil, notStripes(in.LastResponse, "is not the invoice "+v.j.holds)
	}
	if in.Metadata[MetaKey] != v.j.key.String() {
		return nil, fmt.Errorf("invoice %s carries key %q in its metadata, not the claim's", v.j.holds, in.Metadata[MetaKey])
	}
	v.seen(in)
	return in, nil
}

// The finders: what a step made, looked for once its key may be forgotten.

// findDraft lists the customer's invoices made since the claim for the
// one that carries the claim's key in its metadata: a list, unlike a
// search, shows an invoice as soon as it exists. Metadata is anyone's to
// write, so, as for a payment (see Biller.ownHits), only an invoice that
// the draft's request would have made counts: the claim's customer's, in
// its currency, and, once final, showing the claim's lines (billonce
// finalizes a draft only once its lines are all the claim's). A void one
// counts only when no other does: it is the claim's own, voided by a
// person once final, and fails the claim (see settle). Another writer's invoice never settles the step, and never
// counts as a miss either. Several found, only others' found, or a failed
// list, cannot be settled here. The invoice found is kept as the list
// shows it now, which may be past its draft (finalized, paid).
func (v *invoiceSteps) findDraft(ctx context.Context) (string, bool, error) {
	b := v.b
	if err := b.limiter.Wait(ctx); err != nil {
		return "", false, err
	}
	p := &stripe.InvoiceListParams{Customer: stripe.String(v.j.customer)}
	p.Context, p.Limit = ctx, stripe.Int64(100)
	since := v.listedSince()
	if since != nil {
		p.CreatedRange = since
	}
	it := b.invoices.List(p)
	var own, void []*stripe.Invoice
	var foreign []string
	for it.Next() {
		in := it.Invoice()
		if in.ID == "" {
			return "", false, notStripes(it.InvoiceList().LastResponse, "is not an invoice")
		}
		if in.Metadata[MetaKey] != v.j.key.String() {
			continue
		}
		if customerOf(in) != v.j.customer || !strings.EqualFold(string(in.Currency), v.inv.Currency) {
			foreign = append(foreign, fmt.Sprintf("%s (%s, %s, %d %s)", in.ID, customerOf(in), in.Status, in.Total, in.Currency))
			continue
		}
		if in.Status != stripe.InvoiceStatusDraft {
			// billonce finalizes an invoice only once its lines are
			// all the claim's: a final one with none of them was
			// never the claim's draft.
			ours, err := v.carriesOwnLine(ctx, in)
			if err != nil {
				return "", false, err
			}
			if !ours {
				foreign = append(foreign, fmt.Sprintf("%s (%s, %s without the claim's lines, %d %s)", in.ID, customerOf(in), in.Status, in.Total, in.Currency))
				continue
			}
		}
		if in.Status == stripe.InvoiceStatusVoid {
			void = append(void, in)
		} else {
			own = append(own, in)
		}
	}
	if err := it.Err(); err != nil {
		return "", false, fmt.Errorf("listing the invoices of customer %s failed: %w", v.j.customer, err)
	}
	if err := notAList(it.InvoiceList()); err != nil {
		return "", false, err
	}
	if len(own) == 0 {
		own = void
	}
	switch len(own) {
	case 0:
		if len(foreign) > 0 {
			return "", false, fmt.Errorf("the customer's invoices carry the key's metadata only on invoices the key's draft would not be (another customer or currency, or final without the claim's lines), made by other code holding the key: %s; nothing was sent: if none of them is billonce's, remove %s from their metadata, and the next call makes the claim's invoice", strings.Join(foreign, ", "), MetaKey)
		}
		deleted, err := v.findDeleted(ctx, since)
		if err != nil || len(deleted) == 0 {
			return "", false, err
		}
		v.j.holds, v.deleted = deleted[0], true
		return deleted[0], true, nil
	case 1:
		v.j.holds = own[0].ID
		v.seen(own[0])
		return own[0].ID, true, nil
	}
	ids := make([]string, len(own))
	for i, in := range own {
		ids[i] = fmt.Sprintf("%s (%s)", in.ID, in.Status)
	}
	return "", false, fmt.Errorf("the customer has %d invoices that carry the claim's key: %s; nothing was sent: keep the one that bills the period, and void the others (or delete them while drafts) after removing %s from their metadata; the next call takes the one left", len(own), strings.Join(ids, ", "), MetaKey)
}

// listedSince bounds the lists of findDraft and findDeleted to what was
// made since the claim: its age on the store's clock, with room for the
// clocks of the store, of this machine and of Stripe to differ. nil when
// the claim's age is unknown.
func (v *invoiceSteps) listedSince() *stripe.RangeQueryParams {
	if v.c.CreatedAt.IsZero() {
		return nil
	}
	return &stripe.RangeQueryParams{GreaterThanOrEqual: time.Now().Add(-v.c.Age - invoiceListSlack).Unix()}
}

// findDeleted looks, when no invoice of the claim's is listed, for one
// that a person deleted while a draft: Stripe lists no deleted invoice,
// but keeps its invoice.deleted event for 30 days. A draft of the
// customer's in the claim's currency, with the claim's metadata (its key,
// customer and period: other code may copy the key alone) and no line
// but the claim's, is the claim's own: deleted by hand, like an invoice
// voided by hand, it fails the claim (see settle), and no other invoice
// is made for the period; Rebill bills it again. It returns the ids of
// such drafts, newest first.
func (v *invoiceSteps) findDeleted(ctx context.Context, since *stripe.RangeQueryParams) ([]string, error) {
	b := v.b
	if err := b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	p := &stripe.EventListParams{Type: stripe.String("invoice.deleted")}
	p.Context, p.Limit = ctx, stripe.Int64(100)
	if since != nil {
		p.CreatedRange = since
	}
	it := b.events.List(p)
	var found []string
	for it.Next() {
		ev := it.Event()
		if ev.Data == nil {
			continue
		}
		var in stripe.Invoice
		if err := json.Unmarshal(ev.Data.Raw, &in); err != nil || in.ID == "" {
			continue
		}
		if !v.carriesMeta(&in) || customerOf(&in) != v.j.customer || !strings.EqualFold(string(in.Currency), v.inv.Currency) {
			continue
		}
		if in.Lines != nil && len(in.Lines.Data) > 0 && !ownLine(v.j.key, in.Lines.Data) {
			continue // another writer's draft: its lines are not the claim's
		}
		if !slices.Contains(found, in.ID) {
			found = append(found, in.ID)
		}
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("listing the invoice.deleted events failed: %w", err)
	}
	if err := notAList(it.EventList()); err != nil {
		return nil, err
	}
	return found, nil
}

// carriesMeta reports whether in carries all the metadata billonce gives
// the claim's draft (see meta), not the key alone.
func (v *invoiceSteps) carriesMeta(in *stripe.Invoice) bool {
	for k, want := range v.meta() {
		if in.Metadata[k] != want {
			return false
		}
	}
	return true
}

// carriesOwnLine reports whether one of in's lines is one of the claim's,
// as billonce adds them: among those Stripe shows with in (the first page
// of them), or, when there are more or none are shown, among all of them,
// listed.
func (v *invoiceSteps) carriesOwnLine(ctx context.Context, in *stripe.Invoice) (bool, error) {
	if in.Lines != nil && (ownLine(v.j.key, in.Lines.Data) || !in.Lines.HasMore && len(in.Lines.Data) > 0) {
		return ownLine(v.j.key, in.Lines.Data), nil
	}
	lines, err := v.linesOf(ctx, in.ID)
	return err == nil && ownLine(v.j.key, lines), err
}

// ownLine reports whether one of lines is one of key's, as billonce adds
// them.
func ownLine(key idemkey.Key, lines []*stripe.InvoiceLineItem) bool {
	for _, l := range lines {
		if l.Metadata[MetaKey] == key.String() && l.Metadata[metaLine] != "" {
			return true
		}
	}
	return false
}

// customerOf is the id of in's customer.
func customerOf(in *stripe.Invoice) string {
	if in.Customer == nil {
		return ""
	}
	return in.Customer.ID
}

// findLine looks for line i's item among the invoice's lines: in the
// listing an earlier line's lookup made, then in a new one. A line listed
// once was made, so one listing finds every line made before it; a line
// missing from it is listed for again, since it may have been made since.
func (v *invoiceSteps) findLine(i int) func(context.Context) (string, bool, error) {
	in := func(lines []*stripe.InvoiceLineItem) (string, bool) { return v.listedLine(i, lines) }
	return func(ctx context.Context) (string, bool, error) {
		if id, ok := in(v.listed); ok {
			return id, true, nil
		}
		lines, err := v.lines(ctx)
		if err != nil {
			return "", false, err
		}
		v.listed = lines
		if id, ok := in(lines); ok {
			return id, true, nil
		}
		// The lines are sent one after the other: a later line on the
		// draft without this one means this one was made and removed (a
		// person deleting billonce's item on the dashboard). Its key may
		// be one Stripe has forgotten, and so may the later lines' be,
		// which the window reopened for this line would send again.
		for _, l := range lines {
			if j, err := strconv.Atoi(l.Metadata[metaLine]); err == nil && j > i && l.Metadata[MetaKey] == v.j.key.String() {
				return "", false, fmt.Errorf("invoice %s has line %d (%s) but no line %d: an item billonce added was deleted from the draft, and sending it again could add the lines after it twice, so nothing was sent: either finish the invoice by hand (add the line again, finalize and pay it: its invoice.paid event settles the claim if its total is the claim's), or delete the draft, which fails the claim at the next call (Rebill then bills the period with a new invoice)", v.j.holds, j, itemOf(l), i)
			}
		}
		return "", false, nil
	}
}

// listedLine is line i's item among lines, if it is there.
func (v *invoiceSteps) listedLine(i int, lines []*stripe.InvoiceLineItem) (string, bool) {
	want := strconv.Itoa(i)
	for _, l := range lines {
		if l.Metadata[MetaKey] == v.j.key.String() && l.Metadata[metaLine] == want {
			return itemOf(l), true
		}
	}
	return "", false
}

// lines lists the invoice's lines, a hundred a page.
func (v *invoiceSteps) lines(ctx context.Context) ([]*stripe.InvoiceLineItem, error) {
	return v.linesOf(ctx, v.j.holds)
}

// linesOf lists invoice id's lines, a hundred a page.
func (v *invoiceSteps) linesOf(ctx context.Context, id string) ([]*stripe.InvoiceLineItem, error) {
	if err := v.b.limiter.Wait(ctx); err != nil {
		return nil, err
	}
	p := &stripe.InvoiceListLinesParams{Invoice: stripe.String(id)}
	p.Context, p.Limit = ctx, stripe.Int64(100)
	it := v.b.invoices.ListLines(p)
	var out []*stripe.InvoiceLineItem
	for it.Next() {
		out = append(out, it.InvoiceLineItem())
	}
	if err := it.Err(); err != nil {
		return nil, fmt.Errorf("listing the lines of invoice %s failed: %w", id, err)
	}
	if err := notAList(it.InvoiceLineItemList()); err != nil {
		return nil, err
	}
	return out, nil
}

// itemOf is the invoice item a line shows, or the line's own id.
func itemOf(l *stripe.InvoiceLineItem) string {
	if l.InvoiceItem != nil && l.InvoiceItem.ID != "" {
		return l.InvoiceItem.ID
	}
	return l.ID
}

// checkLines lists the draft's lines before it is finalized. The claim
// records the invoice's total, not its lines, and a draft is anyone's to
// change between two steps: a person on Stripe's dashboard, or other
// code, may add an item to it, and a call that goes on from lines an
// earlier call added may have lines of another split of the same total
// (Config.Invoice changed meanwhile). Each of the claim's lines must be
// there once with this call's amount, and nothing else; otherwise nothing
// is finalized, and the draft and its claim wait for a person, with an
// ErrNeedsReconciliation that names what differs.
func (v *invoiceSteps) checkLines(ctx context.Context) error {
	j := v.j
	lines, err := readRetried(ctx, v.b, j, v.lines)
	if err != nil {
		if ctx.Err() != nil {
			return asChargeError(v.j, v.b.failure(ctx, v.j, err))
		}
		return v.needs(ctx, stepFinalized, err.Error())
	}
	seen := make([]bool, len(v.inv.Lines))
	var foreign, wrong []string
	for _, l := range lines {
		if l.Metadata[MetaKey] != j.key.String() {
			foreign = append(foreign, fmt.Sprintf("%s (%d %s)", itemOf(l), l.Amount, l.Currency))
			continue
		}
		i, err := strconv.Atoi(l.Metadata[metaLine])
		switch {
		case err != nil || i < 0 || i >= len(seen):
			wrong = append(wrong, fmt.Sprintf("a line with index %q", l.Metadata[metaLine]))
		case seen[i]:
			wrong = append(wrong, fmt.Sprintf("line %d twice", i))
		case l.Amount != v.inv.Lines[i].Amount:
			seen[i] = true
			wrong = append(wrong, fmt.Sprintf("line %d of %d, not %d", i, l.Amount, v.inv.Lines[i].Amount))
		default:
			seen[i] = true
		}
	}
	for i, ok := range seen {
		if !ok {
			wrong = append(wrong, fmt.Sprintf("no line %d", i))
		}
	}
	var why []string
	if len(foreign) > 0 {
		why = append(why, fmt.Sprintf("items billonce did not add, %s: delete them from the draft (bill them on an invoice of their own) and call again", strings.Join(foreign, ", ")))
	}
	if len(wrong) > 0 {
		why = append(why, fmt.Sprintf("%s, which are not this call's lines (did Config.Invoice change?): call again with the lines the invoice was begun with", strings.Join(wrong, ", ")))
	}
	if len(why) > 0 {
		return v.needs(ctx, stepFinalized, fmt.Sprintf("invoice %s was left a draft, not finalized: it has %s", v.j.holds, strings.Join(why, "; and it has ")))
	}
	return nil
}

// checkTotal checks, before a final invoice is paid or sent, that its
// total is the claim's, which the receipt reports: an item added by
// someone else after the draft's lines were checked, or a discount or
// tax Stripe applies, would bill the customer another amount. An open
// (or uncollectible, which can still be paid) invoice whose total differs
// is left unpaid and unsent, with automatic
// collection off so that Stripe does not collect it either, and the
// claim waits for a person. It returns the invoice's status.
func (v *invoiceSteps) checkTotal(ctx context.Context) (string, error) {
	j := v.j
	next := "pay"
	if v.inv.DaysUntilDue > 0 {
		next = "send"
	}
	in := v.final
	if in == nil { // the claim was finalized by an earlier call
		var err error
		in, err = readRetried(ctx, v.b, j, v.get)
		if err != nil {
			if ctx.Err() != nil {
				return "", asChargeError(v.j, v.b.failure(ctx, v.j, err))
			}
			return "", v.needs(ctx, next, fmt.Sprintf("reading invoice %s failed: %v", v.j.holds, err))
		}
	}
	// An uncollectible invoice can still be paid, as an open one can
	// (from its page, by hand): its total is checked the same way, and
	// one that is not the claim's needs a person, not a processing claim.
	payable := in.Status == stripe.InvoiceStatusOpen || in.Status == stripe.InvoiceStatusUncollectible
	if !payable && in.Status != stripe.InvoiceStatusPaid ||
		in.Total == j.price.Amount && string(in.Currency) == j.price.Currency {
		return string(in.Status), nil
	}
	if in.Status == stripe.InvoiceStatusPaid {
		// Stripe marks an invoice whose total is zero paid as it is
		// finalized (a credit item added meanwhile): the claim's total
		// was not paid, and the receipt must not say it was.
		return "", v.needs(ctx, next, fmt.Sprintf("invoice %s was finalized with a total of %d %s, not the claim's %d %s (an item billonce did not add, a discount or a tax), and Stripe marked it paid: the customer paid %d %s for the period; bill what is owed by hand, then record the claim with billonce resolve",
			v.j.holds, in.Total, in.Currency, j.price.Amount, j.price.Currency, in.AmountPaid, in.Currency))
	}
	reason := fmt.Sprintf("invoice %s was finalized with a total of %d %s, not the claim's %d %s (an item billonce did not add, a discount or a tax); it was not paid or sent",
		v.j.holds, in.Total, in.Currency, j.price.Amount, j.price.Currency)
	b := v.b
	if in.AutoAdvance {
		b.log.LogAttrs(ctx, slogWarn, "billonce: an invoice's total is not its claim's; turning Stripe's automatic collection of it off",
			attrs(j, "invoice", v.j.holds, "total", in.Total, "claim_amount", j.price.Amount)...)
		// Turning collection off twice is turning it off: this step is
		// sent without looking first even where another credential may
		// have sent it, so that Stripe is not left collecting meanwhile.
		verify := v.verify
		v.verify = false
		_, err := v.step(ctx, "hold", v.autoAdvance(false), v.findAdvancing(false))
		v.verify = verify
		if err != nil {
			return "", err
		}
		reason += ", and Stripe's automatic collection of it is off"
	}
	return "", v.needs(ctx, next, reason+": void it, or pay it by hand if its total is owed (see Biller.Invoice)")
}

// findStatus reads the invoice: done tells whether its status shows the
// step done.
func (v *invoiceSteps) findStatus(done func(stripe.InvoiceStatus) bool) func(context.Context) (string, bool, error) {
	return func(ctx context.Context) (string, bool, error) {
		in, err := v.get(ctx)
		if err != nil {
			return "", false, fmt.Errorf("reading invoice %s failed: %w", v.j.holds, err)
		}
		return string(in.Status), done(in.Status), nil
	}
}

// findAdvancing: whether Stripe's automatic collection of the invoice is
// as on says (off: Stripe does not collect it).
func (v *invoiceSteps) findAdvancing(on bool) func(context.Context) (string, bool, error) {
	return func(ctx context.Context) (string, bool, error) {
		in, err := v.get(ctx)
		if err != nil {
			return "", false, fmt.Errorf("reading invoice %s failed: %w", v.j.holds, err)
		}
		// Stripe turns it off for an invoice no longer open, which it
		// collects no more.
		return string(in.Status), in.AutoAdvance == on || on && in.Status != stripe.InvoiceStatusOpen, nil
	}
}

func (v *invoiceSteps) findFinalized(ctx context.Context) (string, bool, error) {
	return v.findStatus(func(s stripe.InvoiceStatus) bool { return s != stripe.InvoiceStatusDraft })(ctx)
}

// findPaid: an open invoice was not paid (a declined attempt leaves it
// open), so paying it again cannot pay twice; a void invoice is final, and
// an uncollectible one is left to its customer (the claim holds it as
// processing).
func (v *invoiceSteps) findPaid(ctx context.Context) (string, bool, error) {
	return v.findStatus(func(s stripe.InvoiceStatus) bool { return s != stripe.InvoiceStatusOpen })(ctx)
}

// findSent: whether an open invoice was sent cannot be read; sending it
// again sends the customer the same invoice again, which bills nothing.
func (v *invoiceSteps) findSent(ctx context.Context) (string, bool, error) {
	return v.findStatus(func(s stripe.InvoiceStatus) bool { return s != stripe.InvoiceStatusOpen })(ctx)
}

// updateFromInvoice is what an invoice event says about its claim:
// invoice.paid settles it, invoice.voided fails it, invoice.payment_failed
// leaves it processing (the invoice stays open and Stripe keeps collecting
// it), and so does invoice.marked_uncollectible: an uncollectible invoice
// can still be paid (from its hosted page, or when told to), so it holds
// the period until it is voided. Every other event (as invoice.finalized)
// is recorded and moves nothing. A read of the invoice
// (typ "") maps its status the same way.
func updateFromInvoice(typ string, in *stripe.Invoice) claimengine.Update {
	u := claimengine.Update{Key: in.Metadata[MetaKey], StripeID: in.ID, Endpoint: endpointInvoices, Amount: in.Total, Currency: string(in.Currency)}
	switch {
	case typ == "invoice.paid", typ == "" && in.Status == stripe.InvoiceStatusPaid:
		u.State = string(claim.StateSucceeded)
	case typ == "invoice.voided", typ == "" && in.Status == stripe.InvoiceStatusVoid:
		u.State, u.FailureCode = string(claim.StateFailed), "invoice_voided"
	case typ == "invoice.payment_failed", typ == "invoice.marked_uncollectible",
		typ == "" && (in.Status == stripe.InvoiceStatusOpen || in.Status == stripe.InvoiceStatusUncollectible):
		u.State = string(claim.StateProcessing)
	}
	return u
}

// invoiceJob rebuilds the invoice a pending claim stands for, from
// Config.Invoice: the claim records its total, not its lines.
func (b *Biller) invoiceJob(ctx context.Context, c claim.Claim) (job, error) {
	j := job{account: c.Account, customer: c.Customer, period: c.Period, attempt: c.Attempt}
	if key, err := idemkey.Parse(c.Key); err == nil {
		j.key = key
	}
	if b.cfg.Invoice == nil {
		return j, chargeErr(j, ErrNeedsReconciliation, fmt.Sprintf("an invoice claim at step %q (invoice %q) needs Config.Invoice for its lines to be resumed; it was left as it is", c.Step, c.StripeID), nil)
	}
	nj, err := b.prepareInvoice(ctx, c.Account, c.Customer, c.Period, nil)
	if err != nil {
		return j, err
	}
	if nj.key.String() != c.Key || nj.price.Amount != c.Amount || nj.price.Currency != c.Currency {
		return j, chargeErr(j, nil, "nothing sent", &claim.MismatchError{Existing: c})
	}
	return nj, nil
}

func checkText(what, s string) error {
	switch {
	case len(s) > maxInvoiceText:
		return invalid("%s is %d bytes long; the limit is %d", what, len(s), maxInvoiceText)
	case !utf8.ValidString(s):
		return invalid("%s is not valid UTF-8", what)
	}
	return nil
}

const (
	// endpointInvoices is the Endpoint of an invoice's claim.
	endpointInvoices = "invoices"
	// metaLine is the metadata key of an invoice item: its line's index.
	metaLine = "billonce_line"

	stepDraft     = "draft"
	stepLine      = "line "
	stepFinalized = "finalized"

	// invoiceListSlack widens the list of a customer's invoices that
	// findDraft reads, past the claim's age.
	invoiceListSlack = 7 * 24 * time.Hour

	maxInvoiceLines = 250
	maxDaysUntilDue = 365
	maxInvoiceText  = 500
)
