package billingtest

import (
	"fmt"
	"net/http"
	"strings"
)

// connectState holds the connected accounts and where each customer
// lives. Guarded by Server.mu.
type connectState struct {
	accounts  map[string]bool   // connected accounts, by id
	customers map[string]string // customer → the account it lives on ("" for the platform)
}

func newConnectState() connectState {
	return connectState{accounts: make(map[string]bool), customers: make(map[string]string)}
}

// CreateAccount creates a connected account of the platform, as POST
// /v1/accounts does, and returns its id ("acct_…"). Requests that carry
// it in a Stripe-Account header act on that account: their objects live
// there, apart from the platform's and every other account's.
func (s *Server) CreateAccount() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.objSeq++
	id := fmt.Sprintf("acct_%014d", s.objSeq)
	s.connect.accounts[id] = true
	return id
}

// accountOf reads the account a request acts on: the Stripe-Account
// header on /v1, the Stripe-Context header on /v2, "" for the platform.
// An account the platform has not connected is refused with 403, as
// Stripe refuses a key access to an account it does not know.
func (s *Server) accountOf(r *http.Request, apiKey string) (string, *apiErr) {
	h := "Stripe-Account"
	if strings.HasPrefix(r.URL.Path, "/v2/") {
		h = "Stripe-Context"
	}
	acct := strings.TrimSpace(r.Header.Get(h))
	if acct == "" {
		return "", nil
	}
	s.mu.Lock()
	known := s.connect.accounts[acct]
	s.mu.Unlock()
	if !known {
		return "", &apiErr{Type: "invalid_request_error", Code: "account_invalid", Message: fmt.Sprintf(
			"The provided key '%s' does not have access to account '%s' (or that account does not exist). Create it with CreateAccount first.", redactKey(apiKey), acct)}
	}
	return acct, nil
}

// bindCustomer makes customer live on acct when it is first named, as
// though it had been created there, and refuses a customer that lives on
// another account: at Stripe a customer id means nothing elsewhere. mu
// is held.
func (s *Server) bindCustomer(acct, customer string) *apiErr {
	if customer == "" {
		return nil
	}
	if bad := s.customerHere(acct, customer); bad != nil {
		return bad
	}
	s.connect.customers[customer] = acct
	return nil
}

// customerHere refuses a customer that lives on another account than
// acct; one never named yet is accepted. mu is held.
func (s *Server) customerHere(acct, customer string) *apiErr {
	if at, ok := s.connect.customers[customer]; ok && at != acct {
		return invalid("customer", "resource_missing", fmt.Sprintf("No such customer: '%s'", customer))
	}
	return nil
}

// missing is the 404 of an object that does not exist on the account.
func missing(param, object, id string) result {
	return errResult(http.StatusNotFound, *invalid(param, "resource_missing", fmt.Sprintf("No such %s: '%s'", object, id)))
}
