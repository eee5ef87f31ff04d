package billingtest

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for [Config] fields left zero.
const (
	defaultAddr        = "127.0.0.1:0"     // a free loopback port
	defaultPeriodKey   = "billonce_period" // billing.MetaPeriod
	defaultKeyTTL      = 24 * time.Hour
	DefaultSlowDelay   = 2 * time.Second
	defaultDeclineCode = "generic_decline"
)

// Config configures a [Server]. The zero value is a well-behaved fake on a
// free loopback port that accepts any API key and injects no faults.
type Config struct {
	// Addr is the TCP address to listen on. Defaults to 127.0.0.1:0, a
	// free loopback port.
	Addr string

	// APIKeys lists the secret keys the server accepts. Defaults to
	// accepting any non-empty key. Idempotency keys are scoped per API key.
	APIKeys []string

	// RateLimit is the number of /v1 requests per second the server
	// accepts, over all API keys, measured on the wall clock. Excess
	// requests answer 429 rate_limit before the idempotency layer. Defaults
	// to 0: no limit.
	RateLimit float64

	// RateBurst is the token bucket's size. Defaults to RateLimit rounded up
	// (at least 1).
	RateBurst int

	// PeriodKey is the metadata key whose value is a payment's billing
	// period in the ledger. Defaults to "billonce_period", the key billing
	// writes (billing.MetaPeriod).
	PeriodKey string

	// KeyTTL is how long an idempotency key's stored result lives on the
	// server's clock. Defaults to 24 hours, as Stripe.
	KeyTTL time.Duration

	// Script, if set, chooses a fault for every /v1 request not already
	// given one by [Server.FailNext]. It runs on the request's goroutine
	// and must be safe for concurrent use. [RandomFaults] makes one that
	// draws seeded random faults. A zero Fault serves the request normally.
	Script func(Request) Fault

	// Declines maps customer IDs to a decline_code: every payment for those
	// customers is declined with 402 card_error.
	Declines map[string]string

	// Async maps customer IDs to how their payments settle later (see
	// [Async] and [Server.SettleLater]).
	Async map[string]Async

	// IdentifierWindow is how long a meter event's identifier stays
	// taken on the server's clock: a second event with the same identifier
	// within it is refused. Defaults to 24 hours, the least Stripe
	// promises.
	IdentifierWindow time.Duration

	// MeterDelay is how long after acceptance, on the server's clock, a
	// meter event is processed: counted in the meter's event summaries, or
	// rejected into an error report. Defaults to 1 minute.
	// [Server.AggregateNow] processes every event at once.
	MeterDelay time.Duration

	// SearchDelay is how long, on the server's clock, a new charge,
	// payment intent or invoice stays out of search results, as Stripe's
	// search index lags behind writes. Defaults to 0: searchable at once.
	SearchDelay time.Duration
}

// Server is a fake Stripe API listening on a real TCP port. Its methods are
// safe for concurrent use, including while requests are being served.
type Server struct {
	// URL is the base URL, http://ipaddr:port with no trailing slash.
	URL string

	apiKeys   map[string]bool // nil: any key
	periodKey string
	ttl       time.Duration

	ts        *httptest.Server
	closing   chan struct{}
	closeOnce sync.Once
	reqSeq    atomic.Uint64
	inflight  sync.WaitGroup // handlers, including those of hijacked connections

	mu       sync.Mutex
	offset   time.Duration // server clock = wall clock + offset
	keys     map[string]*idemEntry
	seqs     map[string]int // attempts of keyless requests per method+path
	objSeq   uint64
	payments []*Payment
	byID     map[string]*Payment
	perCust  map[string]int
	perPer   map[[2]string]int
	log      []Entry
	stats    Stats
	script   func(Request) Fault
	queue    []queued
	declines map[string]string
	bucket   bucket
	async    map[string]Async
	events   []Event
	evSeq    uint64
	search   time.Duration // Config.SearchDelay
	meters   meterState
	inv      invoiceState
	connect  connectState
	moves    moveState
}

