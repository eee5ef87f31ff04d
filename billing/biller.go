package billing

import (
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"time"
	"unicode"

	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"
	"github.com/stripe/stripe-go/v79/paymentintent"
	"golang.org/x/time/rate"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/internal/redact"
	"github.com/billonce/billonce/retry"
)

// API chooses which Stripe API creates the money movement. The zero API
// is Charges, the default.
type API string

const (
	// Charges creates a charge with POST /v1/charges against the customer's
	// default source. It is the older API; use it when your customers were
	// set up with sources or cards on file for Charges.
	Charges API = "charges"
	// PaymentIntents creates and confirms an off-session PaymentIntent with
	// POST /v1/payment_intents (confirm=true, off_session=true) using a saved
	// payment method. It is Stripe's recommended path for new integrations
	// and handles SCA; the price must carry a PaymentMethod.
	PaymentIntents API = "payment_intents"
)

// Defaults for [Config].
const (
	DefaultScope        = "billonce"
	DefaultWindowMargin = 23 * time.Hour
	DefaultStripeURL    = "https://api.stripe.com"
	// DefaultRateLimit is below Stripe's live-mode limit of 100 requests
	// per second, leaving room for the rest of the account's traffic.
	DefaultRateLimit = 80
	// minWindowMargin is the smallest WindowMargin accepted: a search for
	// a key's payment is trusted only once Stripe has had time to index it.
	minWindowMargin = time.Hour
	// clockAllowance is how far the database's clock and Stripe's may
	// differ. New refuses a WindowMargin and Retry.AttemptTimeout that
	// leave less than this before Stripe's 24-hour key window ends.
	clockAllowance = 5 * time.Minute
)

// maxAttempt is the largest attempt number [Biller.Rebill] accepts. Re-bills
// are decided by a person or a dunning process, a few per period; a larger
// number is a typo or an overflow.
const maxAttempt = 10_000

// maxRateLimit is the largest Config.RateLimit accepted, in requests per
// second: a hundred times Stripe's default live-mode limit, beyond any limit
// an account is granted. A larger value is a typo or an overflow, not a
// plan (for no limit at all, use a negative RateLimit).
const maxRateLimit = 10_000

// Metadata keys that every charge carries, so a charge can always be found
// again by key, customer and period (Stripe search: metadata['billonce_key']:'…').
const (
	MetaKey      = "billonce_key"
	MetaCustomer = "billonce_customer"
	MetaPeriod   = "billonce_period"
)

// defaultIdleConns is how many idle connections to Stripe the default
// transport keeps: enough for a Run's workers.
const defaultIdleConns = 64

// Limits on identifiers.
const (
	maxIDLen    = 255
	maxOwnerLen = 200 // leaves room for the per-claim suffix
)

// Price is what one customer owes for one period.
type Price struct {
	// Amount in the currency's smallest unit (cents for usd); must be > 0.
	Amount int64
	// Currency is a three-letter ISO code Stripe supports ("usd", "eur").
	Currency string
	// PaymentMethod is the saved payment method to charge ("pm_…").
	// Required with the PaymentIntents API; ignored by Charges.
	PaymentMethod string
}

