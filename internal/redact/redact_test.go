package redact

import (
	"net/url"
	"strings"
	"testing"
)

// URL and RawURL keep scheme, host and path, and drop what may
// hold a credential, whether the URL parses or not.
func TestURLKeepsNoCredential(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct{ in, want string }{
		{"https://user:s3cr3t@api.example.com/v1?api_key=sk_live_x#frag", "https://api.example.com/v1"},
		{"https://api.example.com/stripe", "https://api.example.com/stripe"},
		{"https://user:s3cr3t@api.example.com:bad/?key=sk_live_x", "https://api.example.com:bad/"},
		{"https://user:s3cr3t/pass@api.example.com/v1?key=sk_live_x", "https://api.example.com/v1"},
		{"https://user:s3cr3t?pass@api.example.com/v1?key=sk_live_x#frag", "https://api.example.com/v1"},
		{"https://user:s3cr3t#pass@api.example.com/%zz?key=sk_live_x", "https://api.example.com/%zz"},
		{"http://user:s3cr3t@api exa mple.com/?key=sk_live_x", "http://api exa mple.com/"},
		{"https://api.example.com/\x00?key=sk_live_x", "https://api.example.com/?"},
		{"user:s3cr3t@api.example.com/?key=sk_live_x", "user:"},
		{"", ""},
	} {
		in := tt.in
		got := RawURL(in)
		if got != tt.want {
			t.Errorf("RawURL(%q) = %q; want %q", in, got, tt.want)
		}
		for _, secret := range []string{"s3cr3t", "sk_live_x", "frag"} {
			if strings.Contains(got, secret) {
				t.Errorf("RawURL(%q) = %q keeps %q", in, got, secret)
			}
		}
		if u, err := url.Parse(in); err == nil && URL(u) != got {
			t.Errorf("URL(%q) = %q; RawURL gives %q", in, URL(u), got)
		}
	}
	if got := URL(nil); got != "" {
		t.Errorf("URL(nil) = %q", got)
	}
}