// NewServer starts a server and returns it. Like httptest.NewServer it
// panics if the configuration is invalid or it cannot listen; the message
// says which. Call Close when done.
func NewServer(cfg Config) *Server {
	s, err := newServer(cfg)
	if err != nil {
		panic(err)
	}
	return s
}

func newServer(cfg Config) (*Server, error) {
	b, err := newBucket(cfg.RateLimit, cfg.RateBurst)
	if err != nil {
		return nil, err
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{{"KeyTTL", cfg.KeyTTL}, {"IdentifierWindow", cfg.IdentifierWindow}, {"MeterDelay", cfg.MeterDelay}, {"SearchDelay", cfg.SearchDelay}} {
		if d.v < 0 {
			return nil, fmt.Errorf("billingtest: Config.%s is %v; want a positive duration or 0 for the default", d.name, d.v)
		}
	}
	s := &Server{
		periodKey: orDefault(cfg.PeriodKey, defaultPeriodKey),
		ttl:       cfg.KeyTTL,
		closing:   make(chan struct{}),
		keys:      make(map[string]*idemEntry),
		seqs:      make(map[string]int),
		byID:      make(map[string]*Payment),
		perCust:   make(map[string]int),
		perPer:    make(map[[2]string]int),
		stats:     Stats{Faults: make(map[FaultKind]int64)},
		script:    cfg.Script,
		declines:  make(map[string]string),
		bucket:    b,
		async:     make(map[string]Async),
		search:    cfg.SearchDelay,
		meters:    newMeterState(cfg.IdentifierWindow, cfg.MeterDelay),
		inv:       newInvoiceState(),
		connect:   newConnectState(),
		moves:     moveState{byID: make(map[string]*move)},
	}
	for c, a := range cfg.Async {
		if a.After < 0 {
			return nil, fmt.Errorf("billingtest: Config.Async[%q].After is %v; want a duration >= 0", c, a.After)
		}
		s.async[c] = a
	}
	if s.ttl == 0 {
		s.ttl = defaultKeyTTL
	}
	for c, code := range cfg.Declines {
		s.declines[c] = orDefault(code, defaultDeclineCode)
	}
	if len(cfg.APIKeys) > 0 {
		s.apiKeys = make(map[string]bool, len(cfg.APIKeys))
		for _, k := range cfg.APIKeys {
			if k == "" {
				return nil, errors.New("billingtest: Config.APIKeys holds an empty key; remove it")
			}
			s.apiKeys[k] = true
		}
	}
	ln, err := net.Listen("tcp", orDefault(cfg.Addr, defaultAddr))
	if err != nil {
		return nil, fmt.Errorf("billingtest: listen on %q: %w", orDefault(cfg.Addr, defaultAddr), err)
	}
	// httptest.Server serves and closes: Close closes idle and unused
	// connections at once and waits for requests in progress.
	s.ts = httptest.NewUnstartedServer(http.HandlerFunc(s.serveHTTP))
	s.ts.Listener.Close()
	s.ts.Listener = ln
	s.ts.Config.ReadHeaderTimeout = 10 * time.Second
	s.ts.Start()
	s.URL = s.ts.URL
	return s, nil
}

// Close releases requests held by FaultSlow, stops accepting connections
// and waits for requests in progress to finish. After Close the ledger no
// longer changes.
func (s *Server) Close() {
	s.closeOnce.Do(func() {
		close(s.closing)
		s.ts.Close()
		s.inflight.Wait()
	})
}

// Now returns the time on the server's clock: the wall clock moved forward
// by every [Server.Advance].
func (s *Server) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.now()
}

func (s *Server) now() time.Time { return time.Now().Add(s.offset) }

