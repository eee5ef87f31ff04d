// Command monthly-billing is a monthly billing cron job built on billonce:
// it charges every customer once for a period, under a lock, and can be run
// again, killed, or run on several replicas at once without charging anyone
// twice.
//
// With no flags it is a self-contained demo: an in-process fake Stripe and a
// throwaway PostgreSQL, 1,000 demo customers, the run, then the same run
// again to show that it creates nothing new. -by invoice bills each
// customer by one Stripe invoice instead of a charge; -usage then reports
// each demo customer's usage of the last whole hour to a demo meter,
// exactly once. Given a Stripe key, -stripe-url or a spend-cap proxy it
// needs a database (-database-url or DATABASE_URL): a throwaway one would
// forget who was billed.
//
//	go run ./examples/monthly-billing
//	go run ./examples/monthly-billing -by invoice -usage
//	go run ./examples/monthly-billing -database-url postgres://... -stripe-key sk_test_... -customers-file customers.csv
//	go run ./examples/monthly-billing -database-url postgres://... -vault-proxy-url https://proxy.example.com/stripe -vault-key ... -customers-file customers.csv
//
// Its exit status follows the table every billonce program shares
// (billing/cmd/billonce/README.md#exit-status); the demo adds one case to
// 1, stopped: its fake Stripe's ledger disagreeing with the runs.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"iter"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
	"github.com/billonce/billonce/lock"
)

// Exit statuses: the table every billonce program shares
// (billing/cmd/billonce/README.md#exit-status).
const (
	exitOK         = 0 // every customer is billed or was already billed
	exitStopped    = 1 // an answer that stops runs, or another error ended the program early
	exitUsage      = 2 // bad flags or input, or no database given: nothing was charged
	exitLockHeld   = 3 // another runner holds the lock for the period: nothing was charged by this one
	exitIncomplete = 4 // finished with customers not billed (declined, pending, invalid)
)

// demoKey is the API key the program gives its in-process fake Stripe.
const demoKey = "sk_test_billonce_demo"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

type options struct {
	databaseURL   string
	stripeKey     string
	stripeURL     string
	vaultProxyURL string
	vaultKey      string
	proxyClient   *http.Client // set when vaultProxyURL is
	period        string
	customers     int
	customersFile string
	demoDeclines  int
	api           billing.API
	scope         string
	concurrency   int
	rate          float64
	lease         time.Duration
	useLock       bool
	json          bool
	webhookAddr   string
	webhookSecret string
	demoBank      int
	by            string // charge or invoice
	usage         bool
}

// demo reports whether the program runs against its own in-process fake
// Stripe.
func (o *options) demo() bool { return o.stripeURL == "" && o.stripeKey == "" && !o.vault() }

// vault reports whether requests go through a spend-cap proxy.
func (o *options) vault() bool { return o.vaultProxyURL != "" || o.vaultKey != "" }

