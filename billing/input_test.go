package billing_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/lock"
	"github.com/billonce/billonce/retry"
)

// Bad input is refused before anything is claimed or sent, with an error
// that wraps ErrInvalid and names what to fix.
func TestBadInputRejectedBeforeAnyRequest(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	intents := e.biller(func(c *billing.Config) { c.API = billing.PaymentIntents })
	noPrice := e.biller(func(c *billing.Config) { c.Price = nil })
	ctx := context.Background()
	usd := func(a int64) billing.Price { return billing.Price{Amount: a, Currency: "usd"} }
	charge := func(customer, period string) func() error {
		return func() error { _, err := e.b.Charge(ctx, customer, period, nil); return err }
	}
	withPrice := func(p billing.Price) func() error {
		return func() error {
			_, err := e.b.Charge(ctx, "cus_ok", period, &billing.ChargeOptions{Price: ptr(p)})
			return err
		}
	}
	cases := []struct {
		name string
		call func() error
		want string // a word of the message that says what was wrong
	}{
		{"empty customer", charge("", period), "customer ID is empty"},
		{"oversized customer", charge(strings.Repeat("c", 256), period), "limit is 255"},
		{"customer with a space", charge("cus 1", period), "white space"},
		{"customer with a trailing newline", charge("cus_1\n", period), "white space"},
		{"customer with invalid UTF-8", charge("cus_\xff", period), "invalid UTF-8"},
		{"month 13", charge("cus_ok", "2026-13"), "2026-13"},
		{"one-digit month", charge("cus_ok", "2026-9"), "like 2026-09"},
		{"month first", charge("cus_ok", "09-2026"), "like 2026-09"},
		{"empty period", charge("cus_ok", ""), "like 2026-09"},
		{"February 30", charge("cus_ok", "2026-02-30"), "not a calendar day"},
		{"September 31", charge("cus_ok", "2026-09-31"), "not a calendar day"},
		{"zero amount", withPrice(usd(0)), "must be a positive"},
		{"negative amount", withPrice(usd(-100)), "must be a positive"},
		{"huge amount", withPrice(usd(100_000_000)), "largest amount"},
		{"max int64 amount", withPrice(usd(math.MaxInt64)), "largest amount"},
		{"unknown currency", withPrice(billing.Price{Amount: 100, Currency: "xyz"}), "ISO code"},
		{"empty currency", withPrice(billing.Price{Amount: 100}), "ISO code"},
		{"four-letter currency", withPrice(billing.Price{Amount: 100, Currency: "usdd"}), "ISO code"},
		{"PaymentIntents without a payment method", func() error {
			_, err := intents.Charge(ctx, "cus_ok", period, &billing.ChargeOptions{Price: ptr(usd(100))})
			return err
		}, "PaymentMethod"},
		{"PaymentIntents with a bad payment method", func() error {
			_, err := intents.Charge(ctx, "cus_ok", period, &billing.ChargeOptions{Price: ptr(billing.Price{Amount: 100, Currency: "usd", PaymentMethod: "pm 1"})})
			return err
		}, "payment method"},
		{"no price configured", func() error { _, err := noPrice.Charge(ctx, "cus_ok", period, nil); return err }, "Config.Price"},
		{"Rebill attempt 1", func() error { _, err := e.b.Rebill(ctx, "cus_ok", period, 1, nil); return err }, "from 2"},
		{"Rebill attempt 0", func() error { _, err := e.b.Rebill(ctx, "cus_ok", period, 0, nil); return err }, "from 2"},
		{"Rebill attempt -1", func() error { _, err := e.b.Rebill(ctx, "cus_ok", period, -1, nil); return err }, "from 2"},
		{"Run with a nil iterator", func() error { _, err := e.b.Run(ctx, period, nil, nil); return err }, "iterator"},
		{"Run with a bad period", func() error { _, err := e.b.Run(ctx, "2026-9", billing.Customers("cus_ok"), nil); return err }, "like 2026-09"},
		{"Run with negative concurrency", func() error {
			_, err := e.b.Run(ctx, period, billing.Customers("cus_ok"), &billing.RunOptions{Concurrency: -1})
			return err
		}, "Concurrency"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := c.call()
			if !errors.Is(err, billing.ErrInvalid) {
				t.Fatalf("got %v; want an error wrapping ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
	if n := e.srv.Stats().Requests; n != 0 {
		t.Fatalf("%d requests reached Stripe; bad input must be refused first", n)
	}
	if n := e.claimRows(); n != 0 {
		t.Fatalf("%d claim rows written for bad input", n)
	}
}

// A price function's error stops that customer before anything is claimed.
func TestPriceErrorStopsBeforeClaim(t *testing.T) {
	t.Parallel()
	boom := errors.New("pricing service down")
	e := newEnv(t, func(c *billing.Config) {
		c.Price = func(context.Context, string, string) (billing.Price, error) { return billing.Price{}, boom }
	})
	if _, err := e.b.Charge(context.Background(), "cus_p", period, nil); !errors.Is(err, boom) {
		t.Fatalf("Charge: %v; want the price error", err)
	}
	if n, r := e.claimRows(), e.srv.Stats().Requests; n != 0 || r != 0 {
		t.Fatalf("%d claims, %d requests; want none", n, r)
	}
}

// A currency in capitals is Stripe's currency all the same.
func TestUpperCaseCurrencyIsAccepted(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	r, err := e.b.Charge(context.Background(), "cus_u", period, &billing.ChargeOptions{Price: ptr(billing.Price{Amount: 100, Currency: "EUR"})})
	if err != nil || r.Currency != "eur" {
		t.Fatalf("Charge with a price: %+v, %v; want eur", r, err)
	}
	if p := e.srv.Payments()[0]; p.Currency != "eur" {
		t.Fatalf("Stripe got currency %q", p.Currency)
	}
}

func TestNewRejectsBadConfig(t *testing.T) {
	t.Parallel()
	store := claim.NewMemory(claim.Config{})
	ok := func() billing.Config { return billing.Config{SecretKey: secretKey, Claims: store} }
	cases := []struct {
		name string
		mod  func(*billing.Config)
		want string
	}{
		{"empty SecretKey", func(c *billing.Config) { c.SecretKey = "" }, "SecretKey is empty"},
		{"SecretKey with a newline", func(c *billing.Config) { c.SecretKey = secretKey + "\n" }, "white space"},
		{"nil Claims", func(c *billing.Config) { c.Claims = nil }, "Claims is nil"},
		{"unknown API", func(c *billing.Config) { c.API = "invoices" }, "billing.Charges"},
		{"Scope with a space", func(c *billing.Config) { c.Scope = " monthly" }, "Scope"},
		{"Scope too long", func(c *billing.Config) { c.Scope = strings.Repeat("s", 65) }, "Scope"},
		{"negative WindowMargin", func(c *billing.Config) { c.WindowMargin = -time.Hour }, "WindowMargin"},
		{"WindowMargin of a day", func(c *billing.Config) { c.WindowMargin = 24 * time.Hour }, "WindowMargin"},
		{"negative InProgressWait", func(c *billing.Config) { c.InProgressWait = -time.Second }, "InProgressWait"},
		{"retry budget past the key window", func(c *billing.Config) { c.Retry = retry.Policy{MaxElapsed: 25 * time.Hour} }, "Retry"},
		{"Owner with a space", func(c *billing.Config) { c.Owner = "pod 1" }, "Owner"},
		{"RateLimit NaN", func(c *billing.Config) { c.RateLimit = math.NaN() }, "RateLimit"},
		{"RateLimit infinite", func(c *billing.Config) { c.RateLimit = math.Inf(1) }, "RateLimit"},
		{"StripeURL without a scheme", func(c *billing.Config) { c.StripeURL = "api.stripe.com" }, "scheme"},
		{"StripeURL ftp", func(c *billing.Config) { c.StripeURL = "ftp://api.stripe.com" }, "scheme"},
		{"StripeURL without a host", func(c *billing.Config) { c.StripeURL = "https:///v1" }, "no host"},
		{"StripeURL with a query", func(c *billing.Config) { c.StripeURL = "https://api.stripe.com/?x=1" }, "query"},
		{"StripeURL with user info", func(c *billing.Config) { c.StripeURL = "https://sk_live_x@api.stripe.com" }, "SecretKey"},
		{"StripeURL unparseable", func(c *billing.Config) { c.StripeURL = "https://api.stripe.com:port" }, "https://api.stripe.com:port"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			cfg := ok()
			c.mod(&cfg)
			b, err := billing.New(cfg)
			if !errors.Is(err, billing.ErrInvalid) || b != nil {
				t.Fatalf("New: %v, %v; want an error wrapping ErrInvalid", b, err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q does not say %q", err, c.want)
			}
		})
	}
	for _, rl := range []float64{math.Inf(-1), -1, 0, 0.5, 80, 1000, 10_000} {
		cfg := ok()
		cfg.RateLimit = rl
		if _, err := billing.New(cfg); err != nil {
			t.Errorf("RateLimit %v: %v", rl, err)
		}
	}
}

// noPanic runs f and turns a panic into an error, so that one odd input
// does not hide the others.
func noPanic(f func() error) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("panicked: %v", p)
		}
	}()
	return f()
}

// Values no one means, but a typo, an unchecked error or an overflow can
// produce, are refused by every public entry point with an error wrapping
// ErrInvalid, never a panic or an absurd run: nothing is sent, nothing
// is claimed.
func TestOddInputsRefusedWithoutPanic(t *testing.T) {
	t.Parallel()
	e := newEnv(t)
	ctx := context.Background()
	ids := billing.Customers("cus_odd_1", "cus_odd_2")
	run := func(o billing.RunOptions) func() error {
		return func() error { _, err := e.b.Run(ctx, period, ids, &o); return err }
	}
	// newThenCharge builds a Biller from the env's config changed by mod and,
	// if New takes it, charges one customer with it.
	newThenCharge := func(mod func(*billing.Config)) func() error {
		return func() error {
			cfg := billing.Config{SecretKey: secretKey, StripeURL: e.srv.URL, Claims: e.store, Price: flatPrice(amount),
				HTTPClient: &http.Client{Transport: testTransport}, Retry: fastRetry()}
			mod(&cfg)
			b, err := billing.New(cfg)
			if err != nil {
				return err
			}
			_, err = b.Charge(ctx, "cus_odd_new", period, nil)
			return err
		}
	}
	var nilAdvisory *lock.Advisory // what `guard, _ := lock.NewAdvisory(nil, ...)` leaves
	var nilLease *lock.Lease
	advisory, err := lock.NewAdvisory(e.pool, lock.AdvisoryConfig{})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		call func() error
	}{
		{"Run BatchSize math.MaxInt", run(billing.RunOptions{BatchSize: math.MaxInt})},
		{"Run BatchSize 1<<40", run(billing.RunOptions{BatchSize: 1 << 40})},
		{"Run Concurrency 1<<40", run(billing.RunOptions{Concurrency: 1 << 40})},
		{"Run Concurrency math.MaxInt", run(billing.RunOptions{Concurrency: math.MaxInt})},
		{"Run Concurrency MaxConcurrency+1", run(billing.RunOptions{Concurrency: 1000 + 1})},
		{"Run BatchSize MaxBatchSize+1", run(billing.RunOptions{BatchSize: 10_000 + 1})},
		{"Run Lock a nil *lock.Advisory", run(billing.RunOptions{Lock: nilAdvisory})},
		{"Run Lock a nil *lock.Lease", run(billing.RunOptions{Lock: nilLease})},
		{"Run LockName too long for the lock", run(billing.RunOptions{Lock: advisory, LockName: strings.Repeat("n", 300)})},
		{"New RateLimit 1e300", newThenCharge(func(c *billing.Config) { c.RateLimit = 1e300 })},
		{"New RateLimit math.MaxFloat64", newThenCharge(func(c *billing.Config) { c.RateLimit = math.MaxFloat64 })},
		{"New RateLimit above MaxRateLimit", newThenCharge(func(c *billing.Config) { c.RateLimit = 10_000 + 0.5 })},
		{"New Claims a nil *claim.Postgres", newThenCharge(func(c *billing.Config) { c.Claims = (*claim.Postgres)(nil) })},
		{"New HTTPClient with a nil *http.Transport", newThenCharge(func(c *billing.Config) {
			c.HTTPClient = &http.Client{Transport: (*http.Transport)(nil)}
		})},
		{"New Logger without a handler", newThenCharge(func(c *billing.Config) { c.Logger = &slog.Logger{} })},
		{"Rebill attempt math.MaxInt", func() error {
			_, err := e.b.Rebill(ctx, "cus_odd_rebill", period, math.MaxInt, nil)
			return err
		}},
		{"spendcap.NewTransport Base a nil *http.Transport", func() error {
			_, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com", VaultKey: "vault_key_0001",
				Base: (*http.Transport)(nil)})
			return err
		}},
		{"spendcap.Client on a client with a nil *http.Transport", func() error {
			_, err := spendcap.Client("https://proxy.example.com", "vault_key_0001", &http.Client{Transport: (*http.Transport)(nil)})
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := noPanic(c.call)
			want := billing.ErrInvalid
			if strings.HasPrefix(c.name, "spendcap.") {
				want = spendcap.ErrInvalid
			}
			if !errors.Is(err, want) {
				t.Fatalf("got %v; want an error wrapping %v", err, want)
			}
		})
	}
	if n := len(e.srv.Log()); n != 0 {
		t.Errorf("%d requests reached Stripe; odd input must be refused first", n)
	}
	if n := e.claimRows(); n != 0 {
		t.Errorf("%d claim rows written for odd input", n)
	}

	// The bounds themselves are accepted.
	sum, err := e.b.Run(ctx, period, ids, &billing.RunOptions{Concurrency: 1000, BatchSize: 10_000})
	if err != nil || sum.Created != 2 {
		t.Fatalf("Run at the bounds: %+v, %v", sum.Progress, err)
	}
	if err := newThenCharge(func(c *billing.Config) { c.RateLimit = 10_000 })(); err != nil {
		t.Fatalf("Charge with RateLimit MaxRateLimit: %v", err)
	}
	wantAllOnceOf(t, e, []string{"cus_odd_1", "cus_odd_2", "cus_odd_new"})
}

func ptr[T any](v T) *T { return &v }
