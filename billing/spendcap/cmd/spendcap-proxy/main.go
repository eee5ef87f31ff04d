// Command spendcap-proxy is the spend-cap proxy as a server a team can run:
// it holds the Stripe secret, hands out vault keys with a cap each, and never
// lets requests sent with a vault key spend past its cap, however many
// replicas share its PostgreSQL database. It is [spendcap.Proxy] on a
// [spendcap.PostgresStore], plus a small admin API.
//
//	STRIPE_SECRET_KEY=sk_live_... SPENDCAP_ADMIN_TOKEN=... DATABASE_URL=postgres://... go run ./billing/spendcap/cmd/spendcap-proxy -addr :8443
//
// -upstream sends requests to another Stripe-compatible server, such as the
// fake Stripe of billing/billingtest/cmd/fake-stripe. The database is
// -database-url, or DATABASE_URL, read after the flags so that -h never
// prints it; a database that gives no answer within -db-timeout (30s) at
// start stops the proxy with an error that says so.
//
// The admin API takes "Authorization: Bearer <admin token>" and nothing
// else (a token sent without the Bearer scheme is refused with 401):
//
//	POST /admin/keys      form: cap, per (run|day), allow (repeated "METHOD /path", at least one), expires_in (a duration), label
//	                      answers {"vault_key": ..., "key_id": ...}
//	DELETE /admin/keys/{key_id}   revokes the key at once, on every replica
//
// A key is issued only with an allowlist: the cap bounds only requests
// that carry an amount, so a key that may call every endpoint could
// refund or pay out without limit. The vault key is in the issue answer
// and nowhere else: later answers, errors and the log name it by its
// key_id.
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base32"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/billonce/billonce/billing/spendcap"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	err := run(ctx, os.Args[1:], os.Stdout)
	var usage usageError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return
	case errors.As(err, &usage):
		fmt.Fprintln(os.Stderr, "spendcap-proxy:", err)
		os.Exit(2) // the exit statuses of every billonce program: billing/cmd/billonce/README.md
	default:
		fmt.Fprintln(os.Stderr, "spendcap-proxy:", err)
		os.Exit(1)
	}
}

// usageError is a mistake in the command line: exit status 2.
type usageError struct{ error }

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spendcap-proxy", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address to listen on")
	// No flag takes its default from the environment: -h prints defaults,
	// and DATABASE_URL may hold a password. It is read after Parse.
	dbURL := fs.String("database-url", "", "PostgreSQL holding keys and budgets, shared by every replica (default $DATABASE_URL)")
	upstream := fs.String("upstream", "https://api.stripe.com", "Stripe API base URL, or a Stripe-compatible server's")
	dbTimeout := fs.Duration("db-timeout", 30*time.Second, "bound of connecting to the database and creating its tables at start: a database that never answers stops the proxy with an error rather than keeping it from ever serving")
	fs.Usage = func() {}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) { // -h, -help, --help: the flags on standard output
			fmt.Fprintln(stdout, "Usage of spendcap-proxy:")
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected argument %q: every setting is a flag (see -h)", fs.Arg(0))}
	}
	if *dbURL == "" {
		*dbURL = os.Getenv("DATABASE_URL")
	}
	secret := os.Getenv("STRIPE_SECRET_KEY")
	if secret == "" {
		return errors.New("STRIPE_SECRET_KEY is empty: set the secret the proxy sends upstream")
	}
	if *dbURL == "" {
		return errors.New("no database: pass -database-url or set DATABASE_URL")
	}
	if *dbTimeout <= 0 {
		return usageError{fmt.Errorf("-db-timeout %v: want a duration above 0, such as 30s", *dbTimeout)}
	}
	adminToken := os.Getenv("SPENDCAP_ADMIN_TOKEN")
	if adminToken == "" {
		adminToken = "admin_" + random()
		fmt.Fprintln(stdout, "admin token:", adminToken)
	}

	cfg, err := pgxpool.ParseConfig(*dbURL)
	if err != nil {
		// Neither the string nor pgx's error is printed: both may carry
		// the password.
		return usageError{errors.New("-database-url does not parse: want postgres://user:password@host:5432/dbname")}
	}
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return fmt.Errorf("-database-url: %w", err)
	}
	defer pool.Close()
	store, err := spendcap.NewPostgresStore(pool)
	if err != nil {
		return err
	}
	start, cancel := context.WithTimeout(ctx, *dbTimeout)
	err = store.Migrate(start)
	cancel()
	switch {
	case err != nil && ctx.Err() == nil && errors.Is(start.Err(), context.DeadlineExceeded):
		return fmt.Errorf("creating the spend-cap tables: the database gave no answer within %v (-db-timeout): %w", *dbTimeout, err)
	case err != nil:
		return fmt.Errorf("creating the spend-cap tables: %w", err)
	}
	proxy, err := spendcap.NewProxy(spendcap.ProxyConfig{Upstream: *upstream, StripeKey: secret, Store: store})
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("/v1/", proxy)
	admin := &admin{store: store, token: adminToken}
	mux.HandleFunc("POST /admin/keys", admin.issue)
	mux.HandleFunc("DELETE /admin/keys/{id}", admin.revoke)
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		return err
	}
	base := "http://" + ln.Addr().String()
	fmt.Fprintln(stdout, "spend-cap proxy on", base, "forwarding to", *upstream)
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hs.Shutdown(shut)
	}()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