// parseFlags parses args; -h prints the flags on stdout, a bad flag on
// stderr.
func parseFlags(args []string, stdout, stderr io.Writer) (*options, error) {
	o := &options{}
	fs := flag.NewFlagSet("monthly-billing", flag.ContinueOnError)
	var help bytes.Buffer
	fs.SetOutput(&help)
	// Defaults that come from the environment are applied after parsing, so
	// that -h never prints a secret.
	fs.StringVar(&o.databaseURL, "database-url", "", "PostgreSQL connection string (default $DATABASE_URL; required with a Stripe key, -stripe-url or a proxy; the demo alone starts a throwaway cluster)")
	fs.StringVar(&o.stripeKey, "stripe-key", "", "Stripe secret or restricted key (default $STRIPE_SECRET_KEY; with neither this nor -stripe-url, an in-process fake Stripe)")
	fs.StringVar(&o.stripeURL, "stripe-url", "", "Stripe API base URL, for a proxy or a Stripe-compatible server (default "+billing.DefaultStripeURL+" when -stripe-key is set)")
	fs.StringVar(&o.vaultProxyURL, "vault-proxy-url", "", "base URL of a spend-cap proxy that holds the Stripe secret (default $VAULT_PROXY_URL); needs -vault-key, replaces -stripe-key and -stripe-url")
	fs.StringVar(&o.vaultKey, "vault-key", "", "the proxy's vault key for this run (default $VAULT_KEY); never printed")
	fs.StringVar(&o.period, "period", time.Now().UTC().Format("2006-01"), "billing period: a month (2026-09) or a day (2026-09-15)")
	fs.IntVar(&o.customers, "customers", 1000, "number of demo customers (cus_demo_0001, ...)")
	fs.StringVar(&o.customersFile, "customers-file", "", "CSV of customer ID, amount in minor units, currency[, payment method]; optional header row")
	fs.IntVar(&o.demoDeclines, "demo-declines", 0, "make this many demo customers' cards decline (in-process fake Stripe only)")
	api := fs.String("api", string(billing.Charges), "Stripe API: charges or payment_intents")
	fs.StringVar(&o.scope, "scope", billing.DefaultScope, "first part of every idempotency key; never change it while claims are pending")
	fs.IntVar(&o.concurrency, "concurrency", billing.DefaultConcurrency, "customers charged at once")
	fs.Float64Var(&o.rate, "rate", billing.DefaultRateLimit, "Stripe requests per second, at most; negative: no limit")
	fs.DurationVar(&o.lease, "lease", claim.DefaultLease, "how long a claim stays this runner's before another may resume it (after a crash, its customers wait this long)")
	fs.BoolVar(&o.useLock, "lock", true, "take the PostgreSQL advisory lock for the period, so that one runner does the work (claims keep it correct without)")
	fs.StringVar(&o.webhookAddr, "webhook-addr", "", "serve Stripe's webhook events on this address (host:port, any path) while the job runs, so that bank debits settle on their claims; needs -webhook-secret")
	fs.StringVar(&o.webhookSecret, "webhook-secret", "", "the webhook endpoint's signing secret, whsec_… (default $STRIPE_WEBHOOK_SECRET); never printed")
	fs.IntVar(&o.demoBank, "demo-bank-debits", 0, "make this many demo customers pay by bank debit: processing after the run, settling three days later, the last one failing (in-process fake Stripe only)")
	fs.StringVar(&o.by, "by", "charge", "bill each customer by charge (one charge or PaymentIntent) or by invoice (one Stripe invoice with one line, paid at once)")
	fs.BoolVar(&o.usage, "usage", false, "then report each demo customer's API calls of the last whole hour on a meter the demo creates, exactly once (in-process fake Stripe only)")
	fs.BoolVar(&o.json, "json", false, "print one JSON object summarising the run on stdout; everything else goes to stderr")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			stdout.Write(help.Bytes())
		} else {
			stderr.Write(help.Bytes())
		}
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected argument %q: every setting is a flag (see -h)", fs.Arg(0))
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, d := range []struct {
		flag string
		v    *string
		env  string
	}{{"database-url", &o.databaseURL, "DATABASE_URL"}, {"stripe-key", &o.stripeKey, "STRIPE_SECRET_KEY"},
		{"vault-proxy-url", &o.vaultProxyURL, "VAULT_PROXY_URL"}, {"vault-key", &o.vaultKey, "VAULT_KEY"}} {
		if !set[d.flag] {
			*d.v = os.Getenv(d.env)
		}
	}
	if !set["webhook-secret"] {
		o.webhookSecret = os.Getenv("STRIPE_WEBHOOK_SECRET")
	}
	o.api = billing.API(*api)
	if err := o.check(set["customers"]); err != nil {
		return o, err
	}
	if o.vault() {
		// Idle connections for every worker, as billing's default transport
		// keeps.
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = max(o.concurrency, 2)
		hc, err := spendcap.Client(o.vaultProxyURL, o.vaultKey, &http.Client{Transport: t})
		if err != nil {
			return o, errors.New(vaultFlags.Replace(reason(err)))
		}
		o.proxyClient = hc
	}
	// The claims are what keep a customer from being billed twice: a
	// throwaway database forgets them when the program exits, so the next
	// run would bill everyone again. Only the demo, whose fake Stripe goes
	// with it, may use one.
	if !o.demo() && o.databaseURL == "" {
		return o, errors.New("a Stripe key, -stripe-url or a spend-cap proxy is given but no database: pass -database-url or set DATABASE_URL to the PostgreSQL that keeps the claims (a throwaway database is for the demo alone, with no Stripe credentials: the next run would bill everyone again)")
	}
	if o.databaseURL != "" {
		if _, err := pgxpool.ParseConfig(o.databaseURL); err != nil {
			return o, errConnString
		}
	}
	return o, nil
}

// errConnString is a database URL that does not parse; the error does not
// quote it, since it may carry a password.
var errConnString = errors.New("the database connection string does not parse: want postgres://user:password@host:5432/dbname")

