//go:build !unix

package billing_test

import (
	"net"
	"testing"
)

// refusedURL is an address where nothing listens: every connection is
// refused (until another server takes the port).
func refusedURL(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return "http://" + addr
}