// Config configures a [Biller]. Zero values take the documented defaults;
// SecretKey and Claims are required.
type Config struct {
	// SecretKey is the Stripe secret or restricted key ("sk_…", "rk_…").
	// Behind a spend-cap proxy (spendcap.Client as HTTPClient) the transport
	// sends the vault key in its place, so the process needs no Stripe
	// secret: set SecretKey to the vault key. It never appears in logs or
	// errors.
	SecretKey string
	// Credential names the Stripe API key whose idempotency keys this
	// Biller uses, when SecretKey is not that key. Claims record a
	// fingerprint of it (never the value), and a claim sent with another
	// credential is not resent blind: Stripe may keep
	// idempotency keys per API key. Defaults to SecretKey, which is right
	// unless requests go through a spend-cap proxy, where SecretKey is a
	// vault key that changes every run: then set a stable name of the
	// Stripe key the proxy holds (such as "acct_1Nv…/billing-key-2026"),
	// and change it when that key is rotated.
	Credential string
	// StripeURL is the base URL of the Stripe API. Defaults to
	// DefaultStripeURL; tests point it at billingtest.Server.URL. It is
	// scheme (https, or http for a local fake), host and an optional path:
	// no user info, query or fragment (the key goes in SecretKey), and it
	// is printed without them.
	StripeURL string
	// HTTPClient sends the requests. Its Transport is kept (wrapped with
	// idemkey.Transport, so no write leaves without its key, and an error
	// answer that is not Stripe's, such as a web server's HTML 404, is put
	// in Stripe's error shape so it is judged by its status); its Timeout is
	// replaced by the per-attempt timeout of Retry, and its CheckRedirect
	// by a refusal: Stripe never redirects, so a redirect from StripeURL
	// stops a run with [ErrStripeRequest] and the secret key is sent
	// nowhere but StripeURL. Defaults to a client on
	// a clone of http.DefaultTransport that keeps 64 idle connections per
	// host instead of 2, so a Run's workers reuse their connections.
	HTTPClient *http.Client

	// Claims records who bills whom: a claim.NewPostgres store in
	// production. Required.
	Claims claim.Store
	// Price returns what a customer owes for a period; required by Charge,
	// optional when every Run item carries its own price. An error aborts
	// that customer's charge before anything is claimed or sent.
	Price func(ctx context.Context, customer, period string) (Price, error)
	// Invoice returns the invoice a customer is billed for a period, for
	// [Biller.Invoice] called with a nil *Invoice, for Run items billed by
	// invoice, and for Reconcile, which needs an invoice's lines to resume
	// it. An error aborts that customer's invoice before anything is
	// claimed or sent.
	Invoice func(ctx context.Context, customer, period string) (Invoice, error)
	// API is Charges (the default) or PaymentIntents.
	API API
	// Scope is the first part of every idempotency key; use one per product
	// or per kind of charge. Defaults to DefaultScope. A claim table holds
	// one live claim per customer and period whatever the scope, so a
	// renamed scope cannot bill a period again; products that bill the same
	// customers for the same periods use a claim table each
	// (claim.Config.Table).
	Scope string

	// RateLimit caps the Biller's requests to Stripe per second, retries and
	// searches included, across all its calls. Defaults to
	// DefaultRateLimit; a negative value means no limit; at most
	// 10,000.
	RateLimit float64

	// Retry is the policy around each Stripe call. Its Classify defaults to
	// [Classify]; the other fields take retry's defaults.
	Retry retry.Policy
	// UnreachableAttempts and UnreachableAfter say when Stripe is
	// unreachable, which stops a Run, and every call under way, with
	// [ErrStripeUnreachable] instead of retrying: when this many attempts
	// to create a payment in a row, across all the Biller's calls, got no
	// HTTP answer (a transport error: connection refused, DNS or TLS
	// failure, timeout, connection reset), or when such attempts, two at
	// least, have gone on for UnreachableAfter since the first of them
	// started, or would have before the next retry could start (a call
	// does not wait for a retry that would start later). Any HTTP
	// answer, a 5xx or a 429 included, starts the count again, so a
	// Stripe that answers slowly or with errors is retried as Retry says.
	// UnreachableAttempts defaults to 32 (four rounds of a default Run's
	// workers: a Run against a refused port stops in about two seconds, a
	// blip of a second or two is ridden out); UnreachableAfter defaults to
	// 10 seconds (a single Charge against a refused port makes its last
	// attempt within ten seconds of its first and gives up, rather than
	// retry for its whole policy; against an address that never answers
	// it gives up after two attempt timeouts). A negative value turns that
	// rule off; both negative, only Retry limits the attempts.
	UnreachableAttempts int
	UnreachableAfter    time.Duration
	// WindowMargin is the deadline of a key: once this much
	// time has passed on the database clock since the key was first sent
	// (since its claim was made), no request carries it again until
	// Stripe's search has shown that no payment exists for it. It is
	// checked before every HTTP attempt, so long retries and waits in a
	// Run's queue count. Stripe keeps keys for at least 24 hours; New
	// requires WindowMargin + Retry.AttemptTimeout + 5 minutes (for clocks
	// that differ) to fit in them, and at least an hour. Defaults to
	// DefaultWindowMargin.
	WindowMargin time.Duration
	// InProgressWait makes Charge wait up to this long for another runner's
	// live claim to finish, instead of returning ErrInProgress at once.
	InProgressWait time.Duration

	// Owner names this runner on its claims. Each Biller adds a random
	// part of its own and each claim a sequence number, so replicas that
	// share a configured Owner still see each other's claims as in
	// progress. Defaults to host-pid; at most 200 bytes.
	Owner string
	// Logger receives retries, takeovers and reconciliations. Nil sends
	// warnings and errors (a stopped run, a claim that needs
	// reconciliation, a key sent elsewhere, a payment that failed after
	// processing) to slog.Default, as it is when each line is logged, and
	// drops the rest; to discard everything, set
	// slog.New(slog.DiscardHandler). A Logger without a handler
	// (&slog.Logger{}) is refused.
	Logger *slog.Logger
	// Observe, when set, is called after each attempt to create a charge at
	// Stripe (EventStripeCall) and once per outcome of a charge that got as
	// far as its claim (EventOutcome), in Charge, Rebill, Run and Reconcile,
	// for metrics; and when a webhook or Reconcile learns that a payment
	// settled, was refunded or was disputed (EventSettled, EventRefunded,
	// EventDisputed), or that a webhook event cannot be applied
	// (EventNotApplied); once per webhook delivery, with its result
	// (EventWebhook); and once when a Run ends (EventRun). It must be fast
	// and safe for concurrent use.
	Observe func(Event)

	// SettleAfter is how long a payment may be processing (a bank debit
	// Stripe has not settled) before Reconcile reads it from Stripe, one
	// GET per claim under RateLimit. Webhooks ([Biller.Webhook]) usually
	// settle it sooner. Defaults to DefaultSettleAfter.
	SettleAfter time.Duration
	// EventRetention is how long the claim store keeps the record of each
	// webhook event it applied (the record that makes a redelivery a
	// duplicate). Reconcile deletes older records (claim.Postgres.PruneEvents),
	// a batch at a time. Stripe retries a delivery for up to 3 days and an
	// event can be resent by hand for up to 30 days; an event delivered
	// again after its record is gone is applied again and changes nothing,
	// because claims only move forward. Defaults to DefaultEventRetention;
	// at least 30 days; a negative value keeps every record (prune with
	// claim.Postgres.PruneEvents yourself, or never).
	EventRetention time.Duration
}

