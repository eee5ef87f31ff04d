package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/charge"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/retry"
)

// What every scenario bills: one period, one price.
const (
	period    = "2026-09"
	amount    = 1999
	currency  = "usd"
	secretKey = "sk_test_failure_modes"
)

// A scenario is one failure mode: the unsafe code and billonce, each run
// against its own fresh fake Stripe. Both must bill every customer once.
type scenario struct {
	id        string // short name, for tests
	name      string
	customers []string
	naive     func(ctx context.Context, e *env) error
	billonce  func(ctx context.Context, e *env) error
	// count is what the fake counts for a customer: payments by default;
	// meter events, or invoices and lines, for the other ways of billing.
	count func(fake *billingtest.Server, customer string) int
	// want is how many of what count counts each customer's right answer
	// holds: 1 when 0 (one charge, one refund), 2 for two refunds owed.
	want int
}

// env is what one side of a scenario runs against: a fresh fake Stripe and
// a PostgreSQL schema of its own. A side returns an error only when the
// gallery itself breaks (database down, unexpected answer); the charges it
// makes or misses are read from the fake's ledger afterwards.
type env struct {
	stripe *billingtest.Server
	dbURL  string
	pool   *pgxpool.Pool // for the table of the unsafe code and for test setup
	schema string        // quoted; holds this side's tables
	logf   func(format string, args ...any)
	pools  []*pgxpool.Pool // closed when the side ends
}

// newPool opens a connection pool of its own, as a separate replica would
// have; it is closed when the side ends.
func (e *env) newPool(ctx context.Context) (*pgxpool.Pool, error) {
	p, err := pgxpool.New(ctx, e.dbURL)
	if err != nil {
		return nil, err
	}
	e.pools = append(e.pools, p)
	return p, nil
}

// tally is what the fake's ledger says about a scenario's customers.
type tally struct {
	Charges   int // payments that moved money
	Billed    int // customers charged at least once
	Customers int
}

func (t tally) String() string {
	if t.Customers == 1 {
		return fmt.Sprint(t.Charges)
	}
	return fmt.Sprintf("%d (%d of %d billed)", t.Charges, t.Billed, t.Customers)
}

// exactlyOnce is the right answer: every customer charged once, or
// refunded want times (each refund owed made once).
func exactlyOnce(customers int) tally {
	return tally{Charges: customers, Billed: customers, Customers: customers}
}

// expected is s's right answer.
func (s scenario) expected() tally {
	t := exactlyOnce(len(s.customers))
	t.Charges *= max(s.want, 1)
	return t
}

// row is a scenario's measured outcome.
type row struct {
	name            string
	naive, billonce tally
	expected        tally
}

// measure runs both sides of s, each on a fresh fake and schema, and counts
// their charges at the fake.
func measure(ctx context.Context, pool *pgxpool.Pool, dbURL string, n int, s scenario, logf func(string, ...any)) (row, error) {
	r := row{name: s.name, expected: s.expected()}
	count := s.count
	if count == nil {
		count = (*billingtest.Server).Count
	}
	var err error
	if r.naive, err = side(ctx, pool, dbURL, fmt.Sprintf("failure_modes_%d_naive", n), s.customers, s.naive, count, logf); err != nil {
		return r, fmt.Errorf("%s, unsafe code: %w", s.name, err)
	}
	if r.billonce, err = side(ctx, pool, dbURL, fmt.Sprintf("failure_modes_%d_billonce", n), s.customers, s.billonce, count, logf); err != nil {
		return r, fmt.Errorf("%s, billonce: %w", s.name, err)
	}
	return r, nil
}

func side(ctx context.Context, pool *pgxpool.Pool, dbURL, schema string, customers []string,
	run func(context.Context, *env) error, count func(*billingtest.Server, string) int, logf func(string, ...any)) (tally, error) {
	quoted := pgx.Identifier{schema}.Sanitize()
	if _, err := pool.Exec(ctx, "DROP SCHEMA IF EXISTS "+quoted+" CASCADE; CREATE SCHEMA "+quoted); err != nil {
		return tally{}, err
	}
	defer pool.Exec(context.WithoutCancel(ctx), "DROP SCHEMA IF EXISTS "+quoted+" CASCADE")
	fake := billingtest.NewServer(billingtest.Config{})
	defer fake.Close()
	e := &env{stripe: fake, dbURL: dbURL, pool: pool, schema: quoted, logf: logf}
	defer func() {
		for _, p := range e.pools {
			p.Close() // safe after a crash already closed it
		}
	}()
	if err := run(ctx, e); err != nil {
		return tally{}, err
	}
	t := tally{Customers: len(customers)}
	for _, c := range customers {
		n := count(fake, c)
		t.Charges += n
		if n > 0 {
			t.Billed++
		}
	}
	return t, nil
}

// ---- billonce side ----

// biller returns a Biller on e's fake and a claim store in e's schema, with
// its own connection pool, as a separate replica would have. Retry waits
// are tiny so the gallery runs fast.
func (e *env) biller(ctx context.Context, owner string, tune func(*billing.Config, *claim.Config)) (*billing.Biller, error) {
	pool, err := e.newPool(ctx)
	if err != nil {
		return nil, err
	}
	return e.billerOn(ctx, pool, owner, tune)
}

