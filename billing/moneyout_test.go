package billing_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// movementsTo returns the fake's movements of object ("transfer",
// "payout") to or of account.
func movementsTo(e *env, object, account string) []billingtest.Movement {
	var out []billingtest.Movement
	for _, m := range e.srv.Movements(object) {
		if m.Destination == account || m.Object == "payout" && m.Account == account {
			out = append(out, m)
		}
	}
	return out
}

var usd = billing.Price{Amount: 5000, Currency: "usd"}

func TestTransferIsMadeOncePerAccountPeriodAndAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance("", "usd", 100_000)
	ctx := context.Background()
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/transfers"}, billingtest.Fault{Kind: billingtest.FaultCut})
	r, err := e.b.Transfer(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Replayed)
	for range 2 {
		again, err := e.b.Transfer(ctx, acct, period, usd, nil)
		wantHow(t, again, err, billing.AlreadyBilled)
	}
	got := movementsTo(e, "transfer", acct)
	if len(got) != 1 || got[0].ID != r.StripeID || got[0].Amount != 5000 || !strings.Contains(got[0].TransferGroup, period) || got[0].Metadata[billing.MetaKey] != r.Key.String() {
		t.Fatalf("transfers to %s: %+v, want the one transfer %s", acct, got, r.StripeID)
	}
	if b := e.srv.Balance(acct, "usd"); b != 5000 {
		t.Fatalf("account balance %d, want 5000", b)
	}
	// Another period is another transfer; attempt 2 of a paid period is
	// the paid attempt's receipt.
	r2, err := e.b.Transfer(ctx, acct, "2026-10", usd, nil)
	wantHow(t, r2, err, billing.Created)
	paid, err := e.b.Transfer(ctx, acct, period, usd, &billing.MoneyOutOptions{Attempt: 2})
	wantHow(t, paid, err, billing.AlreadyBilled)
	if paid.StripeID != r.StripeID || paid.Attempt != 1 {
		t.Fatalf("attempt 2 of a transferred period: %+v, want attempt 1's receipt", paid)
	}
	if n := len(movementsTo(e, "transfer", acct)); n != 2 {
		t.Fatalf("%d transfers, want 2", n)
	}
}

// A platform balance short of the transfer is a refusal with advice, never
// retried; the next attempt, a person's decision, transfers once the
// balance is there.
func TestTransferRefusedForInsufficientBalanceFailsItsAttempt(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	ctx := context.Background()
	_, err := e.b.Transfer(ctx, acct, period, usd, nil)
	if !errors.Is(err, billing.ErrDeclined) || !strings.Contains(err.Error(), "balance_insufficient") || !strings.Contains(err.Error(), "Attempt") {
		t.Fatalf("transfer without balance: %v, want ErrDeclined with what to do", err)
	}
	posts := 0
	for _, l := range e.srv.Log() {
		if l.Method == "POST" && l.Path == "/v1/transfers" {
			posts++
		}
	}
	if posts != 1 {
		t.Fatalf("%d transfer requests, want 1: a short balance is not retried", posts)
	}
	_, err = e.b.Transfer(ctx, acct, period, usd, nil)
	if !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("attempt 1 again: %v, want its decline", err)
	}
	if _, err := e.b.Transfer(ctx, acct, period, usd, &billing.MoneyOutOptions{Attempt: 3}); !errors.Is(err, billing.ErrInvalid) {
		t.Fatalf("attempt 3 after attempt 1: %v, want ErrInvalid", err)
	}
	e.srv.SetBalance("", "usd", 100_000)
	r, err := e.b.Transfer(ctx, acct, period, usd, &billing.MoneyOutOptions{Attempt: 2})
	wantHow(t, r, err, billing.Created)
	if got := movementsTo(e, "transfer", acct); len(got) != 1 {
		t.Fatalf("transfers %+v, want one", got)
	}
}