// Event is what [Config.Observe] receives.
type Event struct {
	Kind     EventKind
	Customer string
	Period   string
	// Key is the idempotency key of the claim the event concerns (every
	// kind but EventNotApplied and EventRun; empty for an outcome refused
	// before a key was made, and for an EventWebhook before its claim was
	// known).
	Key string
	// RequestID is Stripe's request id ("req_…") of the call an
	// EventStripeCall reports (empty when no answer came), and of the
	// answer that decided a failed EventOutcome (ChargeError.RequestID).
	// It is not a secret.
	RequestID string
	// Attempt is the HTTP attempt number within one send, from 1
	// (EventStripeCall).
	Attempt int
	// Duration is the HTTP call's (EventStripeCall), the time from the
	// claim to the outcome (EventOutcome), or the time Run took (EventRun).
	Duration time.Duration
	// Err is the call's or the charge's error, or nil.
	Err error
	// Outcome is set on an EventOutcome without Err.
	Outcome Outcome

	// StripeID names the payment (EventSettled, EventRefunded,
	// EventDisputed).
	StripeID string
	// State is the claim's state after an EventSettled: "processing",
	// "succeeded" or "failed" (then Err is a *ChargeError of kind
	// ErrDeclined, with AfterProcessing set when the payment failed after
	// processing).
	State string
	// Refunded is the amount refunded so far (EventRefunded).
	Refunded int64
	// Dispute is the dispute's id and reason (EventDisputed).
	Dispute string
	// EventID is the Stripe event's id (EventNotApplied, and EventWebhook
	// once the delivery's signature was verified).
	EventID string
	// Result is what came of a webhook delivery (EventWebhook): "applied"
	// (the claim changed), "duplicate" (applied before), "unchanged" (the
	// claim knew as much already), "other_payment" (the claim records
	// another payment), "unproven" (nothing shows the event is about the
	// claim's own send: the claim has recorded no payment yet, and its own
	// resume settles it), "ignored" (an event type not handled, or a payment
	// that is not billonce's or has no claim), "not_applied" (as
	// EventNotApplied), "rejected" (answered 4xx: not a POST, a body too
	// large or unreadable, a bad signature) or "retry" (answered 5xx, for
	// Stripe to deliver it again; Err says why).
	Result string
	// Summary is what Run returned (EventRun), its counts as of the end of
	// the run. It is shared with Run's caller: do not modify it.
	Summary *Summary
}

// EventKind tells what an [Event] reports. The zero EventKind, "none",
// is no event of billonce's (an Event built by hand).
type EventKind int

