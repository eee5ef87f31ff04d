package billing_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// failoverTransport is a caller's transport that tries a primary route
// with net/http and, when it cannot connect, sends the request over a
// secondary route with a client of its own, on a context of its own. The
// primary asks for a connection and never gets one; the secondary writes
// the request.
type failoverTransport struct {
	primary   http.RoundTripper
	fallback  http.RoundTripper
	secondary string // host:port
}

func (t *failoverTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	resp, err := t.primary.RoundTrip(r)
	if err == nil {
		return resp, nil
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		return nil, err
	}
	// The fallback client runs on its own context: a request's hooks
	// and deadline belong to the route it was made for.
	r2 := r.Clone(context.Background())
	if r.GetBody != nil {
		if r2.Body, err = r.GetBody(); err != nil {
			return nil, err
		}
	}
	r2.URL.Host, r2.Host = t.secondary, t.secondary
	resp, err = t.fallback.RoundTrip(r2)
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// A caller's transport that fails over from a route it could not connect
// on to one net/http does not trace writes the request: the charge
// exists, its claim must stay, and the next day's run must not charge
// again.
func TestFailoverTransportWriteKeepsClaimAndChargesOnce(t *testing.T) {
	t.Parallel()
	e := newEnv(t, serverWaitsSkipped)
	u, err := url.Parse(e.srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	refused := http.DefaultTransport.(*http.Transport).Clone()
	refused.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		return nil, &net.OpError{Op: "dial", Net: network, Err: errors.New("connection refused")}
	}
	ft := &failoverTransport{primary: refused, fallback: testTransport, secondary: u.Host}
	b := e.biller(oneAttempt, func(c *billing.Config) { c.HTTPClient = &http.Client{Transport: ft} })

	key := e.key("cus_1")
	e.srv.SetScript(func(r billingtest.Request) billingtest.Fault {
		switch {
		case strings.HasSuffix(r.Path, "/search"):
			return billingtest.Fault{Kind: billingtest.FaultErrorBefore}
		case r.Method == http.MethodPost && r.IdempotencyKey == key:
			return billingtest.Fault{Kind: billingtest.FaultCut}
		}
		return billingtest.Fault{}
	})
	ctx := context.Background()
	_, err1 := b.Charge(ctx, "cus_1", period, nil)
	e.srv.SetScript(nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("setup: %d charges after the cut answer, want 1 (%v)", n, err1)
	}
	rows := e.claimRows()
	e.advance(25 * time.Hour)
	sum, err2 := e.b.Run(ctx, period, billing.Customers("cus_1"), nil)
	if n := e.count("cus_1"); n != 1 {
		t.Fatalf("cus_1 charged %d times, want 1: first Charge = %v (claim rows after it: %d); next day's Run = %+v, %v",
			n, err1, rows, sum.Progress, err2)
	}
}
