//go:build unix

package billing_test

import (
	"fmt"
	"syscall"
	"testing"
)

// refusedURL is an address where nothing listens, held for the test: a
// TCP socket bound to a port and never listening, so that every
// connection to it is refused and no other test's server can take the
// port meanwhile (a port freed by closing a listener can be taken at once
// by a server started in parallel, which would answer).
func refusedURL(tb testing.TB) string {
	tb.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		tb.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		tb.Fatal(err)
	}
	return fmt.Sprintf("http://127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
