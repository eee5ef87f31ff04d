package claim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/billonce/billonce/internal/claimengine"
)

// memory is the store NewMemory returns.
type memory struct {
	lease time.Duration

	mu    sync.Mutex
	byKey map[string]*Claim
	live  map[[2]string]string // (customer, period) -> key of its pending, processing or succeeded claim
	// periods maps (customer, period) to the keys of all its claims.
	periods map[[2]string][]string
	// windows maps (customer, meter) to the keys of its usage claims with
	// a window; the live ones among them never overlap but for the same
	// window.
	windows map[[2]string][]string
	// events maps the id of every event applied to its record.
	events map[string]memEvent
}

// memEvent is the record of an applied event.
type memEvent struct {
	result   string
	received time.Time
}

// NewMemory returns an empty claim store in process memory with the same
// behaviour as [Postgres], for unit tests of code built on a [Store]. Only
// cfg.Lease is used. It panics if cfg is invalid (see [NewPostgres]).
//
// It is single-process only: two processes (or two memory stores) know
// nothing of each other's claims, so they would both win. Never use it
// where several replicas bill the same customers.
//
// Its clock is time.Now. Tests that need leases to expire or claims to age
// run inside a testing/synctest bubble and let time pass with time.Sleep.
func NewMemory(cfg Config) Store {
	cfg, err := cfg.withDefaults()
	if err != nil {
		panic(err)
	}
	return &memory{lease: cfg.Lease, byKey: make(map[string]*Claim), live: make(map[[2]string]string), periods: make(map[[2]string][]string), windows: make(map[[2]string][]string)}
}

