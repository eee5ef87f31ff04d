package billing

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/stripe/stripe-go/v79"
)

// reconcile settles a pending claim whose key's deadline has passed, or
// whose key went with another endpoint or credential: Stripe may have
// forgotten the key, or keep it where this Biller's requests do not meet
// it, so sending it again could make a second charge if the first one
// exists. Stripe's search by metadata, over every object type a key can
// have gone to, decides:
//
//   - one payment found: its outcome is recorded; nothing is sent;
//   - none found, and [Biller.missUntrusted] trusts that: no payment
//     exists for the key, so the claim's window is reopened, for this
//     Biller's endpoint and credential, and the key is sent again;
//   - none found too early to trust it: ErrSentElsewhere; nothing is sent;
//   - search failed or found several payments: ErrNeedsReconciliation (or
//     ErrSentElsewhere, when a miss could not be trusted either); nothing
//     is sent.
func (b *Biller) reconcile(ctx context.Context, j job, c claim.Claim) (Receipt, error) {
	return b.searchThen(ctx, j, c, nil)
}

// A finder is a writer whose writes are found at Stripe by their key's
// metadata: a payment by Stripe's search, a refund by listing its
// payment's refunds.
type finder interface {
	writer
	// find returns the objects at Stripe that carry j's key in their
	// metadata, the claim's own or not (see Biller.ownHits).
	find(ctx context.Context, b *Biller, j job) ([]object, error)
}

// searchThen looks at Stripe for what c's key made (its kind's find) and
// records it if there is exactly one. When there is none, or the lookup
// failed, miss (if not nil) hands the claim on with the lookup's error,
// and nothing is sent; without miss, a miss that [Biller.missUntrusted]
// trusts reopens the key's window and sends.
func (b *Biller) searchThen(ctx context.Context, j job, c claim.Claim, miss func(error) error) (Receipt, error) {
	f := j.kind.(finder)
	b.log.LogAttrs(ctx, slogWarn, "billonce: looking Stripe up for the key's payment before sending",
		attrs(j, "age", c.Age.Round(time.Minute), "sent_age", c.SentAge.Round(time.Minute), "endpoint", c.Endpoint)...)
	found, err := readRetried(ctx, b, j, func(ctx context.Context) ([]object, error) {
		return f.find(ctx, b, j)
	})
	var se *stripe.Error
	needs := func(reason string) (Receipt, error) {
		return Receipt{}, b.needs(ctx, j, fmt.Sprintf("claimed %s ago: %s", c.Age.Round(time.Minute), reason), se)
	}
	if err != nil && errors.As(err, &se) && !outcomeUnknown(err) && se.HTTPStatusCode != 402 {
		// Stripe refused the search itself (a wrong URL or key, a
		// restricted key without search): no claim can be settled this
		// way, so the run stops.
		err = refused(se)
		b.release(context.WithoutCancel(ctx), j, err)
		return Receipt{}, err
	}
	var foreign []object
	if err == nil {
		found, foreign = b.ownHits(j, found)
	}
	switch {
	case err == nil && len(found) > 1:
		return needs(fmt.Sprintf("Stripe search found %d payments for one key", len(found)))
	case err == nil && len(found) == 0 && len(foreign) > 0:
		// Another writer's payment carries the key: whether the claim's
		// own request made one too cannot be told, so nothing is sent.
		return needs(foreignReason(foreign))
	case err == nil && len(found) == 1 && !succeeded(found[0]) && b.missUntrusted(ctx, j, c) != nil:
		// A decline proves the claim's own request failed only when
		// nothing else can still land for its key: another writer's copy
		// of it may be what search shows first.
		wait := b.missUntrusted(ctx, j, c)
		b.release(context.WithoutCancel(ctx), j, wait)
		return Receipt{}, wait
	case err == nil && len(found) == 1:
		b.log.LogAttrs(ctx, slogInfo, "billonce: reconciled a pending claim from Stripe search", attrs(j, "stripe_id", found[0].id)...)
		r, err := b.record(ctx, j, found[0])
		if err == nil {
			r.Outcome = Reconciled
		}
		return r, err
	case miss != nil:
		return Receipt{}, miss(err)
	}
	if wait := b.missUntrusted(ctx, j, c); wait != nil {
		b.release(context.WithoutCancel(ctx), j, wait)
		return Receipt{}, wait
	}
	if err != nil {
		return needs("Stripe search failed: " + err.Error())
	}
	if err := b.claims.Reopen(context.WithoutCancel(ctx), j.key.String(), j.owner, j.kind.endpoint(b), b.credential); err != nil {
		return Receipt{}, fmt.Errorf("billing: customer %s, period %s: reopening the key's window: %w", j.customer, j.period, err)
	}
	b.log.LogAttrs(ctx, slogInfo, "billonce: Stripe has no payment for the pending claim; sending its key again", attrs(j)...)
	j.reopened = true
	return j.kind.send(ctx, b, j, c)
}

