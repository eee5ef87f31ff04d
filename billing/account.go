package billing

import (
	"context"
	"net/http"
	"strings"
)

// Connected accounts
//
// A platform (Stripe Connect) bills the customers of its connected
// accounts on those accounts: each request carries the account's id in
// the Stripe-Account header, and what it makes (a charge, an invoice, a
// meter event, a refund) lives on that account, where a customer, an
// invoice or a meter of another account means nothing. So a job's
// account goes with every request made for it, writes, searches,
// listings and reads alike, through the request's context (onAccount),
// which the Biller's transport turns into the header (accountHeader). The
// account is part of the claim's identity and of its key, and an event
// moves a claim only when it is about an object of the claim's account.

// accountCtx is the context key of the Stripe account a request goes to.
type accountCtx struct{}

// onAccount returns ctx for requests to account, a connected account's
// id, or the platform's own when account is "": it replaces any account
// ctx named before.
func onAccount(ctx context.Context, account string) context.Context {
	return context.WithValue(ctx, accountCtx{}, account)
}

// accountOf is the account ctx's requests go to; "" for the platform.
func accountOf(ctx context.Context) string {
	a, _ := ctx.Value(accountCtx{}).(string)
	return a
}

// accountHeader is the transport that sends each request to the account
// its context names: the Stripe-Account header on Stripe's v1 API, the
// Stripe-Context header on v2, set, or removed for the platform's own,
// so that no request goes to an account its job did not name.
type accountHeader struct{ base http.RoundTripper }

func (t accountHeader) RoundTrip(r *http.Request) (*http.Response, error) {
	a := accountOf(r.Context())
	h, other := "Stripe-Account", "Stripe-Context"
	if strings.HasPrefix(r.URL.Path, "/v2/") {
		h, other = other, h
	}
	if r.Header.Get(h) != a || r.Header.Get(other) != "" {
		r = r.Clone(r.Context())
		r.Header.Del(other)
		if a == "" {
			r.Header.Del(h)
		} else {
			r.Header.Set(h, a)
		}
	}
	return t.base.RoundTrip(r)
}

// checkAccount checks a connected account's id: "" (the platform's own)
// or an "acct_…" id.
func checkAccount(account string) error {
	if account == "" {
		return nil
	}
	if err := checkID("account", account); err != nil {
		return err
	}
	if !strings.HasPrefix(account, "acct_") || len(account) == len("acct_") {
		return invalid("account %q: a connected account's id starts with acct_ (leave it empty for the platform's own account)", clip(account))
	}
	return nil
}