func (e *env) billerOn(ctx context.Context, pool *pgxpool.Pool, owner string, tune func(*billing.Config, *claim.Config)) (*billing.Biller, error) {
	ccfg := claim.Config{Schema: unquote(e.schema)}
	cfg := billing.Config{
		SecretKey: secretKey,
		StripeURL: e.stripe.URL,
		Owner:     owner,
		Price: func(context.Context, string, string) (billing.Price, error) {
			return billing.Price{Amount: amount, Currency: currency}, nil
		},
		Retry: retry.Policy{
			InitialInterval: 5 * time.Millisecond,
			MaxInterval:     50 * time.Millisecond,
			AttemptTimeout:  2 * time.Second,
			MaxElapsed:      20 * time.Second,
		},
	}
	if tune != nil {
		tune(&cfg, &ccfg)
	}
	store, err := claim.NewPostgres(pool, ccfg)
	if err != nil {
		return nil, err
	}
	if err := store.Migrate(ctx); err != nil {
		return nil, err
	}
	cfg.Claims = store
	return billing.New(cfg)
}

func unquote(quoted string) string { return quoted[1 : len(quoted)-1] }

// ---- unsafe side: what teams write before they are bitten ----

// stripeClient is a plain stripe-go charges client on the fake, with
// stripe-go's own retries off, as most services configure it.
func (e *env) stripeClient(hc *http.Client) *charge.Client {
	if hc == nil {
		hc = &http.Client{Transport: newTransport(), Timeout: 30 * time.Second}
	}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(e.stripe.URL),
		HTTPClient:        hc,
		MaxNetworkRetries: stripe.Int64(0),
		LeveledLogger:     quiet{},
	})
	return &charge.Client{B: b, Key: secretKey}
}

// chargeParams is what the unsafe code sends for a customer. key "" leaves
// the key to whatever layer sets one.
func chargeParams(ctx context.Context, customer, key string) *stripe.ChargeParams {
	p := &stripe.ChargeParams{
		Amount:   stripe.Int64(amount),
		Currency: stripe.String(currency),
		Customer: stripe.String(customer),
	}
	p.Context = ctx
	if key != "" {
		p.IdempotencyKey = stripe.String(key)
	}
	return p
}

// billedTable creates the unsafe code's record of who was billed. Its
// primary key does not help: the charge is made before the row is written.
func (e *env) billedTable(ctx context.Context) error {
	_, err := e.pool.Exec(ctx, "CREATE TABLE "+e.schema+".billed (customer text, period text, charge_id text, PRIMARY KEY (customer, period))")
	return err
}

func (e *env) alreadyBilled(ctx context.Context, db *pgxpool.Pool, customer string) (bool, error) {
	var n int
	err := db.QueryRow(ctx, "SELECT count(*) FROM "+e.schema+".billed WHERE customer = $1 AND period = $2", customer, period).Scan(&n)
	return n > 0, err
}

func (e *env) markBilled(ctx context.Context, db *pgxpool.Pool, customer, chargeID string) error {
	_, err := db.Exec(ctx, "INSERT INTO "+e.schema+".billed VALUES ($1, $2, $3)", customer, period, chargeID)
	return err
}

// retryingTransport is the kind of resilience middleware many services put
// under their HTTP clients: it resends a request on a network error or a
// 5xx, reading each response whole so that a connection cut mid-body is
// retried too.
type retryingTransport struct {
	Base     http.RoundTripper
	Attempts int
}

func (t *retryingTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		var err error
		if body, err = io.ReadAll(req.Body); err != nil {
			return nil, err
		}
		req.Body.Close()
	}
	var lastErr error
	for attempt := 1; attempt <= t.Attempts; attempt++ {
		r := req.Clone(req.Context())
		r.Body = io.NopCloser(bytes.NewReader(body))
		resp, err := t.Base.RoundTrip(r)
		if err == nil {
			var buf []byte
			buf, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode < 500 {
				resp.Body = io.NopCloser(bytes.NewReader(buf))
				return resp, nil
			}
			if err == nil {
				err = fmt.Errorf("HTTP %d", resp.StatusCode)
			}
		}
		lastErr = err
		select {
		case <-req.Context().Done():
			return nil, req.Context().Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
	return nil, lastErr
}

// holdNextCharge makes the fake commit the next POST /v1/charges and then
// hold its answer until release is closed; arrived is closed when the
// request reaches the fake. It lets a scenario "crash" a replica while
// Stripe has charged and the replica has not heard back yet.
func holdNextCharge(fake *billingtest.Server) (arrived <-chan struct{}, release chan struct{}) {
	a, rel := make(chan struct{}), make(chan struct{})
	var once sync.Once
	fake.SetScript(func(r billingtest.Request) billingtest.Fault {
		held := false
		if r.Method == http.MethodPost && r.Path == "/v1/charges" {
			once.Do(func() { held = true; close(a) })
		}
		if held {
			return billingtest.Fault{Kind: billingtest.FaultSlow, Release: rel}
		}
		return billingtest.Fault{}
	})
	return a, rel
}

// crashDuringCharge runs replica until its first charge reaches the fake,
// then kills its database access (its pool closes: nothing it does
// afterwards reaches PostgreSQL, as after SIGKILL) and lets Stripe answer.
// It returns what replica returned.
func crashDuringCharge(ctx context.Context, e *env, db *pgxpool.Pool, replica func() error) error {
	arrived, release := holdNextCharge(e.stripe)
	defer e.stripe.SetScript(nil)
	done := make(chan error, 1)
	go func() { done <- replica() }()
	select {
	case <-arrived:
	case err := <-done:
		return fmt.Errorf("the replica finished before its charge reached Stripe: %v", err)
	case <-ctx.Done():
		return ctx.Err()
	}
	db.Close()
	close(release)
	return <-done
}

// newTransport is a transport of its own, so no scenario reuses another's
// connections.
func newTransport() *http.Transport { return http.DefaultTransport.(*http.Transport).Clone() }

// quiet keeps stripe-go from logging to stderr.
type quiet struct{}

func (quiet) Debugf(string, ...any) {}
func (quiet) Errorf(string, ...any) {}
func (quiet) Infof(string, ...any)  {}
func (quiet) Warnf(string, ...any)  {}