// listFirst looks, before a call first sends j's key, whether it just won
// the claim or resumes it, for what the key made, in the kinds found by a
// listing (a refund, a credit note, a transfer, a payout): a claim may
// stand for a write already made, its row lost (a claim table restored
// from an older copy, a row deleted by hand) or its answer lost, and
// Stripe forgets its key a day later. A listing is current at once, so
// what it finds is recorded (searchThen) and nothing is sent; so is a
// resumed claim whose key went with another credential, whatever the
// listing shows (see Biller.missUntrusted). A listing that fails sends
// nothing: a claim just won is dropped, a resumed one left pending.
func (b *Biller) listFirst(ctx context.Context, f finder, j *job, c claim.Claim) (Receipt, bool, error) {
	found, err := readRetried(ctx, b, *j, func(ctx context.Context) ([]object, error) {
		return f.find(ctx, b, *j)
	})
	if err != nil {
		b.giveUp(ctx, *j, err)
		return Receipt{}, true, chargeErr(*j, nil, "looking at Stripe for what the key made before sending it failed; nothing was sent: call again", err)
	}
	if len(found) == 0 && !b.moved(*j, c) {
		return Receipt{}, false, nil
	}
	r, err := b.searchThen(ctx, *j, c, nil)
	return r, true, err
}

// findOwn looks once for what j's own write made, for sendOnce: only what
// is the claim's own (see ownHits) counts, since another writer may copy
// the claim's metadata onto an object of its own.
func (b *Biller) findOwn(ctx context.Context, f finder, j job) (object, bool) {
	found, err := f.find(ctx, b, j)
	if err != nil {
		return object{}, false
	}
	found, _ = b.ownHits(j, found)
	if len(found) != 1 {
		return object{}, false
	}
	return found[0], true
}

// missUntrusted is the past-window policy, one rule for every kind: it
// tells whether a lookup at Stripe that found nothing for c's key (a
// search, a listing, a read of the object) proves that the key made
// nothing. It does not while the key went with another endpoint or
// credential (a claim knows where its key went) and its whole window has
// not passed, with the time search takes to index the last request the
// key can have carried (elsewhereAfter): Stripe may keep keys per
// endpoint and per API key, so this Biller's request with the same key
// would not meet one of the other configuration's that is still on its
// way, and search may not show what that one made yet. The Biller that
// sent the key may have started an attempt just before its own deadline,
// and that attempt may reach Stripe up to an attempt timeout later; New
// keeps every Biller's deadline plus attempt timeout at least
// clockAllowance short of the key window, so a lookup made after the
// window sees every send of the key. A key this Biller's configuration
// sent is remembered where this Biller's requests go: past its deadline a
// miss is trusted, since any later send of it would still be replayed.
//
// It returns nil when the miss may be trusted, and otherwise the
// ErrSentElsewhere error, with Until, that says where the key went and
// when a lookup settles the claim; nothing may be sent until then.
func (b *Biller) missUntrusted(ctx context.Context, j job, c claim.Claim) *ChargeError {
	endpoint := j.kind.endpoint(b)
	if c.Endpoint == endpoint && c.Credential == b.credential || c.SentAge >= b.cfg.elsewhereAfter() {
		return nil
	}
	searchIn := b.cfg.elsewhereAfter() - c.SentAge
	e := chargeErr(j, ErrSentElsewhere, fmt.Sprintf("it was sent to %s with credential %s, this Biller sends to %s with credential %s; nothing was sent: finish it with the Biller that made it, or in %s any Biller of this scope settles it by looking at Stripe first",
		orUnknown(c.Endpoint), orUnknown(c.Credential), endpoint, b.credential, searchIn.Round(time.Minute)), nil)
	e.Until = time.Now().Add(searchIn)
	b.log.LogAttrs(ctx, slogWarn, "billonce: key was sent with another endpoint or credential; nothing was sent",
		attrs(j, "endpoint", orUnknown(c.Endpoint), "credential", orUnknown(c.Credential), "searchable_in", searchIn.Round(time.Minute))...)
	return e
}