// Claim claims req. See claimengine.Engine.
func (m *memEngine) Claim(ctx context.Context, req request) (result, error) {
	if err := validateRequest(req); err != nil {
		return result{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	r := m.claimLocked(req, time.Now())
	if r.Conflict != nil {
		return result{}, r.Conflict
	}
	return r, nil
}

// ClaimBatch claims all reqs at once. See claimengine.Engine.
func (m *memEngine) ClaimBatch(ctx context.Context, reqs []request) ([]result, error) {
	if err := validateBatch(reqs); err != nil {
		return nil, err
	}
	if len(reqs) == 0 {
		return nil, nil
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	res := make([]result, len(reqs))
	for i, req := range reqs {
		res[i] = m.claimLocked(req, now)
	}
	return batchResults(res)
}

func (m *memEngine) claimLocked(req request, now time.Time) result {
	c, ok := m.byKey[req.Key]
	if !ok {
		if o := m.overlapping(req); o != nil {
			return answer(req, fromOverlap, m.snapshot(o, now))
		}
		if k, ok := m.live[[2]string{req.Customer, req.Period}]; ok {
			return answer(req, fromPeriod, m.snapshot(m.byKey[k], now))
		}
		if f, from := m.failedBefore(req); f != nil {
			return answer(req, from, m.snapshot(f, now))
		}
		if req.RefundOf != "" {
			p := m.byKey[req.RefundOf]
			if p == nil {
				return result{Outcome: claimengine.Mismatch, Conflict: fmt.Errorf("%w: refund of %q: no claim has this key", ErrInvalid, req.RefundOf)}
			}
			left := p.Amount - m.refunded(req.RefundOf)
			if p.State != StateSucceeded || p.Currency != req.Currency || req.Amount > left {
				r := answer(req, fromRefund, m.snapshot(p, now))
				r.Conflict.(*MismatchError).Have = fmt.Sprint(max(left, 0))
				return r
			}
		}
		c = &Claim{
			Customer: req.Customer, Period: req.Period, Key: req.Key, Amount: req.Amount, Currency: req.Currency,
			State: StatePending, Leases: 1, Owner: req.Owner, LeaseUntil: now.Add(m.lease),
			CreatedAt: now, UpdatedAt: now, FirstSentAt: now,
			Scope: req.Scope, Attempt: req.Attempt, Endpoint: req.Endpoint, Credential: req.Credential,
			Meter: req.Meter, WindowStart: req.WindowStart, WindowEnd: req.WindowEnd, MeterID: req.MeterID,
			RefundOf: req.RefundOf, Account: req.Account,
		}
		m.byKey[req.Key] = c
		cp := [2]string{req.Customer, req.Period}
		m.live[cp] = req.Key
		m.periods[cp] = append(m.periods[cp], req.Key)
		if req.Meter != "" {
			cm := [2]string{req.Customer, req.Meter}
			m.windows[cm] = append(m.windows[cm], req.Key)
		}
		return answer(req, fromInsert, m.snapshot(c, now))
	}
	if compare(req, *c) == nil && c.State == StatePending && (!c.LeaseUntil.After(now) || c.Owner == req.Owner) {
		c.Leases++
		c.Owner = req.Owner
		c.LeaseUntil = now.Add(m.lease)
		c.UpdatedAt = now
		return answer(req, fromTakeover, m.snapshot(c, now))
	}
	return answer(req, fromKey, m.snapshot(c, now))
}

// refunded is what the live refunds of payment claim key add up to. m.mu
// is held.
func (m *memEngine) refunded(key string) int64 {
	var sum int64
	for _, c := range m.byKey {
		if c.RefundOf == key && c.State != StateFailed {
			sum += c.Amount
		}
	}
	return sum
}

// failedBefore returns a failed claim of req's customer and period that
// holds it against req, and where it comes from: one under another scope,
// both scopes known (fromScope), or one of a later attempt of req's scope
// (fromLater); or nil. m.mu is held.
func (m *memEngine) failedBefore(req request) (*Claim, int) {
	for _, k := range m.periods[[2]string{req.Customer, req.Period}] {
		c := m.byKey[k]
		switch {
		case c.State != StateFailed:
		case req.Scope != "" && c.Scope != "" && c.Scope != req.Scope:
			return c, fromScope
		case c.Scope == req.Scope && c.Attempt > req.Attempt:
			return c, fromLater
		}
	}
	return nil, 0
}

// overlapping returns a live claim of req's customer and meter whose
// window overlaps req's and is not the same, or nil; m.mu is held.
func (m *memEngine) overlapping(req request) *Claim {
	if req.Meter == "" {
		return nil
	}
	for _, k := range m.windows[[2]string{req.Customer, req.Meter}] {
		c := m.byKey[k]
		same := c.WindowStart.Equal(req.WindowStart) && c.WindowEnd.Equal(req.WindowEnd)
		if c.State != StateFailed && !same && c.WindowStart.Before(req.WindowEnd) && req.WindowStart.Before(c.WindowEnd) {
			return c
		}
	}
	return nil
}

func (m *memEngine) snapshot(c *Claim, now time.Time) Claim {
	s := *c
	s.Age = now.Sub(c.CreatedAt)
	s.SentAge = now.Sub(c.FirstSentAt)
	return s
}

// Renew extends owner's lease on key. See claimengine.Engine.
func (m *memEngine) Renew(ctx context.Context, key, owner string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if err := held(c, owner); err != nil {
			return err
		}
		c.LeaseUntil = now.Add(m.lease)
		return nil
	})
}

// held returns claimengine.ErrLeaseLost unless owner holds the pending claim c.
func held(c *Claim, owner string) error {
	if c.State != StatePending || c.Owner != owner {
		return fmt.Errorf("%w: claim %q is %s and held by %q, not %q", claimengine.ErrLeaseLost, c.Key, c.State, c.Owner, owner)
	}
	return nil
}

// heldLocked returns key's claim if owner holds it pending; m.mu is held.
func (m *memEngine) heldLocked(key, owner string) (*Claim, error) {
	c, ok := m.byKey[key]
	if !ok {
		return nil, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return c, held(c, owner)
}

// CheckSend reports whether owner may send key now. See claimengine.Engine.
func (m *memEngine) CheckSend(ctx context.Context, key, owner string, window time.Duration) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateWindow(window)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.heldLocked(key, owner)
	if err != nil {
		return err
	}
	if sent := time.Since(c.FirstSentAt); sent >= window {
		return windowClosed(key, sent, window)
	}
	return nil
}

// Reopen starts key's window again. See claimengine.Engine.
func (m *memEngine) Reopen(ctx context.Context, key, owner, endpoint, credential string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateID("endpoint", endpoint), validateID("credential", credential)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if err := held(c, owner); err != nil {
			return err
		}
		c.FirstSentAt, c.ReconciledAt, c.Endpoint, c.Credential, c.Unsent = now, now, endpoint, credential, false
		return nil
	})
}

// Advance records step as done on owner's pending claim. See claimengine.Engine.
func (m *memEngine) Advance(ctx context.Context, key, owner, stripeID, step string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateID("stripe id", stripeID), validateID("step", step)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if c.State != StatePending || c.Owner != owner || !now.Before(c.LeaseUntil) || (c.StripeID != "" && c.StripeID != stripeID) {
			return advanceConflict(*c, owner, stripeID)
		}
		c.Step, c.StripeID, c.FirstSentAt, c.ReconciledAt = step, stripeID, now, time.Time{}
		return nil
	})
}

// Release gives up owner's lease on key, recording lastErr (and stripeID,
// when the claim records none yet). See claimengine.Engine.
func (m *memEngine) Release(ctx context.Context, key, owner, stripeID, lastErr string) error {
	return m.release(key, owner, stripeID, lastErr, false)
}

