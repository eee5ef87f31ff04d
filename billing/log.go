package billing

import (
	"context"
	"log/slog"
	"time"
)

const (
	slogDebug = slog.LevelDebug
	slogInfo  = slog.LevelInfo
	slogWarn  = slog.LevelWarn
	slogError = slog.LevelError
)

// attrs are the fields every log line about a charge carries. Keys are not
// secrets; the Stripe key never reaches a log line. Durations are written
// as readable strings ("1m30s"), not as slog's nanoseconds.
func attrs(j job, kv ...any) []slog.Attr {
	out := []slog.Attr{
		slog.String("customer", j.customer),
		slog.String("period", j.period),
		slog.String("key", j.key.String()),
		slog.Int("attempt", j.attempt),
	}
	for i := 0; i+1 < len(kv); i += 2 {
		name, _ := kv[i].(string)
		if name == "attempt" {
			name = "claim_attempts"
		}
		if d, ok := kv[i+1].(time.Duration); ok {
			out = append(out, duration(name, d))
			continue
		}
		out = append(out, slog.Any(name, kv[i+1]))
	}
	return out
}

// duration is a log field for d as people read it: slog.Duration is
// nanoseconds in JSON.
func duration(name string, d time.Duration) slog.Attr { return slog.String(name, d.String()) }

// defaultHandler is the handler of a Biller without Config.Logger, as
// River's is: warnings and errors go to slog.Default's handler (looked up
// for each line, so a default set after New is used), the rest is dropped.
type defaultHandler struct{}

func (defaultHandler) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slogWarn && slog.Default().Handler().Enabled(ctx, l)
}

func (defaultHandler) Handle(ctx context.Context, r slog.Record) error {
	return slog.Default().Handler().Handle(ctx, r)
}

func (defaultHandler) WithAttrs(as []slog.Attr) slog.Handler {
	return warnings{slog.Default().Handler().WithAttrs(as)}
}

func (defaultHandler) WithGroup(name string) slog.Handler {
	return warnings{slog.Default().Handler().WithGroup(name)}
}

// warnings passes on warnings and errors only.
type warnings struct{ slog.Handler }

func (h warnings) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= slogWarn && h.Handler.Enabled(ctx, l)
}

func (h warnings) WithAttrs(as []slog.Attr) slog.Handler { return warnings{h.Handler.WithAttrs(as)} }
func (h warnings) WithGroup(name string) slog.Handler    { return warnings{h.Handler.WithGroup(name)} }
