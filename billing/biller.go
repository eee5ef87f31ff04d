package billing

import (
	"cmp"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"

	"github.com/stripe/stripe-go/v79/billing/meter"
	"github.com/stripe/stripe-go/v79/billing/meterevent"
	"github.com/stripe/stripe-go/v79/billing/metereventsummary"
	"github.com/stripe/stripe-go/v79/charge"
	"github.com/stripe/stripe-go/v79/creditnote"
	"github.com/stripe/stripe-go/v79/event"
	"github.com/stripe/stripe-go/v79/invoice"
	"github.com/stripe/stripe-go/v79/invoiceitem"
	"github.com/stripe/stripe-go/v79/paymentintent"
	"github.com/stripe/stripe-go/v79/payout"
	"github.com/stripe/stripe-go/v79/refund"
	"github.com/stripe/stripe-go/v79/transfer"
	"golang.org/x/time/rate"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
	"github.com/billonce/billonce/internal/redact"
	"github.com/billonce/billonce/retry"
)

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
	// reachability tells whether Stripe answers at all (see ErrStripeUnreachable).
	reachability *reachability
	// traced is set when every request is sent by a *http.Transport, whose
	// trace hooks tell a request never written (see Biller.attempt). A caller's
	// other transport may send a request where no hook of its context sees
	// it (a fallback client of its own, a queue, another protocol).
	traced bool
	// endpoint and credential say where this Biller's keys go, recorded on
	// every claim it makes.
	endpoint, credential string
	charges              *charge.Client
	intents              *paymentintent.Client
	refunds              *refund.Client
	creditNotes          *creditnote.Client
	transfers            *transfer.Client
	payouts              *payout.Client
	invoices             *invoice.Client
	items                *invoiceitem.Client
	events               *event.Client
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
	b.reachability = newReachability(&cfg)
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
	b.refunds = &refund.Client{B: backend, Key: cfg.SecretKey}
	b.creditNotes = &creditnote.Client{B: backend, Key: cfg.SecretKey}
	b.transfers = &transfer.Client{B: backend, Key: cfg.SecretKey}
	b.payouts = &payout.Client{B: backend, Key: cfg.SecretKey}
	b.invoices = &invoice.Client{B: backend, Key: cfg.SecretKey}
	b.items = &invoiceitem.Client{B: backend, Key: cfg.SecretKey}
	b.events = &event.Client{B: backend, Key: cfg.SecretKey}
	b.usageClients = usageClients{meterList: &meter.Client{B: backend, Key: cfg.SecretKey},
		meterEvents: &meterevent.Client{B: backend, Key: cfg.SecretKey}, meterSummaries: &metereventsummary.Client{B: backend, Key: cfg.SecretKey},
		meters: &meters{by: map[string]meterInfo{}}}
	return b, nil
}

// String describes the Biller without its secret key, and with the Stripe
// URL redacted.
func (b Biller) String() string {
	return fmt.Sprintf("billing.Biller{api: %s, scope: %s, stripe: %s, owner: %s}", b.cfg.API, b.cfg.Scope, redact.RawURL(b.cfg.StripeURL), b.cfg.Owner)
}

// newOwner names one charge attempt on its claim: the Biller's owner, its
// random instance and a sequence number. Two calls in one process for the
// same customer, or two replicas with the same Config.Owner, then see each
// other as in progress instead of both sending.
func (b *Biller) newOwner() string {
	return b.cfg.Owner + "/" + b.instance + "/" + strconv.FormatUint(b.seq.Add(1), 10)
}

func (b *Biller) observe(e Event) {
	if b.cfg.Observe != nil {
		b.cfg.Observe(e)
	}
}