// check reports the first setting that cannot work, or that contradicts
// another; customersSet says whether -customers was given.
func (o *options) check(customersSet bool) error {
	for _, c := range []struct {
		bad bool
		msg string
	}{
		{o.api != billing.Charges && o.api != billing.PaymentIntents, fmt.Sprintf("-api %q: use charges or payment_intents", o.api)},
		{o.vault() && o.vaultKey == "", "-vault-proxy-url is set but there is no vault key: pass -vault-key or set VAULT_KEY"},
		{o.vault() && o.vaultProxyURL == "", "-vault-key is set but there is no proxy: pass -vault-proxy-url or set VAULT_PROXY_URL"},
		{o.vault() && o.stripeKey != "", "a Stripe key (-stripe-key or STRIPE_SECRET_KEY) and a spend-cap proxy both given: behind the proxy this process needs no Stripe secret, and should not hold one; drop -stripe-key or unset STRIPE_SECRET_KEY for this job"},
		{o.vault() && o.stripeURL != "", "-stripe-url and -vault-proxy-url both given: every request goes to the proxy; drop -stripe-url"},
		{o.stripeURL != "" && o.stripeKey == "", "-stripe-url is set but there is no key: pass -stripe-key or set STRIPE_SECRET_KEY"},
		{customersSet && o.customersFile != "", "-customers and -customers-file both given: bill demo customers or the file's, not both"},
		{o.customers <= 0, fmt.Sprintf("-customers %d: want at least 1", o.customers)},
		{o.demoDeclines < 0 || o.demoDeclines > o.customers, fmt.Sprintf("-demo-declines %d: want 0 to %d (the number of demo customers)", o.demoDeclines, o.customers)},
		{o.demoDeclines > 0 && (!o.demo() || o.customersFile != ""), "-demo-declines works only with the in-process fake Stripe and demo customers (no -stripe-url, -stripe-key, -vault-proxy-url or -customers-file)"},
		{o.demoBank < 0 || o.demoBank > o.customers, fmt.Sprintf("-demo-bank-debits %d: want 0 to %d (the number of demo customers)", o.demoBank, o.customers)},
		{o.demoBank > 0 && (!o.demo() || o.customersFile != ""), "-demo-bank-debits works only with the in-process fake Stripe and demo customers (no -stripe-url, -stripe-key, -vault-proxy-url or -customers-file)"},
		{o.by != "charge" && o.by != "invoice", fmt.Sprintf("-by %q: use charge or invoice", o.by)},
		{o.by == "invoice" && o.api != billing.Charges, "-by invoice and -api payment_intents: Stripe pays an invoice itself, with the customer's default payment method; drop -api"},
		{o.by == "invoice" && o.vault(), "-by invoice and a spend-cap proxy: the proxy caps charges by their amount, and paying an invoice carries none; bill by charge behind the proxy"},
		{o.by == "invoice" && o.demoBank > 0, "-demo-bank-debits bills by charge: drop -by invoice"},
		{o.usage && (!o.demo() || o.customersFile != ""), "-usage reports demo usage to a meter the demo creates on its in-process fake Stripe: drop -stripe-url, -stripe-key, -vault-proxy-url and -customers-file"},
		{o.webhookAddr != "" && o.webhookSecret == "" && !o.demo(), "-webhook-addr is set but there is no signing secret: pass -webhook-secret or set STRIPE_WEBHOOK_SECRET (the endpoint's whsec_… from the Stripe dashboard)"},
		{o.concurrency <= 0, fmt.Sprintf("-concurrency %d: want at least 1", o.concurrency)},
		{o.rate == 0, "-rate 0 would never send anything: want requests per second, or a negative number for no limit"},
		{o.lease < time.Second, fmt.Sprintf("-lease %v: want at least 1s", o.lease)},
	} {
		if c.bad {
			return errors.New(c.msg)
		}
	}
	if err := billing.ValidatePeriod(o.period); err != nil {
		return fmt.Errorf("-period: %w", err)
	}
	if o.stripeURL != "" {
		u, err := url.Parse(o.stripeURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			// Not printed: the flag may carry a password or key.
			return fmt.Errorf("-stripe-url: want an absolute http or https URL such as https://api.stripe.com")
		}
	}
	return nil
}

// vaultFlags names spendcap's settings by this program's flags.
var vaultFlags = strings.NewReplacer(spendcap.ErrInvalid.Error()+": ", "", "Config.ProxyURL", "-vault-proxy-url", "Config.VaultKey", "-vault-key", ", or set AllowInsecure inside a trusted network", "")

