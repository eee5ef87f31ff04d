package spendcap

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"
)

// Per says over which span a vault key's cap is counted.
type Per uint8

const (
	// PerRun counts every amount sent with the key, for as long as it
	// lives.
	PerRun Per = iota
	// PerDay counts amounts per UTC day on the proxy's clock.
	PerDay
)

func (p Per) String() string {
	if p == PerDay {
		return "day"
	}
	return "run"
}

// Key is what a vault key allows: its cap, the endpoints it may call, and
// until when.
type Key struct {
	// CapAmount is the most the key may send over Per, in the smallest
	// currency unit, summed over all currencies. It must be positive.
	CapAmount int64
	Per       Per
	// AllowedEndpoints lists "METHOD /path" entries the key may call; a
	// path ending in "*" matches any path with that prefix
	// ("GET /v1/charges/*"), and a segment "*" elsewhere matches one
	// segment ("POST /v1/payment_intents/*/cancel" allows canceling a
	// PaymentIntent, not confirming one). Nil allows every endpoint.
	AllowedEndpoints []string
	// ExpiresAt, if not zero, is when the key stops being accepted, on
	// the proxy's clock.
	ExpiresAt time.Time
}

func (k Key) check() error {
	if k.CapAmount <= 0 {
		return fmt.Errorf("spendcap: Key.CapAmount %d: want a positive amount in the smallest currency unit", k.CapAmount)
	}
	if k.Per > PerDay {
		return fmt.Errorf("spendcap: Key.Per %d: want PerRun or PerDay", k.Per)
	}
	for _, e := range k.AllowedEndpoints {
		m, p, ok := strings.Cut(e, " ")
		if !ok || m == "" || !strings.HasPrefix(p, "/") {
			return fmt.Errorf("spendcap: Key.AllowedEndpoints entry %q: want \"METHOD /path\", such as \"POST /v1/charges\"", e)
		}
	}
	return nil
}

// allows reports whether the key may call method on path.
func (k Key) allows(method, path string) bool {
	if k.AllowedEndpoints == nil {
		return true
	}
	for _, a := range k.AllowedEndpoints {
		m, pat, ok := strings.Cut(a, " ")
		if !ok || !strings.EqualFold(m, method) {
			continue
		}
		if matches(pat, path) {
			return true
		}
	}
	return false
}

// matches reports whether path matches pattern pat of AllowedEndpoints:
// segment by segment, a segment "*" matching any one segment but an empty
// one, "." and "..", and a last segment ending in "*" any path with that
// prefix.
func matches(pat, path string) bool {
	for {
		ps, patRest, pmore := strings.Cut(pat, "/")
		if !pmore {
			if prefix, ok := strings.CutSuffix(ps, "*"); ok {
				return strings.HasPrefix(path, prefix)
			}
			return ps == path
		}
		s, pathRest, more := strings.Cut(path, "/")
		if !more || ps != s && (ps != "*" || s == "" || s == "." || s == "..") {
			return false
		}
		pat, path = patRest, pathRest
	}
}

// KeyID is the name under which a store knows a vault key: a SHA-256 of
// the key, so that neither a store nor its audit rows hold a key in clear.
func KeyID(vaultKey string) string {
	h := sha256.Sum256([]byte(vaultKey))
	return "vk_" + hex.EncodeToString(h[:12])
}

// Store keeps the budgets of vault keys for a [Proxy]: a [*PostgresStore],
// shared by every replica of the proxy, or a [*MemoryStore] in one
// process. Only this package implements it, as the proxy's accounting and
// the store's atomic step are written together. Its methods are called
// concurrently, from every replica that shares it.
type Store interface {
	// admit decides a request: it refuses one whose key is unknown,
	// revoked or expired, or whose endpoint the key does not allow, and,
	// for an Amount above zero whose idempotency key is not counted,
	// reserves the amount if it fits under the cap, in the same atomic
	// step as the check, or refuses it. For an admitted request with an
	// idempotency key it records the forward in the key's idemState.
	admit(ctx context.Context, r admitRequest) (admission, error)
	// settle ends a reservation as o says, and updates the idemState of
	// its idempotency key. Settling one twice, or one the store does not
	// hold, changes nothing.
	settle(ctx context.Context, r reservation, o outcome, now time.Time) error
	// record stores one audit entry.
	record(ctx context.Context, e Entry) error
}

