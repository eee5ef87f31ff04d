package spendcap

import (
	"context"
	"slices"
	"sync"
	"time"
)

// MemoryStore is a [Store] in memory, for tests and a single process. Its
// methods are safe for concurrent use.
type MemoryStore struct {
	mu     sync.Mutex
	keys   map[string]*memKey // by KeyID
	nextID int64
	held   map[int64]reservation
	idem   map[string]idemState
	log    []Entry
}

type memKey struct {
	Key
	revoked  bool
	window   time.Time
	spent    int64
	reserved int64
}

// NewMemoryStore returns an empty store.
func NewMemoryStore() *MemoryStore {
	return &MemoryStore{keys: make(map[string]*memKey), held: make(map[int64]reservation), idem: make(map[string]idemState)}
}

// IssueKey makes vaultKey valid with k, replacing any key of that name
// and its spend.
func (s *MemoryStore) IssueKey(_ context.Context, vaultKey string, k Key) error {
	if err := k.check(); err != nil {
		return err
	}
	k.AllowedEndpoints = slices.Clone(k.AllowedEndpoints)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.keys[KeyID(vaultKey)] = &memKey{Key: k}
	return nil
}

// Revoke makes the key named by id invalid at once: later requests with it
// are refused. Requests already forwarded finish.
func (s *MemoryStore) Revoke(_ context.Context, id string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[id]
	if k == nil {
		return ErrUnknownKey
	}
	k.revoked = true
	return nil
}

// SetCap changes the cap of the key named by id; what it has spent is
// kept.
func (s *MemoryStore) SetCap(_ context.Context, id string, capAmount int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[id]
	if k == nil {
		return ErrUnknownKey
	}
	nk := k.Key
	nk.CapAmount = capAmount
	if err := nk.check(); err != nil {
		return err
	}
	k.Key = nk
	return nil
}

// Usage returns what the key named by id has spent and holds reserved in
// the window of now.
func (s *MemoryStore) Usage(id string, now time.Time) Usage {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[id]
	if k == nil {
		return Usage{}
	}
	k.roll(now)
	return Usage{Spent: k.spent, Reserved: k.reserved}
}

// Entries returns a copy of the audit entries, in the order they were
// recorded.
func (s *MemoryStore) Entries() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.log)
}

// roll starts a new window when now is past the current one. A clock
// stepped back keeps the current window: going back to an earlier one
// would give its cap afresh.
func (k *memKey) roll(now time.Time) {
	if w := window(k.Per, now); w.After(k.window) {
		k.window, k.spent = w, 0
	}
}

// admit implements [Store].
func (s *MemoryStore) admit(_ context.Context, r admitRequest) (admission, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := s.keys[r.KeyID]
	if k == nil {
		return admission{Refusal: refusedUnknownKey}, nil
	}
	k.roll(r.Now)
	st := s.idem[r.IdempotencyKey]
	a := decide(k.Key, k.revoked, k.spent, k.reserved, r.IdempotencyKey != "" && st.counted(r.Now), r)
	a, st = admitted(a, r, st)
	if r.IdempotencyKey != "" && a.Refusal == notRefused {
		s.idem[r.IdempotencyKey] = st
	}
	if a.Refusal == notRefused && a.Reservation.Amount > 0 {
		s.nextID++
		a.Reservation.ID = s.nextID
		k.reserved += a.Reservation.Amount
		s.held[a.Reservation.ID] = a.Reservation
	}
	return a, nil
}

// settle implements [Store].
func (s *MemoryStore) settle(_ context.Context, r reservation, o outcome, now time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, ok := s.held[r.ID]
	if !ok {
		return nil // settled already
	}
	delete(s.held, r.ID)
	k := s.keys[r.KeyID]
	if k == nil {
		return nil
	}
	k.reserved -= r.Amount
	if o != outcomeReleased {
		k.roll(now)
		k.spent += r.Amount
	}
	if r.IdempotencyKey != "" {
		s.idem[r.IdempotencyKey] = s.idem[r.IdempotencyKey].settled(r, o)
	}
	return nil
}

// record implements [Store].
func (s *MemoryStore) record(_ context.Context, e Entry) error {
	s.mu.Lock()
	s.log = append(s.log, e)
	s.mu.Unlock()
	return nil
}