func random() string {
	b := make([]byte, 16)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// newVaultKey returns a fresh random vault key. Its form is this
// command's own: a store knows a key only by its spendcap.KeyID.
func newVaultKey() string {
	b := make([]byte, 30)
	rand.Read(b) // never fails, see crypto/rand
	return "vault_" + strings.ToLower(base32.StdEncoding.WithPadding(base32.NoPadding).EncodeToString(b))
}

type admin struct {
	store *spendcap.PostgresStore
	token string
}

// authorized answers 401 unless the request carries the admin token with
// the Bearer scheme (its name compared without regard to case, as RFC 9110
// says); a bare token, or one under another scheme, is refused.
func (a *admin) authorized(w http.ResponseWriter, r *http.Request) bool {
	scheme, got, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	if !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
		reply(w, http.StatusUnauthorized, map[string]any{"error": "admin token missing or wrong"})
		return false
	}
	return true
}

func (a *admin) issue(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(w, r) {
		return
	}
	if err := r.ParseForm(); err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"error": "want a form body"})
		return
	}
	k := spendcap.Key{AllowedEndpoints: r.PostForm["allow"]}
	if len(k.AllowedEndpoints) == 0 {
		// Refused rather than defaulted: the cap bounds only requests
		// with an amount, so a key for every endpoint could refund or pay
		// out without limit, and a guessed default would surprise a
		// caller who meant more (or less) than charge creation.
		reply(w, http.StatusBadRequest, map[string]any{"error": `allow: name every endpoint the key may call, such as allow=POST /v1/charges; a key is never issued for every endpoint, as the cap does not bound refunds, payouts and other requests without an amount`})
		return
	}
	capAmount, err := strconv.ParseInt(r.PostFormValue("cap"), 10, 64)
	if err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"error": "cap: want a positive integer amount in cents"})
		return
	}
	k.CapAmount = capAmount
	switch r.PostFormValue("per") {
	case "", "run":
	case "day":
		k.Per = spendcap.PerDay
	default:
		reply(w, http.StatusBadRequest, map[string]any{"error": "per: want run or day"})
		return
	}
	if s := r.PostFormValue("expires_in"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil || d <= 0 {
			reply(w, http.StatusBadRequest, map[string]any{"error": "expires_in: want a positive duration such as 12h"})
			return
		}
		k.ExpiresAt = time.Now().Add(d)
	}
	vk := newVaultKey()
	if err := a.store.IssueKey(r.Context(), vk, k, r.PostFormValue("label")); err != nil {
		// The store's errors name the key by its KeyID only.
		reply(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	reply(w, http.StatusOK, map[string]any{"vault_key": vk, "key_id": spendcap.KeyID(vk)})
}

func (a *admin) revoke(w http.ResponseWriter, r *http.Request) {
	if !a.authorized(w, r) {
		return
	}
	if err := a.store.Revoke(r.Context(), r.PathValue("id")); err != nil {
		status := http.StatusInternalServerError
		if errors.Is(err, spendcap.ErrUnknownKey) {
			status = http.StatusNotFound
		}
		reply(w, status, map[string]any{"error": err.Error()})
		return
	}
	reply(w, http.StatusOK, map[string]any{"revoked": r.PathValue("id")})
}

func reply(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(v)
}
