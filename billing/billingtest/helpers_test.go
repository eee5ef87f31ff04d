package billingtest_test

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/stripe/stripe-go/v79"
	"github.com/stripe/stripe-go/v79/client"
)

const testKey = "sk_test_billingtest_0000000000001234"

// newAPI returns a stripe-go client pointed at srv with stripe-go's own
// retries off, so every failure the fake injects reaches the test.
func newAPI(tb testing.TB, srv *billingtest.Server, key string, hc *http.Client) *client.API {
	tb.Helper()
	if hc == nil {
		hc = &http.Client{Timeout: 10 * time.Second}
	}
	b := stripe.GetBackendWithConfig(stripe.APIBackend, &stripe.BackendConfig{
		URL:               stripe.String(srv.URL),
		MaxNetworkRetries: stripe.Int64(0),
		HTTPClient:        hc,
		LeveledLogger:     &stripe.LeveledLogger{Level: stripe.LevelNull},
		EnableTelemetry:   stripe.Bool(false),
	})
	api := &client.API{}
	api.Init(key, &stripe.Backends{API: b, Connect: b, Uploads: b})
	return api
}

func newServer(tb testing.TB, cfg billingtest.Config) *billingtest.Server {
	tb.Helper()
	return billingtest.Start(tb, cfg)
}

func chargeParams(customer, period, key string) *stripe.ChargeParams {
	p := &stripe.ChargeParams{
		Amount:   stripe.Int64(4200),
		Currency: stripe.String("usd"),
		Customer: stripe.String(customer),
	}
	p.AddMetadata("billonce_period", period)
	p.AddMetadata("customer", customer)
	if key != "" {
		p.SetIdempotencyKey(key)
	}
	return p
}

// errorOf decodes the error object of a Stripe error body.
func errorOf(body []byte) (e struct {
	Type, Code, Param, Message string
}) {
	var v struct {
		Error struct {
			Type, Code, Param, Message string
		}
	}
	json.Unmarshal(body, &v)
	return v.Error
}

// idOf decodes the id of an object's body.
func idOf(body []byte) string {
	var v struct{ ID string }
	json.Unmarshal(body, &v)
	return v.ID
}

// stripeErr asserts err is a *stripe.Error and returns it.
func stripeErr(tb testing.TB, err error) *stripe.Error {
	tb.Helper()
	var se *stripe.Error
	if !errors.As(err, &se) {
		tb.Fatalf("error = %v (%T); want *stripe.Error", err, err)
	}
	return se
}

// faults is billingtest.RandomFaults for rates known to be valid.
func faults(seed int64, rates map[billingtest.FaultKind]float64) func(billingtest.Request) billingtest.Fault {
	f, err := billingtest.RandomFaults(seed, rates)
	if err != nil {
		panic(err)
	}
	return f
}

// do sends one request to srv as a client other than stripe-go would, to
// read what stripe-go hides (headers, raw bodies).
func do(tb testing.TB, srv *billingtest.Server, method, path, key string, form url.Values) (*http.Response, []byte) {
	tb.Helper()
	return doAs(tb, srv, "", method, path, key, form)
}

// doAs is do on behalf of a connected account (a Stripe-Account header;
// Stripe-Context on /v2), or of the platform when acct is empty.
func doAs(tb testing.TB, srv *billingtest.Server, acct, method, path, key string, form url.Values) (*http.Response, []byte) {
	tb.Helper()
	resp, b, err := send(srv, acct, method, path, key, form)
	if err != nil {
		tb.Fatal(err)
	}
	return resp, b
}

// send is doAs returning a lost connection as an error.
func send(srv *billingtest.Server, acct, method, path, key string, form url.Values) (*http.Response, []byte, error) {
	var body io.Reader
	if method == http.MethodPost {
		body = strings.NewReader(form.Encode())
	} else if len(form) > 0 {
		path += "?" + form.Encode()
	}
	req, err := http.NewRequest(method, srv.URL+path, body)
	if err != nil {
		return nil, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+testKey)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if key != "" {
		req.Header.Set("Idempotency-Key", key)
	}
	if acct != "" {
		h := "Stripe-Account"
		if strings.HasPrefix(path, "/v2/") {
			h = "Stripe-Context"
		}
		req.Header.Set(h, acct)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, nil, err
	}
	return resp, b, nil
}