const (
	// EventStripeCall: one HTTP call creating a charge or payment intent,
	// or making a step of an invoice, finished (Attempt, Duration, Err).
	// Searches and reads are not reported.
	EventStripeCall EventKind = iota + 1
	// EventOutcome: one customer's charge finished (Outcome on success, Err
	// otherwise).
	EventOutcome
	// EventSettled: a webhook or Reconcile moved a claim: its payment is
	// processing, or a payment settled (State, Err).
	EventSettled
	// EventRefunded: a payment was refunded (Refunded). The claim stays
	// billed: a refund is not a reason to bill again.
	EventRefunded
	// EventDisputed: a payment was disputed (Dispute). The claim stays
	// billed: a dispute is not a reason to bill again.
	EventDisputed
	// EventNotApplied: a correctly signed webhook event could not be
	// applied and never will be (EventID, StripeID if known, Err): its
	// payment is not on this Stripe account, or it names a key or an id
	// longer than the claim table takes. It was answered 200, so that
	// Stripe does not deliver it again, and logged as an error. It deserves
	// a look.
	EventNotApplied
	// EventWebhook: the webhook handler answered a delivery (Result;
	// EventID, Key, StripeID, Customer and Period as far as they are
	// known; Err of a "rejected", "not_applied" or "retry"). Every
	// delivery is reported once, after the events it caused.
	EventWebhook
	// EventRun: a Run ended (Period, Duration, Summary, and Err, what Run
	// returned), whether it ran or was refused (ErrInvalid,
	// ErrRunHeldElsewhere). A Run that panics reports none.
	EventRun
)

var eventKindNames = [...]string{"none", "stripe call", "outcome", "settled", "refunded", "disputed", "not applied", "webhook", "run"}

// String returns the kind as words: "stripe call", "outcome", "settled",
// "refunded", "disputed", "not applied", "webhook", "run", or "none" for
// the zero value.
func (k EventKind) String() string {
	if k >= 0 && int(k) < len(eventKindNames) {
		return eventKindNames[k]
	}
	return fmt.Sprintf("EventKind(%d)", int(k))
}

// Outcome tells how a charge came to be billed, in a [Receipt] and an
// [Event]. [Progress] counts the same words. The zero Outcome, "none", is
// that of a charge that was not billed: the Receipt returned with an
// error, the Event of a failed outcome.
type Outcome int

const (
	// Created: this call made the charge at Stripe.
	Created Outcome = iota + 1
	// Replayed: Stripe already had a charge for the key (an earlier attempt
	// made it, its answer was lost) and replayed it. Progress counts it as
	// Created: the charge was made by this run.
	Replayed
	// AlreadyBilled: the claim store already held the charge; Stripe was
	// not called.
	AlreadyBilled
	// Reconciled: a pending claim was settled by finding its charge with
	// Stripe's search. Progress counts it as AlreadyBilled.
	Reconciled
)