// admitRequest is what a [Store] is asked to admit.
type admitRequest struct {
	KeyID          string // KeyID of the presented vault key
	Method, Path   string
	IdempotencyKey string // "" when the request carries none
	Amount         int64  // what Stripe would move; 0 for none
	Now            time.Time
	// CountFor is how long the upstream surely keeps an idempotency key
	// after it first saw it: its key lifetime less the clock skew.
	CountFor time.Duration
	// Window is how long after a request is forwarded it may still be
	// taken by the upstream as the first of its idempotency key: CountFor
	// plus the longest a forwarded request takes to arrive.
	Window time.Duration
}

// outcome is how a forwarded request ended, for a store's settle. The
// zero value is no outcome: a settlement always says which.
type outcome uint8

const (
	_ outcome = iota
	// outcomeReleased: the upstream refused (4xx) or replayed the request:
	// nothing moved, the reservation is released.
	outcomeReleased
	// outcomeCharged: the upstream executed the request (a 2xx, not a replay).
	// The amount counts as spent, and its idempotency key as counted until
	// the reservation's At plus CountFor: the upstream saw the key no
	// earlier than the reservation, so it remembers the key at least that
	// long.
	outcomeCharged
	// outcomeUnknown: a 5xx, a timeout or a lost answer. The amount counts as
	// spent, and the idempotency key as counted for as long as any
	// request the answer may have replayed is surely remembered (see
	// [idemState]).
	outcomeUnknown
)

// Why a [Proxy] answered a request itself, as [Entry.Refused] says.
const (
	notRefused        = ""
	refusedCap        = "cap"
	refusedEndpoint   = "endpoint"
	refusedRevoked    = "revoked"
	refusedExpired    = "expired"
	refusedUnknownKey = "unknown_key"
	refusedSuspended  = "kill_switch"
	refusedUpstream   = "upstream"
	refusedBadRequest = "bad_request"
	refusedStore      = "store"
)

// admission is a [Store]'s decision on an [admitRequest].
type admission struct {
	Refusal     string      // notRefused when admitted
	Reservation reservation // Amount 0 when nothing was reserved
	// For a cap refusal: the key's cap, what it has spent and reserved,
	// and over which span.
	Cap, Used int64
	Per       Per
	// For an endpoint refusal: the key's allowlist.
	AllowedEndpoints []string
}

// reservation is an amount held against a key's cap while its request is
// in flight.
type reservation struct {
	ID             int64
	KeyID          string
	IdempotencyKey string
	Amount         int64
	At             time.Time // when it was made, on the proxy's clock
	// Since is the earliest the upstream can have first seen the
	// idempotency key, as the store knew at admission (see [idemState]).
	Since    time.Time
	CountFor time.Duration
}

// idemState is what a store knows of one idempotency key, over every vault
// key: the upstream scopes idempotency keys to the secret the proxy holds.
//
// A key is counted until CountedUntil: then the upstream surely still
// remembers the request that moved money under it, so a resend is a
// replay and reserves nothing. CountedUntil is only ever set to a time
// the upstream keeps the key past:
//
//   - after a fresh execution (a 2xx that is not a replay), to the
//     reservation's At plus CountFor: the upstream saw the key no earlier
//     than At;
//   - after an unknown outcome, to Since plus CountFor. The answer may
//     have been a replay of any earlier request with the key that the
//     upstream still remembers, and each of those was forwarded no earlier
//     than Since: Since is the first forward of a chain of forwards each
//     less than Window after the one before, so every forward before the
//     chain is one the upstream has surely forgotten.
type idemState struct {
	ChainStart, LastForward, CountedUntil time.Time
}

// Counted reports whether a resend at now reserves nothing.
func (s idemState) counted(now time.Time) bool { return now.Before(s.CountedUntil) }

// Forwarded returns s after a request with the key is forwarded at now.
func (s idemState) forwarded(now time.Time, window time.Duration) idemState {
	if s.LastForward.IsZero() || !now.Before(s.LastForward.Add(window)) {
		s.ChainStart = now
	}
	if now.After(s.LastForward) {
		s.LastForward = now
	}
	if now.Before(s.ChainStart) {
		s.ChainStart = now
	}
	return s
}

