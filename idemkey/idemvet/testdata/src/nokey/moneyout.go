package nokey

import (
	"context"

	stripe "github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/creditnote"
	"github.com/stripe/stripe-go/v79/payout"
	"github.com/stripe/stripe-go/v79/refund"
	"github.com/stripe/stripe-go/v79/transfer"
)

// Money going out: a refund, credit note, transfer or payout retried with
// a new key is money gone twice.

func refundWithoutKey(ctx context.Context, ch string) error {
	_, err := refund.New(&stripe.RefundParams{Charge: stripe.String(ch)}) // want `refund.New sends a Stripe write without an idempotency key: .* makes a second refund`
	return err
}

func creditNoteWithoutKey(ctx context.Context, in string) error {
	_, err := creditnote.Client{}.New(&stripe.CreditNoteParams{Invoice: stripe.String(in)}) // want `creditnote.Client\{\}.New sends a Stripe write without an idempotency key`
	return err
}

func transferWithoutKey(ctx context.Context, acct string) error {
	_, err := transfer.New(&stripe.TransferParams{Destination: stripe.String(acct)}) // want `transfer.New sends a Stripe write without an idempotency key`
	return err
}

func payoutWithoutKey(ctx context.Context) error {
	_, err := payout.New(&stripe.PayoutParams{Amount: stripe.Int64(100)}) // want `payout.New sends a Stripe write without an idempotency key`
	return err
}

func payoutWithKey(ctx context.Context, key string) error {
	p := &stripe.PayoutParams{Amount: stripe.Int64(100)}
	p.SetIdempotencyKey(key)
	_, err := payout.New(p)
	return err
}