// String returns the outcome as words: "created", "replayed", "already
// billed", "reconciled", or "none" for the zero value.
func (o Outcome) String() string {
	switch o {
	case 0:
		return "none"
	case Created:
		return "created"
	case Replayed:
		return "replayed"
	case AlreadyBilled:
		return "already billed"
	case Reconciled:
		return "reconciled"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Receipt describes a customer's charge for a period.
type Receipt struct {
	Customer, Period string
	// StripeID is the charge ("ch_…"), payment intent ("pi_…") or
	// invoice ("in_…").
	StripeID string
	Amount   int64
	Currency string
	Key      idemkey.Key
	Attempt  int
	Outcome  Outcome
	// Processing: the payment exists but has not settled (a bank debit):
	// its outcome arrives by webhook or Reconcile. It is never sent again.
	Processing bool
}

// Biller charges customers exactly once per period. It is safe for
// concurrent use; create one per process and share it.
//
// Printing a Biller, with any fmt verb or slog handler, never shows its
// secret key: its state is behind a pointer, and the fields that hold the
// key (the configuration and the Stripe clients) behind another, which fmt
// prints as addresses; it has no exported field for encoding/json.
type Biller struct{ *biller }

type biller struct {
	// cfg, charges and intents hold the secret key; see Biller.
	cfg *Config
	// claims is the engine of cfg.Claims.
	claims  claimengine.Engine[claim.Claim]
	log     *slog.Logger
	policy  retry.Policy
	limiter *rate.Limiter
	// searches paces search requests on their own (see searchRateLimit);
	// they take a token of limiter too.
	searches *rate.Limiter
	// instance is random per Biller, so that two replicas configured with
	// the same Owner are still two owners; seq numbers its claims. See
	// newOwner.
	instance string
	seq      *atomic.Uint64
	// reach tells whether Stripe answers at all (see ErrStripeUnreachable).
	reach *reach
	// traced is set when every request is sent by a *http.Transport, whose
	// trace hooks tell a request never written (see create). A caller's
	// other transport may send a request where no hook of its context sees
	// it (a fallback client of its own, a queue, another protocol).
	traced bool
	// endpoint and credential say where this Biller's keys go, recorded on
	// every claim it makes.
	endpoint, credential string
	charges              *charge.Client
	intents              *paymentintent.Client
	invoices             *invoice.Client
	items                *invoiceitem.Client
	usageClients
}

// New checks cfg and returns a Biller. Its errors wrap [ErrInvalid] and
// name the field to fix.
func New(cfg Config) (*Biller, error) {
	cfg = cfg.withDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	b := &Biller{&biller{cfg: &cfg, claims: claimengine.Of[claim.Claim](cfg.Claims), log: cfg.Logger, policy: cfg.Retry, seq: new(atomic.Uint64)}}
	b.limiter = cfg.limiter()
	b.searches = rate.NewLimiter(rate.Inf, 0)
	if cfg.RateLimit >= 0 {
		b.searches = rate.NewLimiter(searchRateLimit, 1)
	}
	if b.log == nil {
		b.log = slog.New(defaultHandler{})
	}
	b.reach = newReach(&cfg)
	b.endpoint, b.credential = string(cfg.API), fingerprint(cmp.Or(cfg.Credential, cfg.SecretKey))
	var nonce [4]byte
	rand.Read(nonce[:])
	b.instance = hex.EncodeToString(nonce[:])
	backend := cfg.backend()
	b.traced = cfg.HTTPClient == nil || cfg.HTTPClient.Transport == nil
	if cfg.HTTPClient != nil {
		_, ok := cfg.HTTPClient.Transport.(*http.Transport)
		b.traced = b.traced || ok
	}
	b.charges = &charge.Client{B: backend, Key: cfg.SecretKey}
	b.intents = &paymentintent.Client{B: backend, Key: cfg.SecretKey}
	b.invoices = &invoice.Client{B: backend, Key: cfg.SecretKey}
	b.items = &invoiceitem.Client{B: backend, Key: cfg.SecretKey}
	b.usageClients = usageClients{meterList: &meter.Client{B: backend, Key: cfg.SecretKey},
		meterEvents: &meterevent.Client{B: backend, Key: cfg.SecretKey}, meterSummaries: &metereventsummary.Client{B: backend, Key: cfg.SecretKey},
		meters: &meters{by: map[string]meterInfo{}}}
	return b, nil
}

// withDefaults returns cfg with every zero field that has a default set to
// it. Owner's default is this host and process.
func (cfg Config) withDefaults() Config {
	cfg.API = cmp.Or(cfg.API, Charges)
	cfg.Scope = cmp.Or(cfg.Scope, DefaultScope)
	cfg.StripeURL = cmp.Or(cfg.StripeURL, DefaultStripeURL)
	cfg.WindowMargin = cmp.Or(cfg.WindowMargin, DefaultWindowMargin)
	cfg.SettleAfter = cmp.Or(cfg.SettleAfter, DefaultSettleAfter)
	cfg.EventRetention = cmp.Or(cfg.EventRetention, DefaultEventRetention)
	if cfg.Retry.Classify == nil {
		cfg.Retry.Classify = Classify
	}
	if cfg.Owner == "" {
		cfg.Owner = defaultOwner()
	}
	return cfg
}

// searchLag is how long billonce gives Stripe's search to index a payment
// or invoice before it trusts a search that found none, when nothing but
// search can tell: a key sent with another credential. Stripe indexes
// objects within a minute, and longer during incidents.
const searchLag = time.Hour

// elsewhereAfter is how long after a key's window started a Biller with
// another endpoint or credential trusts a search that finds nothing for
// it: Stripe's 24 hours, and at least until the last request the old
// configuration can have sent (up to WindowMargin and an attempt's
// timeout after the window started) has had searchLag to be indexed.
func (cfg Config) elsewhereAfter() time.Duration {
	return max(retry.KeyWindow, cfg.WindowMargin+cfg.attemptTimeout()+searchLag)
}

// attemptTimeout is Retry's per-attempt timeout, defaulted.
func (cfg Config) attemptTimeout() time.Duration {
	return cmp.Or(cfg.Retry.AttemptTimeout, retry.DefaultAttemptTimeout)
}

// validate checks a Config that has its defaults.
func (cfg Config) validate() error {
	switch {
	case cfg.SecretKey == "":
		return invalid("Config.SecretKey is empty: set the Stripe secret key (or the vault key behind a spend-cap proxy)")
	case strings.ContainsFunc(cfg.SecretKey, unicode.IsSpace):
		return invalid("Config.SecretKey contains white space: check how it is loaded")
	case nilness.Is(cfg.Claims):
		return invalid("Config.Claims is nil (%T): use claim.NewPostgres with your pool (claim.NewMemory in unit tests), and check its error", cfg.Claims)
	case claimengine.Of[claim.Claim](cfg.Claims) == nil:
		return invalid("Config.Claims is a %T, not a store of package claim: use claim.NewPostgres (claim.NewMemory in unit tests)", cfg.Claims)
	case cfg.HTTPClient != nil && cfg.HTTPClient.Transport != nil && nilness.Is(cfg.HTTPClient.Transport):
		return invalid("Config.HTTPClient.Transport is a nil %T: set a transport, or leave Transport nil for the default", cfg.HTTPClient.Transport)
	case cfg.Logger != nil && cfg.Logger.Handler() == nil:
		return invalid("Config.Logger has no handler: build it with slog.New, or leave Logger nil for warnings and errors on slog.Default")
	case cfg.API != Charges && cfg.API != PaymentIntents:
		return invalid("Config.API %q: use billing.Charges or billing.PaymentIntents", cfg.API)
	}
	if err := checkStripeURL(cfg.StripeURL); err != nil {
		return err
	}
	switch {
	case cfg.WindowMargin < 0 || cfg.WindowMargin >= retry.KeyWindow:
		return invalid("Config.WindowMargin %v must be positive and below Stripe's 24h key window", cfg.WindowMargin)
	case cfg.WindowMargin < minWindowMargin:
		return invalid("Config.WindowMargin %v is below %v: claims would be reconciled by search before Stripe has indexed their first payment", cfg.WindowMargin, minWindowMargin)
	case cfg.SettleAfter < 0:
		return invalid("Config.SettleAfter %v must not be negative", cfg.SettleAfter)
	case cfg.EventRetention > 0 && cfg.EventRetention < minEventRetention:
		return invalid("Config.EventRetention %v is shorter than 30 days, for which Stripe can still resend an event: use at least 720h (the default is %v), or a negative value to keep every record", cfg.EventRetention, DefaultEventRetention)
	case cfg.InProgressWait < 0:
		return invalid("Config.InProgressWait %v must not be negative", cfg.InProgressWait)
	}
	if _, err := idemkey.For(cfg.Scope, "probe"); err != nil {
		return invalid("Config.Scope: %v", err)
	}
	if err := cfg.Retry.Validate(); err != nil {
		return invalid("Config.Retry: %v", err)
	}
	if math.IsNaN(cfg.RateLimit) || cfg.RateLimit > maxRateLimit {
		return invalid("Config.RateLimit %v: use requests per second up to %d, 0 for the default %d, or a negative value for no limit", cfg.RateLimit, maxRateLimit, DefaultRateLimit)
	}
	if err := checkID("Config.Owner", cfg.Owner); err != nil {
		return err
	}
	if len(cfg.Owner) > maxOwnerLen {
		return invalid("Config.Owner is %d bytes long; the limit is %d", len(cfg.Owner), maxOwnerLen)
	}
	// The last attempt may start just before the deadline and reach Stripe
	// up to one attempt timeout later; clocks may differ by clockAllowance.
	if attempt := cfg.attemptTimeout(); cfg.WindowMargin+attempt+clockAllowance > retry.KeyWindow {
		return invalid("Config.WindowMargin %v plus Retry.AttemptTimeout %v plus %v for clock differences is more than Stripe's %v key window: an attempt started before the deadline could reach Stripe after it has forgotten the key; lower one of them",
			cfg.WindowMargin, attempt, clockAllowance, retry.KeyWindow)
	}
	return nil
}

// limiter is the Biller's rate limiter for RateLimit.
func (cfg Config) limiter() *rate.Limiter {
	switch {
	case cfg.RateLimit == 0:
		return rate.NewLimiter(DefaultRateLimit, DefaultRateLimit/4)
	case cfg.RateLimit > 0:
		return rate.NewLimiter(rate.Limit(cfg.RateLimit), max(1, int(cfg.RateLimit/4)))
	}
	return rate.NewLimiter(rate.Inf, 0)
}

// backend is the stripe-go backend of a Biller: HTTPClient's transport
// wrapped so that every write leaves with its key, and no retries of
// stripe-go's own.
func (cfg Config) backend() stripe.Backend {
	// Stripe's API never redirects, and a followed redirect would carry the
	// secret key to another address (net/http keeps Authorization when only
	// the port differs) or turn the POST into a GET. stripeShaped turns
	// every 3xx into a refusal; CheckRedirect makes sure none is followed.
	hc := &http.Client{Timeout: cfg.attemptTimeout(), CheckRedirect: refuseRedirect}
	var base http.RoundTripper
	if cfg.HTTPClient != nil {
		hc.Jar, base = cfg.HTTPClient.Jar, cfg.HTTPClient.Transport
	}
	if base == nil {
		// http.DefaultTransport keeps two idle connections per host; a Run
		// with more workers than that would dial anew for most requests.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = defaultIdleConns
		base = t
	}
	// Every write leaves with the key from its context, or not at all.
	hc.Transport = &idemkey.Transport{Base: stripeShaped{base}}
	return stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:        stripe.String(cfg.StripeURL),
		HTTPClient: hc,
		// billonce's retry layer is the only one: stripe-go's own retries
		// would run inside an attempt's deadline and hide what happened.
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quietLogger{},
	})
}

