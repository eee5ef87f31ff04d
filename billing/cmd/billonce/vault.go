package main

import (
	"context"
	"fmt"
	"math"
	"net/http"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// Defaults of run's vault-key flags.
const (
	defaultVaultMargin = 0.05
	defaultVaultExpiry = 12 * time.Hour
	// maxVaultExpiry is how long Stripe keeps idempotency keys: a run key
	// lives no longer than the keys it sends.
	maxVaultExpiry = 24 * time.Hour
)

// vaultFlags are run's settings for a vault key of its own, issued by a
// spendcap-proxy for the run and revoked when it ends.
type vaultFlags struct {
	proxyURL   string
	credential string
	margin     float64
	expiresIn  time.Duration
	timeout    bound
}

func (v *vaultFlags) register(f *flags) {
	f.StringVar(&v.proxyURL, "vault-proxy-url", "", "bill through the spendcap-proxy at this URL with a vault key issued for this run (cap: what the run has left to bill, plus -vault-margin) and revoked when it ends; the admin token is $SPENDCAP_ADMIN_TOKEN, and no Stripe key is needed")
	f.StringVar(&v.credential, "credential", "", "with -vault-proxy-url: a stable name of the Stripe key the proxy holds (acct_…/billing-key-2026), recorded on claims in place of the vault key; required")
	f.Float64Var(&v.margin, "vault-margin", defaultVaultMargin, "with -vault-proxy-url: how far above what the run has left to bill the vault key's cap is, as a fraction (0.05 is 5%)")
	f.DurationVar(&v.expiresIn, "vault-expires-in", defaultVaultExpiry, "with -vault-proxy-url: how long the vault key lives if the run does not revoke it, at most 24h")
	v.timeout.register(f, "vault-timeout", "the spend-cap proxy's admin API, with -vault-proxy-url: issuing the run's key, and revoking it")
}

// check returns a usage error for inconsistent vault-key flags.
func (v *vaultFlags) check(f *flags) error {
	if v.proxyURL == "" {
		for _, name := range []string{"credential", "vault-margin", "vault-expires-in", "vault-timeout"} {
			if f.set(name) {
				return usageError("-%s goes with -vault-proxy-url", name)
			}
		}
		return nil
	}
	switch {
	case v.credential == "":
		return usageError("-vault-proxy-url needs -credential: a stable name of the Stripe key the proxy holds, recorded on claims so that a resend under another vault key is recognised")
	case v.margin < 0 || math.IsNaN(v.margin) || math.IsInf(v.margin, 0):
		return usageError("-vault-margin %v: want a fraction of at least 0, such as 0.05", v.margin)
	case v.expiresIn <= 0 || v.expiresIn > maxVaultExpiry:
		return usageError("-vault-expires-in %v: want a duration above 0 and at most 24h, how long Stripe keeps idempotency keys", v.expiresIn)
	}
	return v.timeout.check()
}

// runCap is the cap of a run's vault key: the sum of the prices of items,
// over every currency (as the proxy counts), times 1 + margin, rounded
// up; 1, the smallest cap the proxy issues, when items is empty.
func runCap(items []billing.Item, margin float64) (int64, error) {
	if len(items) == 0 {
		return 1, nil
	}
	var total int64
	for _, it := range items {
		if it.Price == nil {
			return 0, usageError("customer %s has no price: a vault key's cap is computed from every price of the run", it.Customer)
		}
		if it.Price.Amount > math.MaxInt64-total {
			return 0, usageError("the run's total overflows")
		}
		total += it.Price.Amount
	}
	c := math.Ceil(float64(total) * (1 + margin))
	if c >= math.MaxInt64 || c < 1 {
		return 0, usageError("a vault key's cap of %.0f: want a run whose total is above 0 and fits in 64 bits", c)
	}
	return int64(c), nil
}

// endpoints are the endpoints a Run's Biller calls with api: creating a
// payment, searching for one (reconciliation), and reading one
// (settlement). A Run bills attempt 1 and resumes pending claims of it,
// so it never cancels a declined attempt's PaymentIntent as a Rebill
// does: POST /v1/payment_intents/*/cancel is not needed.
func endpoints(api billing.API) []string {
	p := "/v1/charges"
	if api == billing.PaymentIntents {
		p = "/v1/payment_intents"
	}
	return []string{"POST " + p, "GET " + p + "/*"}
}

// vaultRun is a run that bills through a spend-cap proxy with a vault key
// of its own.
type vaultRun struct {
	flags  *vaultFlags
	period string
	items  []billing.Item
	admin  *http.Client // the admin API's client, once check made it
}

// check reads the admin token and checks the proxy's URL, touching
// nothing.
func (v *vaultRun) check(a *app) error {
	token := a.getenv("SPENDCAP_ADMIN_TOKEN")
	if token == "" {
		return usageError("-vault-proxy-url needs the proxy's admin token in SPENDCAP_ADMIN_TOKEN; it is never taken from a flag")
	}
	admin, err := spendcap.Client(v.flags.proxyURL, token, nil)
	if err != nil {
		return usageError("-vault-proxy-url: %v", err)
	}
	if _, err := runCap(v.items, v.flags.margin); err != nil {
		return err
	}
	v.admin = admin
	return nil
}

// runKey is a vault key issued for one run, and how to bill with it.
type runKey struct {
	key     string
	client  *http.Client
	revoke  func(context.Context) error
	timeout bound // of revoking it
}

// leftToBill returns the items a run of the period may still charge,
// given the period's claims: those of customers without a claim, or with
// a pending one (which the run resumes, and may charge). A customer whose
// claims are all billed, processing or declined is charged by no run:
// only a person's re-bill charges again.
func leftToBill(items []billing.Item, claims []claim.Claim) []billing.Item {
	claimed, pending := map[string]bool{}, map[string]bool{}
	for _, c := range claims {
		claimed[c.Customer] = true
		pending[c.Customer] = pending[c.Customer] || c.State == claim.StatePending
	}
	var left []billing.Item
	for _, it := range items {
		if !claimed[it.Customer] || pending[it.Customer] {
			left = append(left, it)
		}
	}
	return left
}

// issue asks the proxy for the run's vault key, capped at what is left to
// bill given the period's claims. The cap is printed on standard error;
// the key never is.
//
// The call is bounded by -vault-timeout. A proxy that gives no answer
// within it may still have issued the key: that key, which nobody holds,
// expires after -vault-expires-in.
func (v *vaultRun) issue(ctx context.Context, a *app, api billing.API, claims []claim.Claim) (*runKey, error) {
	left := leftToBill(v.items, claims)
	capAmount, err := runCap(left, v.flags.margin)
	if err != nil {
		return nil, err
	}
	k := spendcap.Key{CapAmount: capAmount, AllowedEndpoints: endpoints(api), ExpiresAt: time.Now().Add(v.flags.expiresIn)}
	var vk string
	var revoke func(context.Context) error
	err = v.flags.timeout.run(ctx, "the spend-cap proxy's admin API", func(ctx context.Context) (err error) {
		vk, revoke, err = spendcap.IssueRunKey(ctx, v.admin, k, "billonce run "+v.period)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("the vault key for the run: %w; nothing was charged (a key the proxy may have issued meanwhile expires in %v)", err, v.flags.expiresIn)
	}
	hc, err := spendcap.Client(v.flags.proxyURL, vk, nil)
	if err != nil {
		v.flags.timeout.run(context.WithoutCancel(ctx), "the spend-cap proxy's admin API", revoke)
		return nil, err
	}
	fmt.Fprintf(a.stderr, "vault key for %s: cap %d (what is left to bill, %d of the %d customers, plus %g%%), endpoints %v, expires in %v unless revoked at the end of the run\n",
		v.period, capAmount, len(left), len(v.items), v.flags.margin*100, k.AllowedEndpoints, v.flags.expiresIn)
	return &runKey{key: vk, client: hc, revoke: revoke, timeout: v.flags.timeout}, nil
}

// end revokes the run's key, whatever happened to the run, with a context
// that outlives a cancelled one.
func (rk *runKey) end(ctx context.Context, a *app) {
	if err := rk.timeout.run(context.WithoutCancel(ctx), "the spend-cap proxy's admin API", rk.revoke); err != nil {
		fmt.Fprintf(a.stderr, "billonce run: %v; revoke it with the proxy's admin API (DELETE /admin/keys/{key_id}) or let it expire\n", err)
		return
	}
	fmt.Fprintln(a.stderr, "vault key revoked")
}
