package claim_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// CheckSendSucceed answers each check as CheckSend and each success as
// Succeed would, in one round trip: a held claim inside its window may be
// sent, one past its window, held by another owner, settled or missing may
// not; a success is written once, repeated with the same id is fine, and a
// different id or a failed claim is a conflict.
func TestCheckSendSucceed(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, pool := newPostgres(t, claim.Config{Lease: lease})
	const window = 23 * time.Hour
	for i := range 8 {
		mustClaim(t, p, req(fmt.Sprintf("cus_%d", i), fmt.Sprintf("k%d", i), "a"), claimengine.Won)
	}
	// k1 is past its window on the database clock.
	if _, err := pool.Exec(ctx, `UPDATE billonce_claims SET first_sent_at = now() - interval '23 hours 1 second' WHERE key = 'k1'`); err != nil {
		t.Fatal(err)
	}
	if err := p.Succeed(ctx, "k2", "ch_2"); err != nil { // settled before
		t.Fatal(err)
	}
	if err := p.Fail(ctx, "k6", "", "card_declined"); err != nil {
		t.Fatal(err)
	}

	checks := []claimengine.SendCheck{
		{Key: "k0", Owner: "a"},      // held, in its window
		{Key: "k1", Owner: "a"},      // past its window
		{Key: "k2", Owner: "a"},      // succeeded
		{Key: "k3", Owner: "b"},      // held by a
		{Key: "nope", Owner: "a"},    // no claim
		{Key: "", Owner: "a"},        // invalid
		{Key: "k7", Owner: "a"},      // held, in its window
		{Key: "k0", Owner: "a"},      // asked twice
		{Key: "k5", Owner: "a\x00b"}, // invalid
	}
	done := []claimengine.Success{
		{Key: "k4", StripeID: "ch_4"}, // pending: written
		{Key: "k2", StripeID: "ch_2"}, // again, same id
		{Key: "k2", StripeID: "ch_x"}, // another id
		{Key: "k6", StripeID: "ch_6"}, // failed
		{Key: "k5", StripeID: "ch_5"}, // pending: written
		{Key: "none", StripeID: "ch_9"},
	}
	wantCheck := []error{nil, claimengine.ErrWindowClosed, claimengine.ErrLeaseLost, claimengine.ErrLeaseLost, claim.ErrNotFound, claim.ErrInvalid, nil, nil, claim.ErrInvalid}
	wantDone := []error{nil, nil, claimengine.ErrConflict, claimengine.ErrConflict, nil, claim.ErrNotFound}

	// Valid arguments take the batch; one bad argument takes the calls
	// one by one. Both answer alike.
	for _, valid := range []bool{true, false} {
		cs, cw, ds, dw := checks, wantCheck, done, wantDone
		if valid {
			cs, cw = []claimengine.SendCheck{checks[0], checks[1], checks[2], checks[3], checks[4], checks[6], checks[7]},
				[]error{nil, claimengine.ErrWindowClosed, claimengine.ErrLeaseLost, claimengine.ErrLeaseLost, claim.ErrNotFound, nil, nil}
		}
		checkErrs, doneErrs := p.CheckSendSucceed(ctx, window, cs, ds)
		for i, err := range checkErrs {
			if !errors.Is(err, cw[i]) || (cw[i] == nil) != (err == nil) {
				t.Errorf("valid=%v: check %d (%q by %q) = %v; want %v", valid, i, cs[i].Key, cs[i].Owner, err, cw[i])
			}
		}
		for i, err := range doneErrs {
			if !errors.Is(err, dw[i]) || (dw[i] == nil) != (err == nil) {
				t.Errorf("valid=%v: success %d (%q as %q) = %v; want %v", valid, i, ds[i].Key, ds[i].StripeID, err, dw[i])
			}
		}
	}
	for key, id := range map[string]string{"k4": "ch_4", "k5": "ch_5", "k2": "ch_2"} {
		c, err := p.Get(ctx, key)
		if err != nil || c.State != claim.StateSucceeded || c.StripeID != id {
			t.Errorf("claim %s = %+v, %v; want succeeded as %s", key, c, err, id)
		}
	}
	if c, _ := p.Get(ctx, "k6"); c.State != claim.StateFailed {
		t.Errorf("failed claim k6 became %s", c.State)
	}
	// Nothing to do is no round trip and no error.
	if c, d := p.CheckSendSucceed(ctx, window, nil, nil); len(c)+len(d) != 0 {
		t.Errorf("empty call = %v, %v", c, d)
	}
}