// fingerprint names a credential on claims without revealing it: the first
// 64 bits of a SHA-256 of the key, from which the key cannot be recovered.
func fingerprint(secret string) string {
	sum := sha256.Sum256([]byte("billonce credential\x00" + secret))
	return "sha256:" + hex.EncodeToString(sum[:8])
}

// String describes the Biller without its secret key, and with the Stripe
// URL redacted.
func (b Biller) String() string {
	return fmt.Sprintf("billing.Biller{api: %s, scope: %s, stripe: %s, owner: %s}", b.cfg.API, b.cfg.Scope, redact.RawURL(b.cfg.StripeURL), b.cfg.Owner)
}

// describe is what Format and LogValue show: the configuration without
// its secret key (the key shows only whether it is set, the credential
// only as the fingerprint claims record) and with the Stripe URL redacted.
func (cfg Config) describe() string {
	secret, cred := "(none)", "(SecretKey)"
	if cfg.SecretKey != "" {
		secret = "****"
	}
	if cfg.Credential != "" {
		cred = fingerprint(cfg.Credential)
	}
	return fmt.Sprintf("billing.Config{SecretKey: %s, Credential: %s, StripeURL: %s, API: %s, Scope: %s, Owner: %s, Claims: %T, RateLimit: %v, WindowMargin: %v, InProgressWait: %v, SettleAfter: %v}",
		secret, cred, redact.RawURL(cfg.StripeURL), cfg.API, cfg.Scope, cfg.Owner, cfg.Claims, cfg.RateLimit, cfg.WindowMargin, cfg.InProgressWait, cfg.SettleAfter)
}

