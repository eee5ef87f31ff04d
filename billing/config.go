package billing

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
	"unicode"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/nilness"
	"github.com/billonce/billonce/internal/redact"
	"github.com/billonce/billonce/retry"
	"github.com/stripe/stripe-go/v79"
	"golang.org/x/time/rate"
)

// API chooses which Stripe API creates the money movement. The zero API
// is Charges, the default.
type API string

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

// maxRateLimit is the largest Config.RateLimit accepted, in requests per
// second: a hundred times Stripe's default live-mode limit, beyond any limit
// an account is granted. A larger value is a typo or an overflow, not a
// plan (for no limit at all, use a negative RateLimit).
const maxRateLimit = 10_000

// defaultIdleConns is how many idle connections to Stripe the default
// transport keeps: enough for a Run's workers.
const defaultIdleConns = 64

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
	// one live claim per customer and period whatever the scope, and a
	// period declined under one scope is re-billed only from that scope
	// (Rebill with Config.Scope set to it): a renamed scope cannot bill a
	// period again, paid, pending or declined, and is refused with a
	// [*claim.MismatchError] on "scope" naming the scope to re-bill from
	// (Run counts it Invalid). Products that bill the same customers for
	// the same periods use a claim table each (claim.Config.Table).
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
	// (EventWebhook); and once when a Run ends (EventRun). Every event about
	// a claim names its kind of write in Event.Object ("charge", "invoice",
	// "refund", "payout", …), so refunds or payouts can be told from
	// charges. It must be fast and safe for concurrent use.
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
	// and to the account its context names.
	hc.Transport = &idemkey.Transport{Base: stripeShaped{accountHeader{base}}}
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

func (quietLogger) Infof(string, ...any) {}

func (quietLogger) Warnf(string, ...any) {}

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