// Settled returns s after r ended with o.
func (s idemState) settled(r reservation, o outcome) idemState {
	var until time.Time
	switch o {
	case outcomeCharged:
		until = r.At.Add(r.CountFor)
	case outcomeUnknown:
		until = r.Since.Add(r.CountFor)
	}
	if until.After(s.CountedUntil) {
		s.CountedUntil = until
	}
	return s
}

// Entry is one audit row: a request the proxy answered. It holds no
// secret and no vault key, only its KeyID.
type Entry struct {
	Time           time.Time `json:"time"`
	KeyID          string    `json:"key_id"`
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Amount         int64     `json:"amount,omitempty"`
	Status         int       `json:"status"`
	// Refused is why the proxy answered itself: "cap" (the cap is
	// spent, or the amount is above it), "endpoint" (not on the key's
	// allowlist), "revoked", "expired", "unknown_key", "kill_switch"
	// (Proxy.Suspend), "bad_request" (an amount it cannot count),
	// "upstream" (Stripe unreachable: the outcome is unknown) or "store"
	// (the budget store unreachable: nothing was sent); "" when Stripe's
	// answer was passed back.
	Refused  string `json:"refused,omitempty"`
	Replayed bool   `json:"replayed,omitempty"`
	// Kept says whether the amount reserved was counted as spent.
	Kept bool `json:"kept,omitempty"`
}

// Usage is what a vault key has spent and holds reserved in its current
// window.
type Usage struct {
	Spent    int64 // settled, plus reservations kept on an unknown outcome
	Reserved int64 // in flight now
}

// ErrUnknownKey is returned by stores' administrative methods for a key
// they do not know.
var ErrUnknownKey = errors.New("spendcap: unknown vault key")

// fits reports whether amount can be reserved under capAmount with spent
// and reserved already used, in arithmetic that cannot wrap. An amount
// above the cap never fits.
func fits(capAmount, spent, reserved, amount int64) bool {
	if amount <= 0 || amount > capAmount || spent < 0 || reserved < 0 {
		return false
	}
	if reserved > math.MaxInt64-spent {
		return false
	}
	return spent+reserved <= capAmount-amount
}

// window returns the start of the span that now's spend belongs to: the
// UTC day for PerDay, the zero time for PerRun.
func window(per Per, now time.Time) time.Time {
	if per != PerDay {
		return time.Time{}
	}
	now = now.UTC()
	return time.Date(now.Year(), now.Month(), now.Day(), 0, 0, 0, 0, time.UTC)
}

// decide is the admission check common to the stores, for a key found in
// the store with its window's spend.
func decide(k Key, revoked bool, spent, reserved int64, counted bool, r admitRequest) admission {
	switch {
	case revoked:
		return admission{Refusal: refusedRevoked}
	case !k.ExpiresAt.IsZero() && !r.Now.Before(k.ExpiresAt):
		return admission{Refusal: refusedExpired}
	case !k.allows(r.Method, r.Path):
		return admission{Refusal: refusedEndpoint, AllowedEndpoints: slices.Clone(k.AllowedEndpoints)}
	case r.Amount <= 0 || counted:
		return admission{}
	case !fits(k.CapAmount, spent, reserved, r.Amount):
		used := spent
		if reserved <= math.MaxInt64-used {
			used += reserved
		}
		return admission{Refusal: refusedCap, Cap: k.CapAmount, Used: used, Per: k.Per}
	}
	return admission{Reservation: reservation{KeyID: r.KeyID, IdempotencyKey: r.IdempotencyKey, Amount: r.Amount, At: r.Now, CountFor: r.CountFor}}
}

// admitted finishes an admission a for r, whose idempotency key's state
// was st: it records the forward and stamps the reservation's Since.
func admitted(a admission, r admitRequest, st idemState) (admission, idemState) {
	if a.Refusal != notRefused || r.IdempotencyKey == "" {
		return a, st
	}
	st = st.forwarded(r.Now, r.Window)
	a.Reservation.Since = st.ChainStart
	return a, st
}