// Format prints the configuration without its secret key for every verb
// (%v, %+v, %#v, %s, %d, …), so that a Config printed whole, by start-up
// code or a panic, leaks nothing: the key shows only whether it is set,
// the credential only as the fingerprint claims record, and the Stripe URL
// redacted.
func (cfg Config) Format(f fmt.State, verb rune) {
	if verb == 'q' {
		fmt.Fprintf(f, "%q", cfg.describe())
		return
	}
	io.WriteString(f, cfg.describe())
}

// LogValue implements [slog.LogValuer]: what Format shows, for every
// handler (a JSON handler would print the fields otherwise).
func (cfg Config) LogValue() slog.Value { return slog.StringValue(cfg.describe()) }

// checkStripeURL refuses a Config.StripeURL that cannot work or carries a
// credential, naming it redacted: url.Parse's error and the raw string
// would both quote the user info.
func checkStripeURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return invalid("Config.StripeURL %q (redacted) is not a URL; give scheme, host and an optional path, such as %s", redact.RawURL(raw), DefaultStripeURL)
	}
	safe := redact.URL(u)
	switch {
	case u.User != nil:
		return invalid("Config.StripeURL %q carries user info; the key goes in Config.SecretKey, never in the URL", safe)
	case u.Scheme != "https" && u.Scheme != "http":
		return invalid("Config.StripeURL %q: the scheme must be https (or http for a local fake)", safe)
	case u.Host == "" || u.Hostname() == "":
		return invalid("Config.StripeURL %q has no host", safe)
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return invalid("Config.StripeURL %q has a query or fragment; stripe-go appends each request's path to it, so give only scheme, host and an optional path", safe)
	}
	return nil
}

