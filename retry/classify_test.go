package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"syscall"
	"testing"
	"time"

	"github.com/billonce/billonce/retry"
)

func TestDefaultClassify(t *testing.T) {
	tests := []struct {
		name  string
		err   error
		retry bool
	}{
		{"nil", nil, false},
		{"plain error", errors.New("card declined"), false},
		{"canceled", context.Canceled, false},
		{"canceled in url.Error", &url.Error{Op: "Post", URL: "https://api.example.com", Err: context.Canceled}, false},
		{"deadline exceeded", context.DeadlineExceeded, true},
		{"deadline in url.Error", &url.Error{Op: "Post", URL: "https://api.example.com", Err: context.DeadlineExceeded}, true},
		{"i/o timeout", &net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		{"connection reset", &net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		{"connection refused", &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		{"unexpected EOF", fmt.Errorf("reading body: %w", io.ErrUnexpectedEOF), true},
		{"EOF in url.Error", &url.Error{Op: "Post", URL: "https://api.example.com", Err: io.EOF}, true},
		{"net error, no timeout", &net.OpError{Op: "dial", Net: "tcp", Err: errors.New("no route")}, false},
		{"DNS not found", &net.DNSError{Err: "no such host", Name: "api.example.com", IsNotFound: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := retry.DefaultClassify(tt.err); got.Retry() != tt.retry || got.Wait() != 0 {
				t.Errorf("DefaultClassify(%v) = %v, want retry=%v", tt.err, got, tt.retry)
			}
		})
	}
}

// Errors produced by real connections on loopback, as an HTTP client sees
// them.
func TestDefaultClassifyRealErrors(t *testing.T) {
	t.Run("connection refused", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close()
		_, err = http.Post("http://"+addr+"/v1/charges", "text/plain", nil)
		if err == nil || !retry.DefaultClassify(err).Retry() {
			t.Fatalf("DefaultClassify(%v) = stop, want retry", err)
		}
	})
	t.Run("connection dropped before the response", func(t *testing.T) {
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close()
			}
		}))
		defer srv.Close()
		_, err := http.Post(srv.URL+"/v1/charges", "text/plain", nil)
		if err == nil || !retry.DefaultClassify(err).Retry() {
			t.Fatalf("DefaultClassify(%v) = stop, want retry", err)
		}
	})
	t.Run("client timeout", func(t *testing.T) {
		block := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
		defer srv.Close()
		defer close(block)
		c := &http.Client{Timeout: 50 * time.Millisecond}
		_, err := c.Post(srv.URL+"/v1/charges", "text/plain", nil)
		if err == nil || !retry.DefaultClassify(err).Retry() {
			t.Fatalf("DefaultClassify(%v) = stop, want retry", err)
		}
	})
	t.Run("read deadline", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		a.SetReadDeadline(time.Now())
		_, err := a.Read(make([]byte, 1))
		if err == nil || !retry.DefaultClassify(err).Retry() {
			t.Fatalf("DefaultClassify(%v) = stop, want retry", err)
		}
	})
}
