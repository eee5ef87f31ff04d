package idemkey_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"

	"github.com/billonce/billonce/idemkey"
)

func ExampleTransport() {
	// A server that fails the first attempt and reports the key it got.
	var attempts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := attempts.Add(1)
		fmt.Printf("attempt %d: Idempotency-Key %s\n", n, r.Header.Get("Idempotency-Key"))
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()

	client := &http.Client{Transport: &idemkey.Transport{}}

	// The key is made once, before the retry loop.
	key, err := idemkey.For("monthly-charge", "cus_A", "2026-01", "1")
	if err != nil {
		panic(err)
	}
	ctx := idemkey.WithKey(context.Background(), key)
	for range 3 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+"/v1/charges", strings.NewReader("amount=1000"))
		resp, err := client.Do(req)
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			break
		}
	}

	// Without a key, nothing is sent.
	req, _ := http.NewRequestWithContext(context.Background(), http.MethodPost, srv.URL+"/v1/charges", strings.NewReader("amount=1000"))
	_, err = client.Do(req)
	var missing *idemkey.MissingKeyError
	fmt.Println(errors.As(err, &missing), attempts.Load())
	// Output:
	// attempt 1: Idempotency-Key bo1_60a26cf59a2124b696acfc108499d2e9c422019105d8a0f5be2b8d599634fe0e
	// attempt 2: Idempotency-Key bo1_60a26cf59a2124b696acfc108499d2e9c422019105d8a0f5be2b8d599634fe0e
	// true 2
}
