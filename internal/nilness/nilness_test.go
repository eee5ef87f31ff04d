package nilness

import (
	"io"
	"testing"
)

func TestIs(t *testing.T) {
	var p *int
	var r io.Reader
	var typedNil io.Reader = (*nilReader)(nil)
	for v, want := range map[string]struct {
		v    any
		want bool
	}{
		"nil": {nil, true}, "nil pointer": {p, true}, "nil interface": {r, true},
		"typed nil in interface": {typedNil, true}, "int": {0, false}, "value": {&nilReader{}, false},
	} {
		if got := Is(want.v); got != want.want {
			t.Errorf("Is(%s) = %v, want %v", v, got, want.want)
		}
	}
}

type nilReader struct{}

func (*nilReader) Read([]byte) (int, error) { return 0, io.EOF }
