package riverbilling

import (
	"context"
	"fmt"
	"time"

	"github.com/riverqueue/river"

	"github.com/billonce/billonce/billing"
)

const kindMoneyOut = "billonce_money_out"

// MoneyOutArgs asks for money to go out once: a refund of the payment
// that billed Customer for Period (Refund, its refund id), a transfer to
// connected account Account (Transfer), or a payout from that account's
// balance to its bank (Payout). Exactly one of the three is set.
//
// Like [ChargeArgs] it carries identity only, never an idempotency key, a
// time or a random value: the Biller derives the key from the payment's
// claim and the refund id, or from (scope, account, period, attempt), the
// same on every run. Amount (and a transfer's or payout's Currency) is
// the caller's, since no Biller configuration prices a refund or a payout;
// it is recorded on the claim, and the same refund id, or the same
// account, period and attempt, with another amount is cancelled as a
// mismatch, never sent again. Jobs are unique by these arguments in the
// states of a charge job's, cancelled included: while a job is kept, the
// same job inserted again is a duplicate.
type MoneyOutArgs struct {
	Period string `json:"period"`
	// Refund is the refund id ([billing.Biller.Refund]'s refundID): the
	// caller's name for the refund, such as an RMA or an outage's credit
	// number. With it, Customer names the customer whose payment of
	// Period is refunded; the refund goes to that payment's account, and
	// is in its currency: a refund job takes no Account, Currency or
	// Attempt (refunding again is a new refund id).
	Refund   string `json:"refund,omitempty"`
	Customer string `json:"customer,omitempty"`
	// Transfer or Payout makes the job a transfer to Account
	// ([billing.Biller.Transfer]) or a payout made on Account, from its
	// balance ([billing.Biller.Payout]).
	Transfer bool   `json:"transfer,omitempty"`
	Payout   bool   `json:"payout,omitempty"`
	Account  string `json:"account,omitempty"`
	// Amount is in the currency's smallest unit (cents for usd).
	Amount int64 `json:"amount"`
	// Currency is a transfer's or payout's ("usd"); a refund's is its
	// payment's.
	Currency string `json:"currency,omitempty"`
	// Attempt numbers a transfer's or payout's attempts
	// (billing.MoneyOutOptions.Attempt): 0 or 1 for the first; the next
	// one, after the one before it failed, is a person's decision.
	Attempt int `json:"attempt,omitempty"`
}

// Kind is "billonce_money_out".
func (MoneyOutArgs) Kind() string { return kindMoneyOut }

// InsertOpts puts money-out jobs in DefaultQueue, with DefaultMaxAttempts,
// unique by their arguments, as charge jobs of one customer are.
func (MoneyOutArgs) InsertOpts() river.InsertOpts {
	return ChargeArgs{}.InsertOpts()
}

// what names the job's movement, or says what is wrong with its
// arguments.
func (a MoneyOutArgs) what() (string, error) {
	n := 0
	for _, set := range []bool{a.Refund != "", a.Transfer, a.Payout} {
		if set {
			n++
		}
	}
	switch {
	case n != 1:
		return "money-out", fmt.Errorf("%w: a money-out job for period %s names %d of Refund, Transfer and Payout; set exactly one", billing.ErrInvalid, a.Period, n)
	case a.Refund != "" && (a.Account != "" || a.Currency != "" || a.Attempt > 1):
		return "refund", fmt.Errorf("%w: refund %s of customer %s, period %s: a refund job takes no Account, Currency or Attempt above 1; it goes to its payment's account, in its currency, and refunding again is a new refund id", billing.ErrInvalid, a.Refund, a.Customer, a.Period)
	case a.Refund != "":
		return "refund", nil
	case a.Customer != "":
		return "money-out", fmt.Errorf("%w: a transfer or payout job for period %s names customer %s: it names the connected Account, and no Customer", billing.ErrInvalid, a.Period, a.Customer)
	case a.Transfer:
		return "transfer", nil
	}
	return "payout", nil
}

// MoneyOutWorker is the River worker of [MoneyOutArgs]: it makes one
// refund, transfer or payout through a [billing.Biller] and tells River
// what became of it, as [Worker] does for a charge, with the same
// [WorkerConfig] and retry schedule:
//
//   - Made, now or before, or found made (Stripe's replay, a listing of
//     the payment's refunds or the account's transfers or payouts), or
//     processing (a pending refund, a payout pending or in transit: its
//     outcome arrives by webhook or Reconcile, never by another send):
//     the job completes. A transfer's or payout's next attempt that
//     finds an earlier one still processing waits (is snoozed) for its
//     outcome, as a re-bill job does: it pays if that attempt fails,
//     and completes without paying if it succeeds.
//   - Refused for this movement alone: a balance short of it
//     (balance_insufficient), a disputed payment (charge_disputed), a
//     payment Stripe holds as refunded: the job is cancelled with the
//     reason and never retried. So is a refund of more than is left of
//     its payment, of a period not paid, another amount under the same
//     identity, or arguments that name no movement, before anything is
//     sent. Paying again is a new job: the next Attempt, or a new refund
//     id.
//   - Another runner holds the claim, or an earlier attempt of a
//     transfer or payout is still being sent or pending: the job is
//     snoozed until its lease ends.
//   - Outcome unknown: the job fails and River retries it after
//     [MoneyOutWorker.NextRetry] with the same key; past the key's
//     deadline the movement is found by listing, not sent again.
//   - A spend cap, a revoked key, Stripe refusing the API key or the
//     request itself: the job is cancelled and its queue paused.
type MoneyOutWorker struct {
	river.WorkerDefaults[MoneyOutArgs]
	runner
}

// NewMoneyOutWorker returns a MoneyOutWorker that moves money through b.
func NewMoneyOutWorker(b *billing.Biller, cfg WorkerConfig) (*MoneyOutWorker, error) {
	r, err := newRunner("NewMoneyOutWorker", b, cfg)
	if err != nil {
		return nil, err
	}
	return &MoneyOutWorker{runner: r}, nil
}

// Timeout is WorkerConfig.JobTimeout.
func (w *MoneyOutWorker) Timeout(*river.Job[MoneyOutArgs]) time.Duration { return w.cfg.JobTimeout }

// NextRetry schedules the retry after a run whose outcome was unknown, as
// [Worker.NextRetry] does.
func (w *MoneyOutWorker) NextRetry(job *river.Job[MoneyOutArgs]) time.Time {
	return time.Now().Add(w.retryWait(job.Attempt))
}

// Work makes the job's refund, transfer or payout.
func (w *MoneyOutWorker) Work(ctx context.Context, job *river.Job[MoneyOutArgs]) error {
	a := job.Args
	what, err := a.what()
	if err == nil {
		p, opts := billing.Price{Amount: a.Amount, Currency: a.Currency}, &billing.MoneyOutOptions{Attempt: a.Attempt}
		var r billing.Receipt
		switch what {
		case "refund":
			_, err = w.biller.Refund(ctx, a.Customer, a.Period, a.Refund, a.Amount)
		case "transfer":
			r, err = w.biller.Transfer(ctx, a.Account, a.Period, p, opts)
		default:
			r, err = w.biller.Payout(ctx, a.Account, a.Period, p, opts)
		}
		if snoozed := w.waitEarlier(r, err, opts.Attempt); snoozed != nil {
			return snoozed
		}
	}
	return w.finish(ctx, job.JobRow, err, what, "period", a.Period, "customer", a.Customer, "refund", a.Refund,
		"account", a.Account, "amount", a.Amount, "attempt", a.Attempt)
}
