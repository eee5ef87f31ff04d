package billingtest

import (
	"maps"
	"time"
)

// Payment is one charge or payment intent the server created. Declined
// payments are recorded too, with Paid false.
type Payment struct {
	ID             string            `json:"id"`
	Object         string            `json:"object"`            // "charge" or "payment_intent"
	Account        string            `json:"account,omitempty"` // the connected account it was made on; "" for the platform
	Customer       string            `json:"customer"`
	Amount         int64             `json:"amount"`
	Currency       string            `json:"currency"`
	Description    string            `json:"description,omitempty"`
	Metadata       map[string]string `json:"metadata"`
	PaymentMethod  string            `json:"payment_method,omitempty"`
	Status         string            `json:"status"`
	Paid           bool              `json:"paid"` // money moved: a succeeded charge or payment intent
	DeclineCode    string            `json:"decline_code,omitempty"`
	Period         string            `json:"period,omitempty"` // Metadata[Config.PeriodKey]
	IdempotencyKey string            `json:"idempotency_key,omitempty"`
	Created        time.Time         `json:"created"` // on the server's clock
	// FailureCode is why an asynchronous payment failed (or will fail)
	// when it settles; AmountRefunded what Refund gave back.
	FailureCode    string `json:"failure_code,omitempty"`
	AmountRefunded int64  `json:"amount_refunded,omitempty"`

	settleAt time.Time // when an asynchronous payment settles; zero once settled
	received int64     // what a partial capture took of Amount; 0 for all of it
	disputed bool      // a dispute is open on it: Stripe refunds none of it
}

func (p Payment) clone() Payment {
	p.Metadata = maps.Clone(p.Metadata)
	return p
}

// Entry is one line of the request log.
type Entry struct {
	Time           time.Time `json:"time"` // on the server's clock
	RequestID      string    `json:"request_id"`
	Method         string    `json:"method"`
	Path           string    `json:"path"`
	Account        string    `json:"account,omitempty"` // the Stripe-Account header, "" for the platform
	IdempotencyKey string    `json:"idempotency_key,omitempty"`
	Customer       string    `json:"customer,omitempty"`
	Status         int       `json:"status"` // 0 when the connection was dropped without a status
	Replayed       bool      `json:"replayed,omitempty"`
	Fault          FaultKind `json:"fault,omitempty"`
	ObjectID       string    `json:"object_id,omitempty"` // the object created or replayed, if any
}

// Stats are running totals, cheap to read while the server runs.
type Stats struct {
	Requests          int64               `json:"requests"`           // authenticated requests to served endpoints
	Created           int64               `json:"created"`            // objects created, declined ones included
	Paid              int64               `json:"paid"`               // objects that moved money
	Replays           int64               `json:"replays"`            // answers with Idempotent-Replayed: true
	InUse             int64               `json:"in_use"`             // 409 idempotency_key_in_use, real or injected
	IdempotencyErrors int64               `json:"idempotency_errors"` // 400 idempotency_error
	RateLimited       int64               `json:"rate_limited"`       // 429 rate_limit, real or injected
	Faults            map[FaultKind]int64 `json:"faults"`             // injected faults by kind
}
