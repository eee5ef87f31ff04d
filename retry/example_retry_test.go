package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/retry"
)

// A charge whose first two responses are lost is retried with the key it
// started with, and succeeds on the third attempt.
func ExampleDo() {
	key, err := idemkey.For("invoice", "cus_123", "2025-01")
	if err != nil {
		fmt.Println(err)
		return
	}
	policy := retry.Policy{
		InitialInterval: 10 * time.Millisecond,
		MaxInterval:     20 * time.Millisecond,
		Notify: func(e retry.Event) {
			fmt.Printf("attempt %d failed (%v), retrying with the same key\n", e.Attempt, e.Err)
		},
	}
	attempts := 0
	chargeID, err := retry.Do(context.Background(), key, policy, func(ctx context.Context, k idemkey.Key) (string, error) {
		attempts++
		if k != key {
			return "", errors.New("a new key was made")
		}
		if attempts < 3 {
			return "", io.ErrUnexpectedEOF // response lost: outcome unknown
		}
		return "ch_1", nil
	})
	fmt.Println(chargeID, err)
	// Output:
	// attempt 1 failed (unexpected EOF), retrying with the same key
	// attempt 2 failed (unexpected EOF), retrying with the same key
	// ch_1 <nil>
}

// A classifier for an API that asks callers to come back later. Errors it
// does not know fall back to DefaultClassify.
func ExampleAfter() {
	errBusy := errors.New("busy")
	classify := func(err error) retry.Decision {
		if errors.Is(err, errBusy) {
			return retry.After(2 * time.Second)
		}
		return retry.DefaultClassify(err)
	}
	fmt.Println(classify(errBusy))
	fmt.Println(classify(io.ErrUnexpectedEOF))
	fmt.Println(classify(errors.New("card declined")))
	// Output:
	// after 2s
	// again
	// stop
}

// Giving up on an unknown outcome is told apart from a definitive failure.
func ExampleExhaustedError() {
	key, _ := idemkey.For("invoice", "cus_123", "2025-01")
	_, err := retry.Do(context.Background(), key, retry.Policy{MaxAttempts: 1},
		func(ctx context.Context, k idemkey.Key) (string, error) {
			return "", io.ErrUnexpectedEOF
		})
	var ex *retry.ExhaustedError
	if errors.As(err, &ex) {
		fmt.Printf("outcome unknown after %d attempt; resend later with the same key\n", ex.Attempts)
	}
	fmt.Println(err)
	// Output:
	// outcome unknown after 1 attempt; resend later with the same key
	// retry: gave up after 1 attempt (attempt limit 1 reached): unexpected EOF
}
