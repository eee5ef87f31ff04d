package ulid

import (
	"io"
	"time"
)

type ULID [16]byte

func Make() ULID                                                { return ULID{} }
func New(ms uint64, entropy io.Reader) (ULID, error)            { return ULID{}, nil }
func MustNew(ms uint64, entropy io.Reader) ULID                 { return ULID{} }
func Timestamp(t time.Time) uint64                              { return 0 }
func Now() uint64                                               { return 0 }
func Monotonic(entropy io.Reader, inc uint64) *MonotonicEntropy { return nil }
func (id ULID) String() string                                  { return "" }

type MonotonicEntropy struct{ io.Reader }
