package billing_test

// A caller that gives up at any step charges at most once, and the next
// call finishes the work. The oracle is the fake Stripe's ledger.

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
)

// A caller that gives up at every step of Charge and of Run, before and
// after each claim-store call and after Stripe answered: no call that
// returned without an error left the customer unbilled, and the next runs
// (at once, and a day later) bill each customer exactly once. A step past
// the last one the flow takes ends the loop.
func TestCancelAtEveryStepChargesAtMostOnce(t *testing.T) {
	t.Parallel()
	type flow struct {
		name string
		run  func(ctx context.Context, b *billing.Biller, id string) error
	}
	flows := []flow{
		{"charge", func(ctx context.Context, b *billing.Biller, id string) error {
			_, err := b.Charge(ctx, id, period, nil)
			return err
		}},
		{"batched run", func(ctx context.Context, b *billing.Biller, id string) error {
			s, err := b.Run(ctx, period, billing.Customers(id), nil)
			if err == nil && !s.Complete() {
				err = errors.New("run not complete")
			}
			return err
		}},
		{"run", func(ctx context.Context, b *billing.Biller, id string) error {
			s, err := b.Run(ctx, period, billing.Customers(id), nil)
			if err == nil && !s.Complete() {
				err = errors.New("run not complete")
			}
			return err
		}},
	}
	e := newEnv(t)
	for _, f := range flows {
		wheres := []string{"store-before", "store-after", "http"}
		if f.name == "batched run" {
			wheres = append(wheres, "record-fails")
		}
		for _, where := range wheres {
			for at := 1; at <= 12; at++ {
				id := "cus_" + strings.ReplaceAll(f.name, " ", "_") + "_" + where + "_" + string(rune('a'+at))
				ctx, cancel := context.WithCancel(context.Background())
				cs := &cancelStore{testStore: wrapStore(e.store), at: at, before: where == "store-before", cancel: cancel}
				var store claim.Store = cs
				var bs *batchCancelStore
				if f.name == "batched run" {
					bs = &batchCancelStore{cancelStore: cs, pg: e.store}
					if where == "record-fails" {
						bs.failAt = at
					}
					store = bs
				}
				ct := &cancelTransport{at: at, cancel: cancel}
				switch where {
				case "http":
					cs.at = -1
				case "record-fails":
					cs.at, ct.at = -1, -1
				default:
					ct.at = -1
				}
				b := e.biller(func(c *billing.Config) {
					c.Claims = store
					c.HTTPClient = &http.Client{Transport: ct}
				})
				err := f.run(ctx, b, id)
				cancel()
				if err == nil && e.count(id) != 1 {
					t.Errorf("%s: reported success with %d charges", id, e.count(id))
				}
				if err == nil && where == "record-fails" && bs.failed() {
					t.Errorf("%s: a run whose success was not recorded returned no error", id)
				}
				// The next run, once the first one's lease is over (a
				// runner whose database went away cannot release).
				e.exec(`UPDATE billonce_claims SET lease_until = now() WHERE customer = $1 AND state = 'pending'`, id)
				if err := f.run(context.Background(), e.biller(), id); err != nil {
					t.Errorf("%s: next run: %v", id, err)
				}
				billingtest.RequireChargedOnce(t, e.srv, id, period)
				cs.mu.Lock()
				calls := cs.calls
				cs.mu.Unlock()
				ct.mu.Lock()
				reqs := ct.n
				ct.mu.Unlock()
				if where == "record-fails" {
					bs.mu.Lock()
					calls = bs.dones
					bs.mu.Unlock()
				}
				if (where == "http" && at > reqs) || (where != "http" && at > calls) {
					t.Logf("%s %s: %d steps", f.name, where, at-1)
					break
				}
			}
		}
	}
	// A day later, every customer again: nothing more is charged.
	e.srv.Advance(25 * time.Hour)
	e.exec(`UPDATE billonce_claims SET created_at = created_at - interval '25 hours', first_sent_at = first_sent_at - interval '25 hours', lease_until = now() - interval '1 second'`)
	var ids []string
	for _, p := range e.srv.Payments() {
		ids = append(ids, p.Customer)
	}
	if _, err := e.biller().Run(context.Background(), period, billing.Customers(ids...), nil); err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		billingtest.RequireChargedOnce(t, e.srv, id, period)
	}
}
