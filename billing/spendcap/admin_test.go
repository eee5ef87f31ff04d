package spendcap_test

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/spendcap"
)

// IssueRunKey refuses, before sending anything, a client that would not
// keep the admin token to the proxy and a key the proxy would refuse; its
// errors never hold the token. The round trip against the proxy is tested
// by command billonce (TestRunWithVaultKeyFromTheProxy).
func TestIssueRunKeyRefusesBeforeSending(t *testing.T) {
	t.Parallel()
	const token = "admin_token_never_printed_1234567890"
	admin, err := spendcap.Client("http://127.0.0.1:1", token, nil)
	if err != nil {
		t.Fatal(err)
	}
	good := spendcap.Key{CapAmount: 100, AllowedEndpoints: []string{"POST /v1/charges"}, ExpiresAt: time.Now().Add(time.Hour)}
	for _, c := range []struct {
		name   string
		client *http.Client
		key    func(k spendcap.Key) spendcap.Key
	}{
		{"NilClient", nil, nil},
		{"PlainClient", http.DefaultClient, nil},
		{"NoAllowlist", admin, func(k spendcap.Key) spendcap.Key { k.AllowedEndpoints = nil; return k }},
		{"NoCap", admin, func(k spendcap.Key) spendcap.Key { k.CapAmount = 0; return k }},
		{"NoExpiry", admin, func(k spendcap.Key) spendcap.Key { k.ExpiresAt = time.Time{}; return k }},
		{"Expired", admin, func(k spendcap.Key) spendcap.Key { k.ExpiresAt = time.Now().Add(-time.Second); return k }},
	} {
		t.Run(c.name, func(t *testing.T) {
			k := good
			if c.key != nil {
				k = c.key(k)
			}
			vk, revoke, err := spendcap.IssueRunKey(context.Background(), c.client, k, "test")
			if !errors.Is(err, spendcap.ErrInvalid) || vk != "" || revoke != nil {
				t.Errorf("IssueRunKey: %q, %v; want ErrInvalid and no key", vk, err)
			}
			if err != nil && strings.Contains(err.Error(), token) {
				t.Errorf("the error holds the admin token: %v", err)
			}
		})
	}
	// A proxy that does not answer: an error without the token.
	_, _, err = spendcap.IssueRunKey(context.Background(), admin, good, "test")
	if err == nil || errors.Is(err, spendcap.ErrInvalid) || strings.Contains(err.Error(), token) {
		t.Errorf("IssueRunKey against a closed port: %v; want a request error without the token", err)
	}
}
