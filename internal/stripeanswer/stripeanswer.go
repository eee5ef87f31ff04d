// Package stripeanswer tells Stripe's answers from those of whatever else
// may answer in its place (a spend-cap proxy, a web server at a wrong
// address, a load balancer), and rewrites an answer into Stripe's error
// shape, so that stripe-go judges it by its status like any answer of
// Stripe's. billing's transport and spendcap's both use it.
package stripeanswer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// MaxBody is how much of an error answer is read to tell its shape; a
// larger body is never Stripe's error object nor a proxy's refusal.
const MaxBody = 64 << 10

// Stamped reports whether resp carries a Request-Id starting "req_":
// Stripe stamps every API response with one, and proxies forward it, so
// such an answer is Stripe's whatever its status or body.
func Stamped(resp *http.Response) bool {
	return strings.HasPrefix(resp.Header.Get("Request-Id"), "req_")
}

// Peek reads up to MaxBody+1 bytes of resp's body and puts them back, so
// that resp.Body reads the whole body again from its start; the body is
// not closed. A buf longer than MaxBody means the body is larger.
func Peek(resp *http.Response) (buf []byte, err error) {
	buf, err = io.ReadAll(io.LimitReader(resp.Body, MaxBody+1))
	resp.Body = struct {
		io.Reader
		io.Closer
	}{io.MultiReader(bytes.NewReader(buf), resp.Body), resp.Body}
	return buf, err
}

// IsError reports whether body is a Stripe error object: a JSON object
// whose "error" member is an object with a "type".
func IsError(body []byte) bool {
	var shape struct {
		Error *struct {
			Type string `json:"type"`
		} `json:"error"`
	}
	return json.Unmarshal(body, &shape) == nil && shape.Error != nil && shape.Error.Type != ""
}

// Rewrite replaces resp's status with status and its body with a Stripe
// error object carrying msg, of type "api_error" for a 5xx and
// "invalid_request_error" otherwise, as Stripe types them. The old body
// must be closed by the caller; the headers are cloned, never modified in
// place, and Location is dropped.
func Rewrite(resp *http.Response, status int, msg string) *http.Response {
	typ := "invalid_request_error"
	if status >= 500 {
		typ = "api_error"
	}
	body, _ := json.Marshal(map[string]any{"error": map[string]string{"type": typ, "message": msg}})
	resp.StatusCode, resp.Status = status, fmt.Sprintf("%d %s", status, http.StatusText(status))
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	resp.Header = resp.Header.Clone()
	resp.Header.Del("Location")
	resp.Header.Set("Content-Length", strconv.Itoa(len(body)))
	resp.Header.Set("Content-Type", "application/json")
	return resp
}