// A payout swept again past Stripe's 24 hours after its answer was lost is
// found by listing the account's payouts, never made twice.
func TestPayoutWhoseAnswerWasLostPastTheWindowIsFoundNotMadeAgain(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance(acct, "usd", 100_000)
	ctx := context.Background()
	b := e.biller(func(c *billing.Config) { c.Retry.MaxAttempts = 1 })
	e.srv.FailNext(billingtest.Match{Method: "POST", Path: "/v1/payouts"}, billingtest.Fault{Kind: billingtest.FaultCut})
	e.srv.FailNext(billingtest.Match{Method: "GET", Path: "/v1/payouts"}, billingtest.Fault{}, billingtest.Fault{Kind: billingtest.FaultErrorBefore}) // the listing before the send passes, the one after the lost answer fails
	_, err := b.Payout(ctx, acct, period, usd, nil)
	var ce *billing.ChargeError
	if !errors.Is(err, billing.ErrOutcomeUnknown) || !errors.As(err, &ce) {
		t.Fatalf("payout with its answer lost: %v, want ErrOutcomeUnknown", err)
	}
	e.ageClaim(ce.Key, 25*time.Hour)
	e.srv.Advance(25 * time.Hour)
	r, err := e.b.Payout(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Reconciled)
	if got := movementsTo(e, "payout", acct); len(got) != 1 || got[0].ID != r.StripeID {
		t.Fatalf("payouts %+v, want the one payout %s", got, r.StripeID)
	}
	if bal := e.srv.Balance(acct, "usd"); bal != 95_000 {
		t.Fatalf("balance %d, want 95000: one payout", bal)
	}
}

// A payout is processing until paid; one the bank returns after it was
// paid fails its claim and is reported, and paying out again is the next
// attempt.
func TestPayoutFailingAfterPaidIsReportedAndPaidAgainOnlyByTheNextAttempt(t *testing.T) {
	t.Parallel()
	h := newHookEnv(t, billing.Charges, nil)
	acct := h.srv.CreateAccount()
	h.srv.SetBalance(acct, "usd", 100_000)
	ctx := context.Background()
	r, err := h.b.Payout(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Created)
	if !r.Processing {
		t.Fatalf("receipt %+v, want processing", r)
	}
	h.srv.Advance(10 * 24 * time.Hour)
	h.srv.SettleNow()
	h.deliverAll()
	if c, _ := h.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
		t.Fatalf("claim %s after payout.paid, want succeeded", c.State)
	}
	if err := h.srv.Settle(r.StripeID, "failed", "account_closed"); err != nil {
		t.Fatal(err)
	}
	h.deliverAll()
	c, _ := h.store.Get(ctx, r.Key.String())
	if c.State != claim.StateFailed || c.FailureCode != "account_closed" {
		t.Fatalf("claim %+v after payout.failed, want failed with account_closed", c)
	}
	var reported bool
	for _, ev := range h.observed() {
		reported = reported || ev.Kind == billing.EventSettled && ev.Key == r.Key.String() && errors.Is(ev.Err, billing.ErrDeclined)
	}
	if !reported {
		t.Fatalf("the returned payout was not reported: %+v", h.observed())
	}
	if _, err := h.b.Payout(ctx, acct, period, usd, nil); !errors.Is(err, billing.ErrDeclined) {
		t.Fatalf("attempt 1 again: %v, want its failure", err)
	}
	if n := len(movementsTo(h.env, "payout", acct)); n != 1 {
		t.Fatalf("%d payouts, want 1: nothing pays out again on its own", n)
	}
	r2, err := h.b.Payout(ctx, acct, period, usd, &billing.MoneyOutOptions{Attempt: 2})
	wantHow(t, r2, err, billing.Created)
	if n := len(movementsTo(h.env, "payout", acct)); n != 2 {
		t.Fatalf("%d payouts, want 2", n)
	}
}

func TestMoneyOutOfBadInputIsInvalidAndSendsNothing(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	for _, c := range []struct {
		account, period string
		p               billing.Price
		attempt         int
	}{
		{"", period, usd, 1}, {"cus_1", period, usd, 1}, {acct, "2026-9", usd, 1},
		{acct, period, billing.Price{Amount: 0, Currency: "usd"}, 1}, {acct, period, billing.Price{Amount: 5, Currency: "xyz"}, 1},
		{acct, period, usd, -1},
	} {
		if _, err := e.b.Transfer(context.Background(), c.account, c.period, c.p, &billing.MoneyOutOptions{Attempt: c.attempt}); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("Transfer(%+v): %v, want ErrInvalid", c, err)
		}
		if _, err := e.b.Payout(context.Background(), c.account, c.period, c.p, &billing.MoneyOutOptions{Attempt: c.attempt}); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("Payout(%+v): %v, want ErrInvalid", c, err)
		}
	}
	if n := len(e.srv.Log()); n != 0 {
		t.Fatalf("%d requests sent for bad input", n)
	}
}

