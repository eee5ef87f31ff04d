package billingtest

import (
	"fmt"
	"hash/fnv"
	"math"
	"sort"
	"time"
)

// FaultKind names a failure the server produces on purpose. The zero value
// means the request is served normally.
type FaultKind string

// The faults the server can inject. "Commit" means the object is created, the
// ledger counts it and, for a request with an Idempotency-Key, the response is
// stored for replay.
const (
	faultNone FaultKind = ""

	// FaultDrop commits, then closes the connection without writing a
	// single byte. On a reused keep-alive connection net/http resends a POST
	// that carries an Idempotency-Key once by itself, so the client may see
	// the replay instead of an error; use FaultCut when the client must see
	// the failure.
	FaultDrop FaultKind = "drop"

	// FaultCut commits, then sends the status line, the headers and half of
	// the body, and closes the connection. The client always sees an error
	// (unexpected EOF) and never the object.
	FaultCut FaultKind = "cut"

	// FaultSlow commits at once but keeps the request executing for
	// Fault.Delay (or until Fault.Release is closed) before the response is
	// stored and written. Meanwhile a request with the same key answers 409.
	FaultSlow FaultKind = "slow"

	// FaultErrorBefore answers 500 api_error without executing or storing
	// anything (Stripe-Should-Retry: true).
	FaultErrorBefore FaultKind = "error_before"

	// FaultErrorAfter commits, then answers 500 api_error and stores that
	// 500 as the key's result: every replay within the key's lifetime
	// answers the same 500 (Stripe-Should-Retry: false).
	FaultErrorAfter FaultKind = "error_after"

	// FaultInFlight answers 409 idempotency_key_in_use as if another request
	// with the same key were executing. Nothing is executed or stored.
	FaultInFlight FaultKind = "in_flight"

	// FaultLockTimeout answers 429 lock_timeout (Stripe-Should-Retry: true).
	// Nothing is executed or stored.
	FaultLockTimeout FaultKind = "lock_timeout"

	// FaultRateLimit answers 429 rate_limit, as the rate limiter does, before
	// the idempotency layer. Nothing is executed or stored.
	FaultRateLimit FaultKind = "rate_limit"

	// FaultDecline declines the payment: the object is created in a failed
	// state, not counted as paid, and the 402 card_error is stored for replay.
	FaultDecline FaultKind = "decline"

	// FaultRefuse answers Fault.Status with Fault.Refusal as Stripe's error
	// object, before the idempotency layer: nothing is executed or stored,
	// as Stripe stores nothing for a request it rejects before executing
	// it. Use it for refusals the fake never gives by itself: an unknown
	// parameter, an expired key, a key in the wrong mode, a customer or
	// payment method Stripe does not know (the fake takes any customer not
	// seen on another account).
	FaultRefuse FaultKind = "refuse"
)

// faultKinds lists every kind in a fixed order, so seeded draws are stable.
var faultKinds = []FaultKind{
	FaultDrop, FaultCut, FaultSlow, FaultErrorBefore, FaultErrorAfter,
	FaultInFlight, FaultLockTimeout, FaultRateLimit, FaultDecline, FaultRefuse,
}

func (k FaultKind) valid() bool {
	if k == faultNone {
		return true
	}
	for _, v := range faultKinds {
		if v == k {
			return true
		}
	}
	return false
}

// Fault is what the server does to one request.
type Fault struct {
	Kind FaultKind

	// Delay is how long FaultSlow holds the request. Defaults to
	// DefaultSlowDelay. Measured on the wall clock, not the server's clock.
	Delay time.Duration

	// Release, if not nil, makes FaultSlow hold the request until the
	// channel is closed instead of for Delay. Tests use it to keep a key
	// in flight for exactly as long as they need.
	Release <-chan struct{}

	// DeclineCode is the decline_code of FaultDecline. Defaults to
	// "generic_decline".
	DeclineCode string

	// Status is the HTTP status of FaultRefuse. Defaults to 400.
	Status int

	// Refusal is the error object FaultRefuse answers with.
	Refusal Refusal
}

// Refusal is a Stripe error object, for [FaultRefuse]. Type defaults to
// "invalid_request_error" and Message to a sentence naming Code.
type Refusal struct {
	Type        string
	Code        string
	DeclineCode string
	Param       string
	Message     string
}