// redactKey shows which kind of key is in use (sk_test_, rk_live_) and
// nothing of the secret.
func redactKey(k string) string {
	if p := strings.SplitN(k, "_", 3); len(p) == 3 && len(p[0]) <= 3 && (p[1] == "test" || p[1] == "live") {
		return p[0] + "_" + p[1] + "_****"
	}
	return "****"
}

// redactURL hides the password of a connection string.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil || u.Scheme == "" {
		return "(connection string not shown)"
	}
	return u.Redacted()
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	o, err := parseFlags(args, stdout, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return exitOK
	}
	rep := &reporter{o: o, stdout: stdout, stderr: stderr, human: stdout}
	if o.json {
		rep.human = stderr
	}
	if err != nil {
		return rep.fail(exitUsage, "invalid_input", err, "")
	}

	// Read the whole customers file before anything else, so that a bad
	// row stops the program before a database or Stripe is touched.
	total := o.customers
	if o.customersFile != "" {
		if total, err = checkFile(o.customersFile, o.api, o.by == "invoice"); err != nil {
			return rep.fail(exitUsage, "invalid_input", err, "fix the file and run again; nothing was charged")
		}
	}

	dbURL, dbDesc := o.databaseURL, redactURL(o.databaseURL)
	if dbURL == "" {
		cluster, err := pgtest.Start(ctx)
		if err != nil {
			return rep.fail(exitStopped, "error", fmt.Errorf("starting a throwaway PostgreSQL: %w", err), "pass -database-url or set DATABASE_URL")
		}
		defer cluster.Stop()
		if dbURL, err = cluster.NewDatabase(ctx); err != nil {
			return rep.fail(exitStopped, "error", err, "pass -database-url or set DATABASE_URL")
		}
		dbDesc = "throwaway PostgreSQL at " + redactURL(dbURL)
	}
	pool, err := connect(ctx, dbURL)
	if err != nil {
		return rep.fail(exitStopped, "error", err, "check -database-url (or DATABASE_URL) and that the server is up; nothing was charged")
	}
	defer pool.Close()
	store, err := claim.NewPostgres(pool, claim.Config{Lease: o.lease})
	if err != nil {
		return rep.fail(exitStopped, "error", err, "")
	}
	if err := store.Migrate(ctx); err != nil {
		return rep.fail(exitStopped, "error", fmt.Errorf("creating the claim table: %w", err), "the role needs CREATE on the database (or apply claim.Migrations yourself)")
	}
	guard, err := lock.NewAdvisory(pool, lock.AdvisoryConfig{Namespace: "billonce"})
	if err != nil {
		return rep.fail(exitStopped, "error", err, "")
	}

	key, stripeURL, credential := o.stripeKey, o.stripeURL, ""
	var fake *billingtest.Server
	if o.vault() {
		// The transport sends every request to the proxy with the vault
		// key; the proxy adds the Stripe secret.
		key, stripeURL = o.vaultKey, ""
		// The vault key changes every run; the Stripe key behind the proxy
		// does not. Claims name that key by the proxy that holds it.
		credential = "spend-cap proxy " + o.vaultProxyURL
		defer o.proxyClient.CloseIdleConnections()
	} else if o.demo() {
		declines := map[string]string{}
		for _, i := range demoDeclined(o.demoDeclines, o.customers) {
			declines[demoID(i, o.customers)] = "insufficient_funds"
		}
		fake = billingtest.NewServer(billingtest.Config{Declines: declines, Async: demoBankDebits(o.demoBank, o.customers)})
		defer fake.Close()
		key, stripeURL = demoKey, fake.URL
	} else if stripeURL == "" {
		stripeURL = billing.DefaultStripeURL
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	biller, err := billing.New(billing.Config{
		SecretKey:  key,
		Credential: credential,
		StripeURL:  stripeURL,
		HTTPClient: o.proxyClient,
		Claims:     store,
		API:        o.api,
		Scope:      o.scope,
		RateLimit:  o.rate,
		Logger:     logger,
	})
	if err != nil {
		return rep.fail(exitUsage, "invalid_input", err, "")
	}

	stripeDesc := fmt.Sprintf("%s (key %s)", stripeURL, redactKey(key))
	switch {
	case fake != nil:
		stripeDesc = "in-process fake Stripe at " + stripeDesc
	case o.vault():
		stripeDesc = "spend-cap proxy at " + o.vaultProxyURL + " (vault key ****)"
	}
	source := fmt.Sprintf("%d demo customers", total)
	if o.customersFile != "" {
		source = fmt.Sprintf("%d customers from %s", total, o.customersFile)
	}
	if o.demoDeclines > 0 {
		source += fmt.Sprintf(", %d of them with cards that decline", o.demoDeclines)
	}
	if o.demoBank > 0 {
		source += fmt.Sprintf(", %d paying by bank debit", o.demoBank)
	}
	how := fmt.Sprintf("with the %s API", o.api)
	if o.by == "invoice" {
		how = "by invoice"
	}
	fmt.Fprintf(rep.human, "billing %s for %s %s, scope %q\n  stripe:   %s\n  database: %s\n",
		source, o.period, how, o.scope, stripeDesc, dbDesc)

	items := func() iter.Seq2[billing.Item, error] {
		it := demoItems(o.customers, o.api)
		if o.customersFile != "" {
			it = csvItems(o.customersFile, o.api)
		}
		if o.by == "invoice" {
			return byInvoice(it, o.period)
		}
		return it
	}
	unit := "charges"
	if o.by == "invoice" {
		unit = "invoices"
	}
	runOnce := func(label string) (billing.Summary, error) {
		ro := &billing.RunOptions{
			Concurrency: o.concurrency,
			Total:       total,
			Progress:    newProgress(stderr, label, unit).update,
		}
		if o.useLock {
			ro.Lock = guard
		}
		return biller.Run(ctx, o.period, items(), ro)
	}

	hooks, err := startWebhooks(o, biller, fake, rep.human)
	if err != nil {
		return rep.fail(exitUsage, "invalid_input", err, "")
	}
	defer hooks.stop()

	sum, err := runOnce("billing")
	rep.run = &sum
	if err != nil || fake == nil {
		return rep.finish(sum, err)
	}

	// The demo: bank debits settle days later and Stripe tells the
	// webhook; the same run again creates nothing, reports what settled,
	// and the fake's ledger shows every customer charged once.
	if sum.Processing > 0 && o.by != "invoice" {
		rep.settlement = hooks.settle(ctx, fake)
	}
	reqs := fake.Stats().Requests
	again, err := runOnce("again  ")
	rep.second = &again
	rep.secondRequests = fake.Stats().Requests - reqs
	if err != nil {
		return rep.finish(again, err)
	}
	if o.by == "invoice" {
		// Every customer billed has its invoice, paid or open.
		rep.ledger = checkInvoices(fake, o.period, items(), sum.Created+sum.Processing+again.Created)
	} else {
		// Every payment created and not failed after settlement moved money.
		rep.ledger = checkLedger(fake, o.period, items(), sum.Created+again.Created+sum.Processing-again.DeclinedAfterProcessing-again.Processing)
	}
	if o.usage && rep.ledger.OK {
		rep.usage, err = reportUsage(ctx, o, biller, fake, guard, stderr)
		if err != nil {
			return rep.finish(again, err)
		}
	}
	return rep.finish(again, nil)
}

