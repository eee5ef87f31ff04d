package spendcap

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/billonce/billonce/internal/stripeanswer"
)

// adminBase is the URL admin requests are built on; the [Transport] of
// the admin client replaces its scheme and host with the proxy's.
const adminBase = "http://spendcap-proxy.invalid/admin/keys"

// IssueRunKey asks the admin API of a spendcap-proxy (command
// billing/spendcap/cmd/spendcap-proxy) for a vault key with k, for one
// billing run, and returns it with a function that revokes it. Call
// revoke when the run ends, whatever happened, with a context that
// outlives the run's (context.WithoutCancel of it, with a timeout):
//
//	admin, err := spendcap.Client(proxyURL, os.Getenv("SPENDCAP_ADMIN_TOKEN"), nil)
//	vaultKey, revoke, err := spendcap.IssueRunKey(ctx, admin, spendcap.Key{
//		CapAmount:        expectedTotal + expectedTotal/20, // the prices the run charges, plus 5%
//		AllowedEndpoints: []string{"POST /v1/charges", "GET /v1/charges/*"},
//		ExpiresAt:        time.Now().Add(6 * time.Hour), // the end of the run's window
//	}, "billing 2026-09")
//	defer revoke(context.WithoutCancel(ctx))
//
// then bill with spendcap.Client(proxyURL, vaultKey, nil) as
// billing.Config.HTTPClient, the vault key as its SecretKey, and
// Credential naming the Stripe key the proxy holds.
//
// admin is a client made by [Client] with the proxy's URL and the admin
// token in the vault key's place: the admin API takes its token with the
// same Bearer scheme, and the [Transport] sends it only to the proxy
// (never after a redirect, never in clear off loopback) and prints it
// redacted. Any other client is refused with [ErrInvalid].
//
// k needs a positive CapAmount, an allowlist (the proxy issues no key
// that may call every endpoint: the cap does not bound refunds, payouts
// and other requests without an amount) and an ExpiresAt in the future;
// Per is PerRun or PerDay. label is a note for people, stored in clear.
// Errors never carry the admin token or the vault key; once a key is
// issued, only its return value holds it.
func IssueRunKey(ctx context.Context, admin *http.Client, k Key, label string) (vaultKey string, revoke func(context.Context) error, err error) {
	if admin == nil {
		return "", nil, invalid("IssueRunKey: admin is nil: pass spendcap.Client(proxyURL, adminToken, nil)")
	}
	if _, ok := admin.Transport.(*Transport); !ok {
		return "", nil, invalid("IssueRunKey: admin's transport is %T: pass a client from spendcap.Client(proxyURL, adminToken, base), which sends the token only to the proxy", admin.Transport)
	}
	if err := k.check(); err != nil {
		return "", nil, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	if len(k.AllowedEndpoints) == 0 {
		return "", nil, invalid("IssueRunKey: Key.AllowedEndpoints is empty: name the endpoints the run calls, such as POST /v1/charges and GET /v1/charges/*")
	}
	until := time.Until(k.ExpiresAt)
	if k.ExpiresAt.IsZero() || until <= 0 {
		return "", nil, invalid("IssueRunKey: Key.ExpiresAt is not in the future: set it to the end of the run's window")
	}
	form := url.Values{
		"cap":        {strconv.FormatInt(k.CapAmount, 10)},
		"per":        {k.Per.String()},
		"allow":      k.AllowedEndpoints,
		"expires_in": {strconv.FormatInt(int64(math.Ceil(until.Seconds())), 10) + "s"},
		"label":      {label},
	}
	var issued struct {
		VaultKey string `json:"vault_key"`
		KeyID    string `json:"key_id"`
	}
	if err := adminCall(ctx, admin, http.MethodPost, adminBase, form, &issued); err != nil {
		return "", nil, fmt.Errorf("spendcap: issuing a run key: %w", err)
	}
	if issued.VaultKey == "" || issued.KeyID != KeyID(issued.VaultKey) {
		return "", nil, errors.New("spendcap: issuing a run key: the proxy's answer holds no vault key with its key_id; is the URL a spendcap-proxy's?")
	}
	id := issued.KeyID
	revoke = func(ctx context.Context) error {
		if err := adminCall(ctx, admin, http.MethodDelete, adminBase+"/"+url.PathEscape(id), nil, nil); err != nil {
			return fmt.Errorf("spendcap: revoking vault key %s: %w", id, err)
		}
		return nil
	}
	return issued.VaultKey, revoke, nil
}

// adminCall sends one admin request and decodes a 200 answer into out
// (when not nil). Its errors hold the proxy's message, never a secret: the
// proxy's answers carry none but the issued key, which is never printed.
func adminCall(ctx context.Context, admin *http.Client, method, u string, form url.Values, out any) error {
	var body io.Reader
	if form != nil {
		body = strings.NewReader(form.Encode())
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	if form != nil {
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	resp, err := admin.Do(req)
	var pe *ProxyError
	switch {
	case errors.As(err, &pe) && pe.Status == http.StatusUnauthorized:
		return errors.New("the proxy refused the admin token (401): check SPENDCAP_ADMIN_TOKEN or whatever holds it")
	case errors.As(err, &pe):
		return fmt.Errorf("the proxy answered %d %q", pe.Status, pe.Message)
	case err != nil:
		return err
	}
	defer resp.Body.Close()
	buf, err := stripeanswer.Peek(resp)
	if err != nil {
		return fmt.Errorf("reading the proxy's answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		// The transport puts the proxy's own errors in Stripe's shape.
		var ans struct {
			Error struct {
				Message string `json:"message"`
			} `json:"error"`
		}
		json.Unmarshal(buf, &ans)
		return fmt.Errorf("the proxy answered %d %q", resp.StatusCode, ans.Error.Message)
	}
	if out != nil {
		if err := json.Unmarshal(buf, out); err != nil {
			return errors.New("the proxy's answer is not the admin API's JSON")
		}
	}
	return nil
}