// search finds the payments whose metadata carries key, among charges and
// payment intents alike: a claim's key may have gone to either API. A
// charge that belongs to a payment intent found too is the same payment.
//
// Metadata is anyone's to write: other code holding the account's key can
// copy a claim's metadata onto a payment of its own. A payment counts as
// the key's only when it is what the claim's request would have made: see
// [Biller.ownHits], which every caller applies.
func (b *Biller) search(ctx context.Context, key idemkey.Key) ([]object, error) {
	query := fmt.Sprintf("metadata['%s']:'%s'", MetaKey, key.String())
	var out []object
	if err := b.waitSearch(ctx); err != nil {
		return nil, err
	}
	intents := map[string]bool{}
	pis := b.intents.Search(&stripe.PaymentIntentSearchParams{SearchParams: stripe.SearchParams{Query: query, Context: ctx, Single: true}})
	for pis.Next() {
		pi := pis.PaymentIntent()
		if pi.ID == "" || pi.Status == "" {
			return nil, notAPayment(pis.PaymentIntentSearchResult().LastResponse)
		}
		intents[pi.ID] = true
		out = append(out, intentObject(pi))
	}
	if err := pis.Err(); err != nil {
		return nil, err
	}
	var last *stripe.APIResponse
	if r := pis.PaymentIntentSearchResult(); r != nil {
		last = r.LastResponse
	}
	if !isSearchResult(last) {
		return nil, notASearchResult(last)
	}
	if err := b.waitSearch(ctx); err != nil {
		return nil, err
	}
	chs := b.charges.Search(&stripe.ChargeSearchParams{SearchParams: stripe.SearchParams{Query: query, Context: ctx, Single: true}})
	for chs.Next() {
		ch := chs.Charge()
		if ch.ID == "" || ch.Status == "" {
			return nil, notAPayment(chs.ChargeSearchResult().LastResponse)
		}
		if ch.PaymentIntent != nil && intents[ch.PaymentIntent.ID] {
			continue
		}
		h := object{id: ch.ID, status: string(ch.Status), amount: ch.Amount, currency: string(ch.Currency)}
		if ch.Customer != nil {
			h.customer = ch.Customer.ID
		}
		out = append(out, h)
	}
	if err := chs.Err(); err != nil {
		return nil, err
	}
	last = nil
	if r := chs.ChargeSearchResult(); r != nil {
		last = r.LastResponse
	}
	if !isSearchResult(last) {
		return nil, notASearchResult(last)
	}
	return out, nil
}

// ownHits splits what a search for j's key found into the payments j's
// own request would have made (its customer, amount and currency) and the
// others: another writer's payment that copied the claim's metadata. Only
// an own payment may settle the claim; a foreign one never settles it,
// and never counts as a miss either.
func (b *Biller) ownHits(j job, found []object) (own, foreign []object) {
	for _, h := range found {
		if h.paidBy == 0 && h.customer == j.customer && h.amount == j.price.Amount && strings.EqualFold(h.currency, j.price.Currency) {
			own = append(own, h)
		} else {
			foreign = append(foreign, h)
		}
	}
	return own, foreign
}