// ReleaseUnsent releases like Release, and records that the key never
// executed at Stripe. See claimengine.Engine.
func (m *memEngine) ReleaseUnsent(ctx context.Context, key, owner, lastErr string) error {
	return m.release(key, owner, "", lastErr, true)
}

func (m *memEngine) release(key, owner, stripeID, lastErr string, unsent bool) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner), validateOptionalID("stripe id", stripeID), validateText("error", lastErr)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if err := held(c, owner); err != nil {
			return err
		}
		c.Owner, c.LeaseUntil, c.LastError = "", now, lastErr
		c.Unsent = c.Unsent || unsent
		if c.StripeID == "" {
			c.StripeID = stripeID
		}
		return nil
	})
}

// Abandon deletes owner's pending claim on key. See claimengine.Engine.
func (m *memEngine) Abandon(ctx context.Context, key, owner string) error {
	if err := errors.Join(validateID("key", key), validateID("owner", owner)); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, err := m.heldLocked(key, owner)
	if err != nil {
		return err
	}
	if c.Step != "" || c.StripeID != "" {
		return fmt.Errorf("%w: claim %q builds on %q at Stripe (step %q done); it is resumed, never abandoned", claimengine.ErrLeaseLost, key, c.StripeID, c.Step)
	}
	delete(m.byKey, key)
	cp := [2]string{c.Customer, c.Period}
	delete(m.live, cp)
	m.periods[cp] = slices.DeleteFunc(m.periods[cp], func(k string) bool { return k == key })
	if c.Meter != "" {
		cm := [2]string{c.Customer, c.Meter}
		m.windows[cm] = slices.DeleteFunc(m.windows[cm], func(k string) bool { return k == key })
	}
	return nil
}

// Succeed records that key was charged as stripeID. See claimengine.Engine.
func (m *memEngine) Succeed(ctx context.Context, key, stripeID string) error {
	if err := errors.Join(validateID("key", key), validateID("stripe id", stripeID)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if c.State != StatePending {
			return succeedConflict(*c, stripeID)
		}
		c.State, c.StripeID = StateSucceeded, stripeID
		return nil
	})
}

// Fail records that key failed definitively. See claimengine.Engine.
func (m *memEngine) Fail(ctx context.Context, key, stripeID, reason string) error {
	if err := errors.Join(validateID("key", key), validateOptionalID("stripe id", stripeID), validateText("reason", reason)); err != nil {
		return err
	}
	return m.update(key, func(c *Claim, now time.Time) error {
		if c.State != StatePending {
			return failConflict(*c)
		}
		c.State, c.LastError, c.StripeID = StateFailed, reason, cmp.Or(stripeID, c.StripeID)
		delete(m.live, [2]string{c.Customer, c.Period})
		return nil
	})
}

// update applies f to key's claim under the lock; a nil error from f
// stamps UpdatedAt.
func (m *memEngine) update(key string, f func(c *Claim, now time.Time) error) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.byKey[key]
	if !ok {
		return fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	now := time.Now()
	before := *c
	if err := f(c, now); err != nil {
		return err
	}
	if *c != before {
		c.UpdatedAt = now
	}
	return nil
}

// Get returns the claim for key. See claimengine.Engine.
func (m *memory) Get(ctx context.Context, key string) (Claim, error) {
	if err := validateID("key", key); err != nil {
		return Claim{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	c, ok := m.byKey[key]
	if !ok {
		return Claim{}, fmt.Errorf("%w: %q", ErrNotFound, key)
	}
	return (*memEngine)(m).snapshot(c, time.Now()), nil
}

// Stale lists pending claims whose lease has expired, of scope and of
// unknown scope, or all when scope is "". See claimengine.Engine.
func (m *memEngine) Stale(ctx context.Context, scope string) ([]Claim, error) {
	return m.list(func(c *Claim, now time.Time) bool {
		return !c.LeaseUntil.After(now) && (scope == "" || c.Scope == scope || c.Scope == "")
	}), nil
}

func (m *memEngine) list(keep func(*Claim, time.Time) bool) []Claim {
	return m.listState(StatePending, keep, func(c Claim) time.Time { return c.CreatedAt })
}

// listState lists the claims in state that keep keeps, ordered by the time
// by returns, then by key.
func (m *memEngine) listState(state State, keep func(*Claim, time.Time) bool, by func(Claim) time.Time) []Claim {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := time.Now()
	var out []Claim
	for _, c := range m.byKey {
		if c.State == state && keep(c, now) {
			out = append(out, m.snapshot(c, now))
		}
	}
	slices.SortFunc(out, func(a, b Claim) int {
		return cmp.Or(by(a).Compare(by(b)), cmp.Compare(a.Key, b.Key))
	})
	return out
}

var _ Store = (*memory)(nil)
