// Package redact prints URLs without what may hold a credential (user
// info, query, fragment), for billonce's errors and logs.
package redact

import (
	"net/url"
	"strings"
	"unicode"
)

// URL returns u without its user info, query and fragment, which may
// hold credentials (a password, an api_key parameter), so that it can be
// printed in errors and logs. billonce uses it wherever it prints a URL. A
// nil u gives "".
func URL(u *url.URL) string {
	if u == nil {
		return ""
	}
	r := url.URL{Scheme: u.Scheme, Host: u.Host, Path: u.Path, RawPath: u.RawPath}
	return r.String()
}

// RawURL is [URL] for a string that may not parse as a URL, such
// as a misconfigured base URL in an error message. One that parses is
// redacted as URL does. One that does not keeps its scheme, and of
// the rest only what follows the last '@' (user info may hold '/', '?' or
// '#'), up to the first '?' or '#'; control characters become '?'. Neither
// url.Parse's error nor the input should be printed in its place: both
// quote the user info.
func RawURL(s string) string {
	if u, err := url.Parse(s); err == nil {
		return URL(u)
	}
	scheme, rest := "", s
	if i := strings.Index(rest, "://"); i >= 0 {
		scheme, rest = rest[:i+3], rest[i+3:]
	}
	if i := strings.LastIndexByte(rest, '@'); i >= 0 {
		rest = rest[i+1:]
	}
	if i := strings.IndexAny(rest, "?#"); i >= 0 {
		rest = rest[:i]
	}
	return strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return '?'
		}
		return r
	}, scheme+rest)
}