// intentObject is what PaymentIntent pi, found or read, says about the
// payment it makes: its customer, the amount it pays (see intentPaid)
// and its currency, which ownHits compares with a claim's.
func intentObject(pi *stripe.PaymentIntent) object {
	h := object{id: pi.ID, status: string(pi.Status), amount: intentPaid(pi), currency: string(pi.Currency)}
	if pi.Customer != nil {
		h.customer = pi.Customer.ID
	}
	return h
}

// foreignReason names the payments a search found with a claim's key that
// its own request cannot have made.
func foreignReason(foreign []object) string {
	ids := make([]string, len(foreign))
	for i, h := range foreign {
		ids[i] = fmt.Sprintf("%s (%s, %d %s)", h.id, h.customer, h.amount, h.currency)
		if h.paidBy > 0 {
			return fmt.Sprintf("%s, made by attempt %d of the same account and period, pays the period, and the claim table has no record of it (rows lost or restored from an older copy): nothing was sent; check it in Stripe, then record this attempt with billonce resolve", ids[i], h.paidBy)
		}
	}
	return "Stripe search found only payments that carry the key's metadata but not its request's customer, amount and currency, made by other code holding the key: " +
		strings.Join(ids, ", ") + "; check in Stripe whether the key's own payment exists, then record it with billonce resolve"
}

// isSearchResult reports whether r is Stripe's answer to a search: an
// object "search_result". Anything else decoded without error (an empty
// object, a list, a web server's JSON) says nothing about what Stripe
// holds, and must never be taken for "no payment", which reopens a key.
func isSearchResult(r *stripe.APIResponse) bool {
	if r == nil {
		return false
	}
	var v struct {
		Object string `json:"object"`
	}
	return json.Unmarshal(r.RawJSON, &v) == nil && v.Object == "search_result"
}

// listed reads a Stripe listing to its end, turning each item, of type T,
// into an object with keep, which says whether the item is one to return
// (ok) and whether it is a Stripe object at all (valid: it has its id and
// status). An item that is not, or an answer that is not a list, stops
// the run (notAPayment, notASearchResult) and is no evidence that the key
// made nothing: no miss is read from it.
func listed[T any](it *stripe.Iter, keep func(T) (o object, ok, valid bool)) ([]object, error) {
	var out []object
	for it.Next() {
		v, _ := it.Current().(T)
		o, ok, valid := keep(v)
		if !valid {
			return nil, notAPayment(lastPage(it.List()))
		}
		if ok {
			out = append(out, o)
		}
	}
	if err := it.Err(); err != nil {
		return nil, err
	}
	if err := notAList(it.List()); err != nil {
		return nil, err
	}
	return out, nil
}

// notAList is the error for a listing whose last answer is not a list:
// whatever answered is not Stripe, and its empty answer says nothing.
func notAList(l stripe.ListContainer) error {
	if last := lastPage(l); !isList(last) {
		return notASearchResult(last)
	}
	return nil
}

// lastPage is Stripe's last answer to a listing, nil when there is none.
func lastPage(l stripe.ListContainer) *stripe.APIResponse {
	switch l := l.(type) {
	case *stripe.RefundList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.CreditNoteList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.TransferList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.PayoutList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.InvoiceList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.InvoiceLineItemList:
		if l != nil {
			return l.LastResponse
		}
	case *stripe.EventList:
		if l != nil {
			return l.LastResponse
		}
	}
	return nil
}

// isList reports whether r is Stripe's answer to a listing: an object
// "list" (see isSearchResult).
func isList(r *stripe.APIResponse) bool {
	if r == nil {
		return false
	}
	var v struct {
		Object string `json:"object"`
	}
	return json.Unmarshal(r.RawJSON, &v) == nil && v.Object == "list"
}

// searchRateLimit is how many search requests per second a Biller makes
// at most, Stripe's limit for its search API being lower than for the
// rest: a large reconciliation then neither draws 429s nor takes more of
// the Biller's RateLimit than this from the charges of a concurrent run.
// A negative Config.RateLimit turns it off too.
const searchRateLimit = 20

// waitSearch waits for a search request's turn.
func (b *Biller) waitSearch(ctx context.Context) error {
	if err := b.searches.Wait(ctx); err != nil {
		return err
	}
	return b.limiter.Wait(ctx)
}