func (r Refusal) apiErr() apiErr {
	e := apiErr{Type: orDefault(r.Type, "invalid_request_error"), Code: r.Code, DeclineCode: r.DeclineCode,
		Param: r.Param, Message: r.Message}
	if e.Message == "" {
		e.Message = fmt.Sprintf("Request refused (%s, injected by billingtest).", orDefault(r.Code, e.Type))
	}
	return e
}

// Request describes an incoming API request to a fault script.
type Request struct {
	Method         string
	Path           string
	IdempotencyKey string // "" when the request carries none
	Customer       string // the customer parameter, if any
	Account        string // the Stripe-Account header, "" for the platform

	// Attempt counts the requests seen with this API key, account and
	// idempotency key, starting at 1. Requests without a key count per
	// method and path.
	Attempt int

	// drawID identifies the request for RandomFaults: the API key, the
	// idempotency key and a connected account, or the method and path. A pointer, so that printing
	// a Request never shows the API key.
	drawID *string
}

// RandomFaults returns a fault script (for Config.Script or
// [Server.SetScript]) that gives each request a fault drawn at random:
// rates[kind] is the probability of that kind, and the rates add up to at
// most 1. The draw is a pure function of the seed, the request's API and
// idempotency keys (and connected account) and its attempt number, so the same seed gives the same
// faults for the same keys however requests interleave, in every process.
// An error says which rate is invalid.
//
// To combine it with faults of your own, call it from your script when
// yours has none to give.
func RandomFaults(seed int64, rates map[FaultKind]float64) (func(Request) Fault, error) {
	t, err := newRateTable(seed, rates)
	if err != nil {
		return nil, err
	}
	return func(r Request) Fault {
		id := r.Method + " " + r.Path
		if r.drawID != nil {
			id = *r.drawID
		}
		return Fault{Kind: t.draw(id, r.Attempt)}
	}, nil
}

// Match selects requests for [Server.FailNext]. Empty fields match anything.
type Match struct {
	Method         string
	Path           string
	Customer       string
	IdempotencyKey string
	Account        string // a connected account; the platform's requests have none to match
}

func (m Match) matches(r *Request) bool {
	return (m.Method == "" || m.Method == r.Method) &&
		(m.Path == "" || m.Path == r.Path) &&
		(m.Customer == "" || m.Customer == r.Customer) &&
		(m.IdempotencyKey == "" || m.IdempotencyKey == r.IdempotencyKey) &&
		(m.Account == "" || m.Account == r.Account)
}

type queued struct {
	match Match
	fault Fault
}

// rateTable turns per-kind probabilities into a deterministic draw.
type rateTable struct {
	seed  uint64
	kinds []FaultKind
	cum   []float64 // cumulative probabilities, same order as kinds
}

func newRateTable(seed int64, rates map[FaultKind]float64) (rateTable, error) {
	t := rateTable{seed: uint64(seed)}
	sum := 0.0
	keys := make([]string, 0, len(rates))
	for k := range rates {
		keys = append(keys, string(k))
	}
	sort.Strings(keys)
	for _, ks := range keys {
		k := FaultKind(ks)
		p := rates[k]
		if k == faultNone || !k.valid() {
			return rateTable{}, fmt.Errorf("billingtest: unknown fault kind %q in rates; use one of %v", k, faultKinds)
		}
		if math.IsNaN(p) || p < 0 || p > 1 {
			return rateTable{}, fmt.Errorf("billingtest: rate for %q is %v; want a probability between 0 and 1", k, p)
		}
		if p == 0 {
			continue
		}
		sum += p
		t.kinds = append(t.kinds, k)
		t.cum = append(t.cum, sum)
	}
	if sum > 1+1e-9 {
		return rateTable{}, fmt.Errorf("billingtest: fault rates add up to %v; want at most 1", sum)
	}
	return t, nil
}

// draw picks a fault as a pure function of the seed and the request's
// identity, so the same sequence of keys gets the same faults however
// requests interleave.
func (t rateTable) draw(id string, attempt int) FaultKind {
	if len(t.kinds) == 0 {
		return faultNone
	}
	h := fnv.New64a()
	var b [16]byte
	for i := 0; i < 8; i++ {
		b[i] = byte(t.seed >> (8 * i))
		b[8+i] = byte(uint64(attempt) >> (8 * i))
	}
	h.Write(b[:])
	h.Write([]byte(id))
	x := h.Sum64()
	// splitmix64 finalizer spreads FNV's low-entropy high bits.
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	u := float64(x>>11) / (1 << 53)
	for i, c := range t.cum {
		if u < c {
			return t.kinds[i]
		}
	}
	return faultNone
}