// Advance moves the server's clock forward by d. Idempotency keys older
// than Config.KeyTTL on that clock are forgotten, asynchronous payments
// whose time has come settle, open invoices with auto_advance on that are
// charged automatically get the payment attempt Stripe's automatic
// collection makes an hour after they were finalized, and meter events
// older than Config.MeterDelay are processed. d must not be negative.
func (s *Server) Advance(d time.Duration) {
	if d < 0 {
		panic(fmt.Sprintf("billingtest: Advance(%v): the clock only moves forward", d))
	}
	s.mu.Lock()
	s.offset += d
	s.settleDue()
	s.collectDue()
	s.processMeterEvents(false)
	s.mu.Unlock()
}

// SetScript replaces Config.Script; nil removes it.
func (s *Server) SetScript(f func(Request) Fault) {
	s.mu.Lock()
	s.script = f
	s.mu.Unlock()
}

// FailNext queues faults for the next requests that match m, one fault per
// matching request, in order. Queued faults win over the script.
func (s *Server) FailNext(m Match, faults ...Fault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, f := range faults {
		if !f.Kind.valid() {
			panic(fmt.Sprintf("billingtest: FailNext: unknown fault kind %q; use one of %v", f.Kind, faultKinds))
		}
		s.queue = append(s.queue, queued{m, f})
	}
}

// Decline makes every later payment for customer fail with 402 card_error
// and the given decline_code (defaultDeclineCode if empty). Results already
// stored under an idempotency key are unaffected. A PaymentIntent declined
// with "authentication_required" (its code too) succeeds when confirmed
// again on session, without off_session: its customer authenticates.
func (s *Server) Decline(customer, declineCode string) {
	s.mu.Lock()
	s.declines[customer] = orDefault(declineCode, defaultDeclineCode)
	s.mu.Unlock()
}

// Honor undoes [Server.Decline] for customer.
func (s *Server) Honor(customer string) {
	s.mu.Lock()
	delete(s.declines, customer)
	s.mu.Unlock()
}

// SetRateLimit changes the rate limiter; perSecond 0 turns it off.
func (s *Server) SetRateLimit(perSecond float64, burst int) error {
	b, err := newBucket(perSecond, burst)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.bucket = b
	s.mu.Unlock()
	return nil
}

// Payments returns a copy of every charge and payment intent created, in
// creation order, declined ones included.
func (s *Server) Payments() []Payment {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Payment, len(s.payments))
	for i, p := range s.payments {
		out[i] = p.clone()
	}
	return out
}

// Count returns how many payments moved money for customer: succeeded
// charges plus succeeded payment intents. This is the exactly-once oracle.
func (s *Server) Count(customer string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perCust[customer]
}

// CountPeriod is [Server.Count] restricted to payments whose metadata holds
// period under Config.PeriodKey.
func (s *Server) CountPeriod(customer, period string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.perPer[[2]string{customer, period}]
}

// Log returns a copy of the request log, in arrival order of completion.
func (s *Server) Log() []Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Entry(nil), s.log...)
}

// Stats returns a copy of the running totals.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.stats
	st.Faults = maps.Clone(s.stats.Faults)
	return st
}

// bucket is a token-bucket rate limiter on the wall clock. Guarded by mu.
type bucket struct {
	rate   float64
	burst  float64
	tokens float64
	last   time.Time
}

func newBucket(rate float64, burst int) (bucket, error) {
	if math.IsNaN(rate) || rate < 0 || math.IsInf(rate, 0) {
		return bucket{}, fmt.Errorf("billingtest: rate limit %v; want requests per second >= 0 (0 turns it off)", rate)
	}
	if burst < 0 {
		return bucket{}, fmt.Errorf("billingtest: rate burst %d; want >= 0 (0 means the rate rounded up)", burst)
	}
	if burst == 0 {
		burst = max(1, int(math.Ceil(rate)))
	}
	return bucket{rate: rate, burst: float64(burst), tokens: float64(burst)}, nil
}

func (b *bucket) allow(now time.Time) bool {
	if b.rate == 0 {
		return true
	}
	if !b.last.IsZero() {
		b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	}
	b.last = now
	if b.tokens < 1 {
		return false
	}
	b.tokens--
	return true
}

func orDefault(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
