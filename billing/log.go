package billing

import "log/slog"

const (
	slogDebug = slog.LevelDebug
	slogInfo  = slog.LevelInfo
	slogWarn  = slog.LevelWarn
	slogError = slog.LevelError
)

// attrs are the fields every log line about a charge carries. Keys are not
// secrets; the Stripe key never reaches a log line.
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
		out = append(out, slog.Any(name, kv[i+1]))
	}
	return out
}
