package riverbilling

import (
	"github.com/riverqueue/river"
	"github.com/riverqueue/river/rivertype"
)

// Job kinds, as stored in River's job table; [ChargeArgs.Kind] and
// [FanOutArgs.Kind] return them.
const (
	kindCharge = "billonce_charge"
	kindFanOut = "billonce_fanout"
)

// DefaultQueue is the River queue billing jobs go to unless their insert
// options say otherwise. Give it a queue of its own in river.Config.Queues:
// a spend-cap or authentication answer pauses the queue of the job that met
// it (see [Worker]), which should stop billing, not other work.
const DefaultQueue = "billonce"

// ChargeArgs asks for one customer (Customer) or several (Customers) to be
// billed for one period. It carries identity only, never an idempotency
// key, a time or a random value: the key is derived by the Biller from
// (scope, customer, period, attempt), so every run of the job, on any
// machine, after any number of retries, sends the same key.
//
// A job of one customer is unique by these arguments while a job for them
// is pending, scheduled, available, running, retryable, completed or
// cancelled (a decline is final); a discarded job does not block a new
// one. A job of several customers is unique only until it is final: one
// completed, cancelled or discarded does not block the same job inserted
// again, which bills nobody twice (see [Worker]). See [FanOut] for what
// happens once River has cleaned jobs away.
//
// Leave Attempt 0 for the first charge: 1 bills the same (same key, same
// claim) but is another job to River's uniqueness.
type ChargeArgs struct {
	Customer string `json:"customer,omitempty"`
	Period   string `json:"period"`
	// Attempt is 0 or 1 for the first charge. 2 and above re-bill after a
	// decline ([billing.Biller.Rebill]): a new key, decided by a person or
	// a dunning process, never by a retry. Re-bills follow one another: a
	// job for attempt n whose attempt n-1 has no claim is cancelled as
	// invalid, without charging.
	Attempt int `json:"attempt,omitempty"`
	// Invoice bills the customer by one Stripe invoice
	// ([billing.Biller.Invoice]) instead of a charge, with the lines the
	// Biller's Config.Invoice returns when the job runs. Invoices are not
	// re-billed through River: a job with Invoice and Attempt 2 or above
	// is cancelled as invalid.
	Invoice bool `json:"invoice,omitempty"`
	// Customers, instead of Customer, bills each of these customers for
	// the first time (attempt 1) in one [billing.Biller.Run], as Run bills
	// an item without a Price or an Invoice: by a charge at Config.Price,
	// or by Config.Invoice's invoice on a Biller with Config.Invoice and no
	// Config.Price. Their claims are made in one statement and their
	// outcomes recorded together, and every customer that Run does not
	// bill gets a job of its own (see [Worker]). At most 1,000; [FanOut]
	// makes such jobs.
	Customers []string `json:"customers,omitempty"`
	// Account, when set, bills the customer (or every customer of
	// Customers) on this connected account (see
	// billing.ChargeOptions.Account): the account is part of the claim and
	// of the key. Invoice jobs are the platform's: a job with Invoice and
	// an Account is cancelled as invalid.
	Account string `json:"account,omitempty"`
}

// Kind is "billonce_charge".
func (ChargeArgs) Kind() string { return kindCharge }

// InsertOpts puts charge jobs in DefaultQueue, with DefaultMaxAttempts,
// unique by their arguments.
func (a ChargeArgs) InsertOpts() river.InsertOpts {
	states := uniqueStates
	if len(a.Customers) > 0 {
		states = batchUniqueStates
	}
	return river.InsertOpts{
		Queue:       DefaultQueue,
		MaxAttempts: DefaultMaxAttempts,
		UniqueOpts:  river.UniqueOpts{ByArgs: true, ByState: states},
	}
}

// uniqueStates are River's default unique states and cancelled.
var uniqueStates = append(rivertype.UniqueOptsByStateDefault(), rivertype.JobStateCancelled)

// batchUniqueStates are the states in which a job of several customers
// blocks the same job: until it is final. A job of them inserted again
// later looks at their claims once more, in one statement, and so settles
// what jobs discarded or cancelled since then left pending.
var batchUniqueStates = []rivertype.JobState{rivertype.JobStateAvailable, rivertype.JobStatePending,
	rivertype.JobStateRetryable, rivertype.JobStateRunning, rivertype.JobStateScheduled}

// FanOutArgs asks for the charge jobs of Period's customers to be inserted
// (see [FanOutWorker] and [FanOut]).
type FanOutArgs struct {
	Period string `json:"period"`
}

// Kind is "billonce_fanout".
func (FanOutArgs) Kind() string { return kindFanOut }

// InsertOpts puts fan-out jobs in DefaultQueue, unique by period. A fan-out
// is safe to run again (it skips customers that have a job), so River's
// default retries apply.
func (FanOutArgs) InsertOpts() river.InsertOpts {
	return river.InsertOpts{
		Queue:      DefaultQueue,
		UniqueOpts: river.UniqueOpts{ByArgs: true},
	}
}