// connect opens a pool and makes sure the server answers.
func connect(ctx context.Context, dbURL string) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dbURL)
	if err != nil {
		return nil, errConnString
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("opening the database: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := pool.Ping(pctx); err != nil {
		pool.Close()
		return nil, fmt.Errorf("cannot reach the database %s: %w", redactURL(dbURL), err)
	}
	return pool, nil
}

// ledger is what the fake Stripe's ledger says about the run's customers.
// By invoice, "charged" is "invoiced", and WrongLines counts the
// customers whose one invoice is not paid or open with each line once.
type ledger struct {
	Customers    int  `json:"customers"`
	Once         int  `json:"charged_once"`
	MoreThanOnce int  `json:"charged_more_than_once"`
	NotCharged   int  `json:"not_charged"`
	WrongLines   int  `json:"wrong_lines,omitempty"`
	OK           bool `json:"ok"`
}

// checkLedger counts the customers' charges at the fake for period. Every
// customer the runs created a charge for must have exactly one, and nobody
// more than one.
func checkLedger(fake *billingtest.Server, period string, items iter.Seq2[billing.Item, error], created int) *ledger {
	l := &ledger{}
	for it, err := range items {
		if err != nil {
			break
		}
		l.Customers++
		switch n := fake.CountPeriod(it.Customer, period); {
		case n == 0:
			l.NotCharged++
		case n == 1:
			l.Once++
		default:
			l.MoreThanOnce++
		}
	}
	l.OK = l.MoreThanOnce == 0 && l.Once == created
	return l
}