// A transfer whose claim row was lost (a claim table restored from an
// older copy), asked for again once Stripe forgot its key, is found by
// the listing before the send and recorded, not made again.
func TestTransferWhoseClaimRowWasLostIsNotMadeAgainPastTheKeyWindow(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance("", "usd", 100_000)
	ctx := context.Background()
	r, err := e.b.Transfer(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Created)
	e.exec("DELETE FROM billonce_claims WHERE key = $1", r.Key.String())
	e.srv.Advance(25 * time.Hour)
	again, err := e.b.Transfer(ctx, acct, period, usd, nil)
	wantHow(t, again, err, billing.Reconciled)
	if got := movementsTo(e, "transfer", acct); len(got) != 1 || again.StripeID != r.StripeID {
		t.Fatalf("transfers %+v, receipt %+v; want the one transfer %s", got, again, r.StripeID)
	}
}

// Without webhooks, Reconcile reads a payout on its way once it has been
// processing for Config.SettleAfter, on its account, and settles it; a
// payout left pending by a crashed sweep is resumed with its key.
func TestReconcileSettlesPayoutsOnTheirAccount(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	acct := e.srv.CreateAccount()
	e.srv.SetBalance(acct, "usd", 100_000)
	ctx := context.Background()
	r, err := e.b.Payout(ctx, acct, period, usd, nil)
	wantHow(t, r, err, billing.Created)
	// A second sweep's payout of the next period crashed after its claim.
	crashed := e.biller(func(c *billing.Config) { c.Claims = crashAfterClaim{wrapStore(e.store)} })
	if _, err := crashed.Payout(ctx, acct, "2026-10", usd, nil); !errors.Is(err, errCrashed) {
		t.Fatalf("crashing sweep: %v", err)
	}
	e.exec("UPDATE billonce_claims SET lease_until = now() - interval '1 second', processing_at = processing_at - interval '2 hours'")
	e.srv.Advance(10 * 24 * time.Hour)
	sum, err := e.b.Reconcile(ctx, nil)
	if err != nil || sum.AlreadyBilled != 1 || sum.Created+sum.Processing != 1 {
		t.Fatalf("Reconcile = %+v, %v; want the paid payout read and the crashed one made", sum.Progress, err)
	}
	if c, _ := e.store.Get(ctx, r.Key.String()); c.State != claim.StateSucceeded {
		t.Fatalf("the paid payout's claim is %s, want succeeded", c.State)
	}
	if got := movementsTo(e, "payout", acct); len(got) != 2 {
		t.Fatalf("payouts %+v, want two: one per period", got)
	}
	sum, err = e.b.Reconcile(ctx, nil)
	if err != nil || len(movementsTo(e, "payout", acct)) != 2 {
		t.Fatalf("Reconcile again = %+v, %v, %d payouts", sum.Progress, err, len(movementsTo(e, "payout", acct)))
	}
}

func TestTransferAndPayoutItemsValidateAndRunOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	a1, a2 := e.srv.CreateAccount(), e.srv.CreateAccount()
	e.srv.SetBalance("", "usd", 100_000)
	e.srv.SetBalance(a2, "usd", 100_000)
	items := []billing.Item{{Account: a1, Transfer: &usd}, {Account: a2, Payout: &usd}}
	for _, it := range items {
		if err := it.Validate(billing.Charges); err != nil {
			t.Fatalf("Validate(%+v): %v", it, err)
		}
	}
	for _, bad := range []billing.Item{{Transfer: &usd}, {Account: a1, Transfer: &usd, Payout: &usd}, {Account: a1, Customer: "cus_1", Payout: &usd},
		{Account: "cus_1", Transfer: &usd}, {Account: a1, Transfer: &billing.Price{Amount: -1, Currency: "usd"}}} {
		if err := bad.Validate(billing.Charges); !errors.Is(err, billing.ErrInvalid) {
			t.Errorf("Validate(%+v): %v, want ErrInvalid", bad, err)
		}
	}
	seq := func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}
	for range 2 {
		if sum, err := e.b.Run(context.Background(), period, seq, nil); err != nil || !sum.Complete() {
			t.Fatalf("Run = %+v, %v", sum, err)
		}
	}
	if n, m := len(movementsTo(e, "transfer", a1)), len(movementsTo(e, "payout", a2)); n != 1 || m != 1 {
		t.Fatalf("%d transfers and %d payouts, want one each", n, m)
	}
}
