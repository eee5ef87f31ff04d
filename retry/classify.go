package retry

import (
	"context"
	"errors"
	"io"
	"net"
	"syscall"
)

// DefaultClassify retries plain network failures, after which the outcome
// of a request is unknown but resending it with the same key is safe:
//
//   - a timeout: a [net.Error] whose Timeout reports true, or
//     [context.DeadlineExceeded] (Do never consults the classifier once the
//     caller's context is done, so a deadline seen here is an attempt's own);
//   - a connection reset or refused (ECONNRESET, ECONNREFUSED);
//   - a connection closed early: [io.ErrUnexpectedEOF], or [io.EOF] as
//     net/http reports a connection dropped before the response.
//
// Everything else, [context.Canceled] included, is [Stop]. Protocol answers
// (HTTP status codes, API error types) are the caller's to classify: wrap
// DefaultClassify in a classifier that knows them.
func DefaultClassify(err error) Decision {
	var ne net.Error
	switch {
	case err == nil, errors.Is(err, context.Canceled):
		return Stop()
	case errors.Is(err, context.DeadlineExceeded),
		errors.As(err, &ne) && ne.Timeout(),
		errors.Is(err, syscall.ECONNRESET),
		errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, io.EOF):
		return After(0)
	}
	return Stop()
}
