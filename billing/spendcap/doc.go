// Package spendcap bounds what Stripe calls can spend: a proxy holds the
// Stripe secret, hands out vault keys with a cap each, and refuses payments
// past the cap. Keys, claims and locks stop double charges; a spend cap is
// the last line of defence when they all fail, and limits what a broken
// loop can spend.
//
// The package has two sides. Callers import the client side; whoever runs
// the proxy serves [Proxy] with a budget [Store].
//
// # The client side
//
// [Client] (or [NewTransport] for the transport alone) sends every request
// to the proxy with "Authorization: Bearer <vault key>", dropping any
// Authorization the caller set, so the Stripe secret never leaves the
// process through it. Use the client as billing.Config.HTTPClient or as a
// stripe-go BackendConfig's HTTPClient:
//
//	hc, err := spendcap.Client(os.Getenv("SPEND_PROXY_URL"), os.Getenv("VAULT_KEY"), yourHTTPClient)
//
// A proxy refusal comes back as a [*ProxyError] matching
// [ErrSpendCapReached], [ErrEndpointNotAllowed] or [ErrVaultKeyRevoked];
// Stripe's own answers pass through untouched. The vault key is redacted
// wherever the transport prints. This side imports no stripe-go.
//
// # The proxy
//
// [Proxy] is an [http.Handler]: it checks a vault key's expiry,
// revocation and endpoint allowlist, reserves a POST's "amount" against
// the key's cap (per run or per UTC day) before forwarding, in one atomic
// step of its [Store], and settles the reservation on Stripe's answer:
// kept on success or on an unknown outcome, released on a refusal or an
// idempotent replay. A resent idempotency key is not counted twice while
// Stripe remembers it, and is reserved again once Stripe may have
// forgotten it. An amount the proxy cannot count (in the URL query, in a
// body that is not a form, not a plain positive integer) is refused, and
// so is an amount above the cap. Every request leaves an audit [Entry]
// that names the vault key only by its [KeyID] and never holds the
// Stripe secret; ProxyConfig.Observe hears each one, for metrics.
//
// # Stores
//
// [MemoryStore] keeps everything in one process, for tests (package
// spendcaptest serves a Proxy on it on loopback). [PostgresStore] keeps keys,
// reservations, idempotency keys and audit rows in PostgreSQL; replicas of
// the proxy that share its database share one budget, and concurrent
// requests on them never pass a cap together. Vault keys are stored only
// as their KeyID.
//
// Its tables are migrated as the claim table is (package claim's
// documentation, under Migrations, says how): [PostgresStore.Migrate] at
// start-up from every replica, or the files of the package's migrations
// directory applied with psql or a migration tool ([Migrations] returns
// them), which list themselves in spendcap_migrations.
//
// Command spendcap-proxy (billing/spendcap/cmd/spendcap-proxy) serves a
// Proxy on a PostgresStore, with an admin API to issue and revoke vault
// keys. [IssueRunKey] is that API's client: a service issues a key per
// billing run with it (cap: the run's total plus a margin, the endpoints
// the run calls, expiry: the end of the run's window) and revokes it when
// the run ends; command billonce's run -vault-proxy-url does so.
//
// # What it does not protect against
//
//   - Money-moving endpoints without an "amount" (capturing or confirming
//     a payment intent, a full refund) reserve nothing: they are bounded
//     only by the vault key's endpoint allowlist. Allow only the endpoints
//     a run needs.
//   - Code that holds the Stripe secret itself does not go through the
//     proxy. The cap bounds only what is sent with vault keys.
//   - A replica that crashes while a request is in flight leaves its
//     reservation held: its amount counts against the cap from then on, so
//     the cap is reached early, never passed. Raise the cap or issue a new
//     key.
//   - The proxy's clock stepping back by more than ProxyConfig.ClockSkew:
//     a key it counted then looks younger to it than it is to Stripe, so a
//     resend after Stripe has forgotten the key passes as a replay and is
//     charged without a reservation. Run the proxy replicas on clocks kept
//     by NTP that slew rather than step.
//   - A cap is a bound, not a judgement: it does not tell right charges from
//     wrong ones below it.
package spendcap
