// Package proxyhook reaches a test hook of spendcap.Proxy that its API does
// not show: package spendcap sets SetBeforeReply when it is initialized,
// and spendcaptest and spendcap's tests call it to lose answers on purpose.
package proxyhook

import "net/http"

// SetBeforeReply installs f on proxy, a *spendcap.Proxy: f is called after
// a forwarded request is settled and audited, before its answer is written.
// nil removes it.
var SetBeforeReply func(proxy any, f func(*http.Request))