func defaultOwner() string {
	host, _ := os.Hostname()
	if host == "" {
		host = "host"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// quietLogger keeps stripe-go from writing to stderr; the Biller logs what
// matters through Config.Logger.
type quietLogger struct{}

func (quietLogger) Debugf(string, ...any) {}
func (quietLogger) Errorf(string, ...any) {}
func (quietLogger) Infof(string, ...any)  {}
func (quietLogger) Warnf(string, ...any)  {}

var periodRE = regexp.MustCompile(`^[0-9]{4}-(0[1-9]|1[0-2])(-(0[1-9]|[12][0-9]|3[01]))?$`)

// ValidatePeriod reports whether period is a billing period billonce
// accepts: a month ("2026-09") or a day ("2026-09-15"). Charge and Run
// check it themselves; call it to check a period given on a command line
// before anything else. A month and a day in it are different periods,
// each billed once: a customer billed for both is charged twice.
func ValidatePeriod(period string) error { return checkPeriod(period) }

func checkPeriod(period string) error {
	if !periodRE.MatchString(period) {
		return invalid("period %q: use a month like 2026-09 or a day like 2026-09-15", clip(period))
	}
	if len(period) == 10 {
		if _, err := time.Parse(time.DateOnly, period); err != nil {
			return invalid("period %q is not a calendar day", period)
		}
	}
	return nil
}

// Validate reports whether p can be charged with api: a positive amount up
// to Stripe's limit, a currency Stripe charges in (any case), and a payment
// method when api is PaymentIntents. Its errors wrap [ErrInvalid].
func (p Price) Validate(api API) error {
	_, err := checkPrice(p, api)
	return err
}

// Validate reports whether it can be billed with api: a customer ID of 1
// to 255 bytes without white space or control characters, and, when it
// carries one, a price that passes [Price.Validate]. Use it to check a
// whole input file before a run; Run checks every item itself.
func (it Item) Validate(api API) error {
	if err := checkID("customer ID", it.Customer); err != nil {
		return err
	}
	if it.Invoice != nil {
		if _, _, err := checkInvoice(*it.Invoice); err != nil {
			return fmt.Errorf("customer %s: %w", it.Customer, err)
		}
	}
	if it.Price != nil {
		if err := it.Price.Validate(api); err != nil {
			return fmt.Errorf("customer %s: %w", it.Customer, err)
		}
	}
	return nil
}

func checkID(what, id string) error {
	switch {
	case id == "":
		return invalid("%s is empty", what)
	case len(id) > maxIDLen:
		return invalid("%s is %d bytes long; the limit is %d", what, len(id), maxIDLen)
	case strings.ContainsFunc(id, func(r rune) bool { return unicode.IsControl(r) || unicode.IsSpace(r) || r == unicode.ReplacementChar }):
		return invalid("%s %q contains white space, control characters or invalid UTF-8", what, clip(id))
	}
	return nil
}

func checkPrice(p Price, api API) (Price, error) {
	if p.Amount <= 0 {
		return p, invalid("amount %d: must be a positive number of the currency's smallest unit (cents)", p.Amount)
	}
	if p.Amount > maxAmount {
		return p, invalid("amount %d is above Stripe's largest amount %d", p.Amount, maxAmount)
	}
	c := strings.ToLower(p.Currency)
	if !currencies[c] {
		return p, invalid("currency %q is not a currency Stripe charges in; use a three-letter ISO code such as usd or eur", clip(p.Currency))
	}
	p.Currency = c
	if api == PaymentIntents {
		if p.PaymentMethod == "" {
			return p, invalid("the PaymentIntents API needs Price.PaymentMethod (a saved pm_… for off-session charges)")
		}
		if err := checkID("payment method", p.PaymentMethod); err != nil {
			return p, err
		}
	}
	return p, nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

// maxAmount is Stripe's largest amount: eight digits for most currencies.
const maxAmount = 99_999_999

// currencies Stripe can charge in (ISO 4217, lowercase).
var currencies = func() map[string]bool {
	m := map[string]bool{}
	for _, c := range strings.Fields(`usd aed afn all amd ang aoa ars aud awg azn bam bbd bdt bgn bhd bif bmd bnd bob brl
		bsd bwp byn bzd cad cdf chf clp cny cop crc cve czk djf dkk dop dzd egp etb eur fjd fkp gbp gel gip gmd gnf
		gtq gyd hkd hnl htg huf idr ils inr isk jmd jod jpy kes kgs khr kmf krw kwd kyd kzt lak lbp lkr lrd lsl mad
		mdl mga mkd mmk mnt mop mur mvr mwk mxn myr mzn nad ngn nio nok npr nzd omr pab pen pgk php pkr pln pyg qar
		ron rsd rub rwf sar sbd scr sek sgd shp sle sos srd std szl thb tjs tnd top try ttd twd tzs uah ugx uyu uzs
		vnd vuv wst xaf xcd xof xpf yer zar zmw`) {
		m[c] = true
	}
	return m
}()
