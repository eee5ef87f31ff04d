// Command spend-cap-proxy is a spend-cap proxy a team can run: it holds the
// Stripe secret, hands out vault keys with a cap each, and never lets
// requests sent with a vault key spend past its cap, however many replicas
// share its PostgreSQL database. It is [spendcap.Proxy] on a
// [spendcap.PostgresStore], plus a small admin API.
//
// With no flags it is a self-contained demo: a throwaway PostgreSQL, an
// in-process fake Stripe, and one vault key issued with a cap; it prints the
// monthly-billing command that bills through it.
//
//	go run ./examples/spend-cap-proxy
//	STRIPE_SECRET_KEY=sk_live_... SPENDCAP_ADMIN_TOKEN=... go run ./examples/spend-cap-proxy -database-url postgres://... -addr :8443
//
// The admin API takes "Authorization: Bearer <admin token>":
//
//	POST /admin/keys      form: cap, per (run|day), allow (repeated "METHOD /path"), expires_in (a duration), label
//	                      answers {"vault_key": ..., "key_id": ...}
//	DELETE /admin/keys/{key_id}   revokes the key at once, on every replica
package main

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
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

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/internal/pgtest"
)

// demoAllow is what a demo key may call: what a billing run needs.
var demoAllow = []string{"POST /v1/charges", "POST /v1/payment_intents", "GET /v1/charges*", "GET /v1/payment_intents*"}

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "spend-cap-proxy:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("spend-cap-proxy", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:0", "address to listen on")
	dbURL := fs.String("database-url", os.Getenv("DATABASE_URL"), "PostgreSQL holding keys and budgets, shared by every replica (default $DATABASE_URL; none: a throwaway one)")
	upstream := fs.String("upstream", "", "Stripe API base URL (default https://api.stripe.com with $STRIPE_SECRET_KEY, else an in-process fake Stripe)")
	demoCap := fs.Int64("demo-cap", 50000, "cap of the vault key issued at start in the demo, in cents")
	if err := fs.Parse(args); err != nil {
		return err
	}
	secret := os.Getenv("STRIPE_SECRET_KEY")
	demo := secret == "" && *upstream == ""
	switch {
	case demo:
		secret = "sk_test_" + random()
		fake := billingtest.NewServer(billingtest.Config{APIKeys: []string{secret}})
		defer fake.Close()
		*upstream = fake.URL
	case secret == "":
		return errors.New("-upstream is set but STRIPE_SECRET_KEY is empty: set the secret the proxy sends upstream")
	case *upstream == "":
		*upstream = "https://api.stripe.com"
	}
	adminToken := os.Getenv("SPENDCAP_ADMIN_TOKEN")
	if adminToken == "" {
		adminToken = "admin_" + random()
		fmt.Fprintln(stdout, "admin token:", adminToken)
	}

	var pool *pgxpool.Pool
	var err error
	if *dbURL == "" {
		var stopDB func()
		if pool, stopDB, err = pgtest.StartPool(ctx); err != nil {
			return fmt.Errorf("starting a throwaway PostgreSQL (pass -database-url to use yours): %w", err)
		}
		defer stopDB()
	} else if pool, err = pgxpool.New(ctx, *dbURL); err != nil {
		return fmt.Errorf("-database-url: %w", err)
	} else {
		defer pool.Close()
	}
	store, err := spendcap.NewPostgresStore(pool)
	if err != nil {
		return err
	}
	if err := store.Migrate(ctx); err != nil {
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
	if demo {
		vk := spendcap.NewVaultKey()
		if err := store.IssueKey(ctx, vk, spendcap.Key{CapAmount: *demoCap, Per: spendcap.PerRun, AllowedEndpoints: demoAllow}, "demo"); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "vault key: %s (cap $%d.%02d per run)\n", vk, *demoCap/100, *demoCap%100)
		fmt.Fprintf(stdout, "bill through it:\n  go run ./examples/monthly-billing -vault-proxy-url %s -vault-key %s -customers 30 -rate -1\n", base, vk)
	}
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

type admin struct {
	store *spendcap.PostgresStore
	token string
}

func (a *admin) authorized(w http.ResponseWriter, r *http.Request) bool {
	got, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if subtle.ConstantTimeCompare([]byte(got), []byte(a.token)) != 1 {
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
	vk := spendcap.NewVaultKey()
	if err := a.store.IssueKey(r.Context(), vk, k, r.PostFormValue("label")); err != nil {
		reply(w, http.StatusBadRequest, map[string]any{"error": err.Error()})
		return
	}
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
