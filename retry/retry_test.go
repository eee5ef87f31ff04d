package retry_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/retry"
)

// errReset stands for a connection reset: DefaultClassify retries it.
var errReset = fmt.Errorf("read tcp: %w", syscall.ECONNRESET)

func newKey(tb testing.TB, parts ...string) idemkey.Key {
	tb.Helper()
	k, err := idemkey.For("invoice", parts...)
	if err != nil {
		tb.Fatalf("idemkey.For(%q): %v", parts, err)
	}
	return k
}

// recorder is an op that fails with errs[i] on attempt i+1 and succeeds
// after them, recording the key and start time of every attempt.
type recorder struct {
	errs   []error
	keys   []idemkey.Key
	starts []time.Time
}

func (r *recorder) op(ctx context.Context, key idemkey.Key) (string, error) {
	r.keys = append(r.keys, key)
	r.starts = append(r.starts, time.Now())
	if n := len(r.keys); n <= len(r.errs) {
		return "", r.errs[n-1]
	}
	return "ch_1", nil
}

func repeat(err error, n int) []error {
	errs := make([]error, n)
	for i := range errs {
		errs[i] = err
	}
	return errs
}

// Every write carries a key: no retry layer makes a key; every attempt carries the caller's key.
func TestSameKeyOnEveryAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		key := newKey(t, "cus_1", "2025-01")
		r := &recorder{errs: []error{errReset, io.ErrUnexpectedEOF, errReset}}
		got, err := retry.Do(t.Context(), key, retry.Policy{}, r.op)
		if err != nil || got != "ch_1" {
			t.Fatalf("Do = %q, %v; want ch_1, nil", got, err)
		}
		if len(r.keys) != 4 {
			t.Fatalf("attempts = %d, want 4", len(r.keys))
		}
		for i, k := range r.keys {
			if k != key {
				t.Errorf("attempt %d key = %q, want %q", i+1, k, key)
			}
		}
	})
}

func TestPermanentErrorStopsAfterOneAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		declined := errors.New("card declined")
		r := &recorder{errs: repeat(declined, 5)}
		_, err := retry.Do(t.Context(), newKey(t, "cus_1"), retry.Policy{}, r.op)
		if err != declined {
			t.Fatalf("Do error = %v, want the op's error unchanged", err)
		}
		var ex *retry.ExhaustedError
		if errors.As(err, &ex) {
			t.Fatalf("a stop decision returned %v, want no ExhaustedError", ex)
		}
		if len(r.keys) != 1 {
			t.Fatalf("attempts = %d, want 1", len(r.keys))
		}
	})
}

func TestContextCancelStops(t *testing.T) {
	t.Run("before the first attempt", func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		cancel()
		r := &recorder{}
		_, err := retry.Do(ctx, newKey(t, "cus_1"), retry.Policy{}, r.op)
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("Do error = %v, want context.Canceled", err)
		}
		if len(r.keys) != 0 {
			t.Fatalf("op ran %d times on a cancelled context", len(r.keys))
		}
	})
	t.Run("during the wait", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			r := &recorder{errs: repeat(errReset, 10)}
			p := retry.Policy{
				InitialInterval: time.Second,
				Notify:          func(retry.Event) { cancel() },
			}
			start := time.Now()
			_, err := retry.Do(ctx, newKey(t, "cus_1"), p, r.op)
			if !errors.Is(err, context.Canceled) || !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("Do error = %v, want it to wrap context.Canceled and the last op error", err)
			}
			if len(r.keys) != 1 {
				t.Fatalf("attempts = %d, want 1", len(r.keys))
			}
			if d := time.Since(start); d != 0 {
				t.Fatalf("Do returned after %v, want at once on cancel", d)
			}
		})
	})
	t.Run("during an attempt", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			calls := 0
			op := func(ctx context.Context, _ idemkey.Key) (int, error) {
				calls++
				time.AfterFunc(time.Second, cancel)
				<-ctx.Done()
				return 0, fmt.Errorf("post: %w", ctx.Err())
			}
			// Once ctx is done the classifier is not consulted: cancellation
			// wins even over a classifier that would stop or retry.
			classified := 0
			p := retry.Policy{Classify: func(error) retry.Decision { classified++; return retry.Stop() }}
			_, err := retry.Do(ctx, newKey(t, "cus_1"), p, op)
			if !errors.Is(err, context.Canceled) {
				t.Fatalf("Do error = %v, want context.Canceled", err)
			}
			if !strings.Contains(err.Error(), "after 1 attempt:") {
				t.Errorf("Do error = %q, want it to give the attempt count", err)
			}
			if calls != 1 || classified != 0 {
				t.Fatalf("attempts = %d, classifier calls = %d; want 1, 0", calls, classified)
			}
		})
	})
}

func TestAttemptTimeoutCancelsHungAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		key := newKey(t, "cus_1", "2025-01")
		var keys []idemkey.Key
		var deadlines []time.Duration
		op := func(ctx context.Context, k idemkey.Key) (string, error) {
			keys = append(keys, k)
			dl, _ := ctx.Deadline()
			deadlines = append(deadlines, time.Until(dl))
			if len(keys) == 1 {
				<-ctx.Done() // hung until the attempt's deadline
				return "", ctx.Err()
			}
			return "ch_1", nil
		}
		start := time.Now()
		got, err := retry.Do(t.Context(), key, retry.Policy{AttemptTimeout: 10 * time.Second}, op)
		if err != nil || got != "ch_1" {
			t.Fatalf("Do = %q, %v; want ch_1, nil", got, err)
		}
		if len(keys) != 2 || keys[0] != key || keys[1] != key {
			t.Fatalf("attempt keys = %v, want [%v %v]", keys, key, key)
		}
		for i, d := range deadlines {
			if d != 10*time.Second {
				t.Errorf("attempt %d deadline in %v, want 10s", i+1, d)
			}
		}
		if el := time.Since(start); el < 10*time.Second || el > 10*time.Second+retry.DefaultMaxInterval {
			t.Errorf("elapsed %v, want the 10s timeout plus one backoff", el)
		}
	})
}

func TestBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := &recorder{errs: repeat(errReset, 1000)}
		p := retry.Policy{
			InitialInterval: time.Second,
			MaxInterval:     4 * time.Second,
			MaxAttempts:     1000,
			MaxElapsed:      30 * time.Second,
		}
		start := time.Now()
		_, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op)
		elapsed := time.Since(start)
		var ex *retry.ExhaustedError
		if !errors.As(err, &ex) || !errors.Is(err, syscall.ECONNRESET) {
			t.Fatalf("Do error = %v, want *ExhaustedError wrapping the last op error", err)
		}
		if ex.Attempts != len(r.keys) {
			t.Errorf("ExhaustedError.Attempts = %d, op ran %d times", ex.Attempts, len(r.keys))
		}
		if !strings.Contains(err.Error(), "time budget") {
			t.Errorf("error %q does not say the budget was spent", err)
		}
		if elapsed >= p.MaxElapsed {
			t.Errorf("Do ran for %v, budget %v", elapsed, p.MaxElapsed)
		}
		// With waits of at most 4s, giving up early would leave more than 4s.
		if last := r.starts[len(r.starts)-1].Sub(start); last < p.MaxElapsed-p.MaxInterval {
			t.Errorf("last attempt at %v, want Do to use its budget (within %v of %v)", last, p.MaxInterval, p.MaxElapsed)
		}
	})
}

func TestBudgetBoundsAttemptDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		calls := 0
		op := func(ctx context.Context, _ idemkey.Key) (int, error) {
			calls++
			<-ctx.Done()
			return 0, ctx.Err()
		}
		p := retry.Policy{AttemptTimeout: time.Hour, MaxElapsed: 5 * time.Second}
		start := time.Now()
		_, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, op)
		var ex *retry.ExhaustedError
		if !errors.As(err, &ex) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Do error = %v, want *ExhaustedError wrapping context.DeadlineExceeded", err)
		}
		if el := time.Since(start); el != 5*time.Second {
			t.Errorf("Do ran for %v, want the 5s budget", el)
		}
		if calls != 1 {
			t.Errorf("attempts = %d, want 1", calls)
		}
	})
}

func TestMaxAttempts(t *testing.T) {
	for _, n := range []int{1, 2, 5, retry.DefaultMaxAttempts} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				r := &recorder{errs: repeat(errReset, 100)}
				p := retry.Policy{MaxAttempts: n}
				if n == retry.DefaultMaxAttempts {
					p.MaxAttempts = 0 // the default
				}
				_, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op)
				var ex *retry.ExhaustedError
				if !errors.As(err, &ex) {
					t.Fatalf("Do error = %v, want *ExhaustedError", err)
				}
				if len(r.keys) != n || ex.Attempts != n {
					t.Fatalf("op ran %d times, ExhaustedError.Attempts = %d; want %d", len(r.keys), ex.Attempts, n)
				}
				if want := fmt.Sprintf("gave up after %d attempt", n); !strings.Contains(err.Error(), want) {
					t.Errorf("error %q does not contain %q", err, want)
				}
			})
		})
	}
}

func TestBackoffStaysWithinBounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var waits []time.Duration
		p := retry.Policy{
			InitialInterval: 100 * time.Millisecond,
			MaxInterval:     time.Second,
			MaxAttempts:     20,
			Notify:          func(e retry.Event) { waits = append(waits, e.Wait) },
		}
		r := &recorder{errs: repeat(errReset, 19)}
		if _, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op); err != nil {
			t.Fatal(err)
		}
		for i, w := range waits {
			if w <= 0 || w > p.MaxInterval {
				t.Errorf("wait %d = %v, want in (0, %v]", i+1, w, p.MaxInterval)
			}
		}
		if waits[0] > 150*time.Millisecond {
			t.Errorf("first wait = %v, want at most InitialInterval + 50%% jitter", waits[0])
		}
		for i := 1; i < len(r.starts); i++ {
			if gap := r.starts[i].Sub(r.starts[i-1]); gap != waits[i-1] {
				t.Errorf("gap before attempt %d = %v, Notify said %v", i+1, gap, waits[i-1])
			}
		}
	})
}

func TestRetryAfter(t *testing.T) {
	inUse := errors.New("key in use")
	classify := func(err error) retry.Decision {
		if err == inUse {
			return retry.After(10 * time.Second)
		}
		return retry.Stop()
	}
	t.Run("honoured beyond MaxInterval", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &recorder{errs: []error{inUse, inUse}}
			p := retry.Policy{Classify: classify, InitialInterval: 100 * time.Millisecond, MaxInterval: time.Second}
			if _, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op); err != nil {
				t.Fatal(err)
			}
			if len(r.starts) != 3 {
				t.Fatalf("attempts = %d, want 3", len(r.starts))
			}
			for i := 1; i < 3; i++ {
				if gap := r.starts[i].Sub(r.starts[i-1]); gap != 10*time.Second {
					t.Errorf("gap before attempt %d = %v, want the requested 10s", i+1, gap)
				}
			}
		})
	})
	t.Run("not past the budget", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			r := &recorder{errs: []error{inUse}}
			p := retry.Policy{Classify: classify, MaxElapsed: 5 * time.Second}
			start := time.Now()
			_, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op)
			var ex *retry.ExhaustedError
			if !errors.As(err, &ex) || ex.Attempts != 1 || !errors.Is(err, inUse) {
				t.Fatalf("Do error = %v, want *ExhaustedError after 1 attempt wrapping the op error", err)
			}
			if el := time.Since(start); el != 0 {
				t.Errorf("Do waited %v for a retry it could not make", el)
			}
		})
	})
}

// A classifier's deadline is checked before each wait, as the budget is:
// Do gives up at once, without the wait that would end past it, and returns
// the error the decision names.
func TestUntil(t *testing.T) {
	errGone := errors.New("server gone")
	for _, tc := range []struct {
		name     string
		until    time.Duration // from the start of Do
		past     error
		budget   time.Duration
		want     error  // errors.Is
		wantWhy  string // in an *ExhaustedError's message, "" for none
		deadline time.Duration
	}{
		{"its error", 10 * time.Second, errGone, 30 * time.Second, errGone, "", 10 * time.Second},
		{"no error: exhausted", 10 * time.Second, nil, 30 * time.Second, errReset, "deadline", 10 * time.Second},
		{"past the budget: the budget's", 60 * time.Second, errGone, 30 * time.Second, errReset, "time budget", 30 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				start := time.Now()
				var waits []time.Duration
				p := retry.Policy{
					Classify: func(err error) retry.Decision {
						return retry.DefaultClassify(err).Until(start.Add(tc.until), tc.past)
					},
					InitialInterval: time.Second,
					MaxInterval:     4 * time.Second,
					MaxAttempts:     1000,
					MaxElapsed:      tc.budget,
					Notify:          func(e retry.Event) { waits = append(waits, e.Wait) },
				}
				r := &recorder{errs: repeat(errReset, 1000)}
				_, err := retry.Do(t.Context(), newKey(t, "cus_1"), p, r.op)
				if !errors.Is(err, tc.want) {
					t.Fatalf("Do error = %v, want %v", err, tc.want)
				}
				var ex *retry.ExhaustedError
				if got := errors.As(err, &ex); got != (tc.wantWhy != "") || got && !strings.Contains(err.Error(), tc.wantWhy) {
					t.Errorf("Do error = %v; want an *ExhaustedError saying %q: %v", err, tc.wantWhy, tc.wantWhy != "")
				}
				var total time.Duration
				for _, w := range waits {
					total += w
				}
				if el := time.Since(start); total >= tc.deadline || el != total {
					t.Errorf("waited %v in all, Do ran %v; want the waits only, ending before %v", total, el, tc.deadline)
				}
				if total < tc.deadline-p.MaxInterval {
					t.Errorf("waited %v in all; want Do to use its time (within %v of %v)", total, p.MaxInterval, tc.deadline)
				}
			})
		})
	}
	if d := retry.Stop().Until(time.Now(), errGone); d.Retry() || d != retry.Stop() {
		t.Errorf("Stop().Until = %v; want stop", d)
	}
}

func TestZeroKeyRejected(t *testing.T) {
	r := &recorder{}
	_, err := retry.Do(t.Context(), idemkey.Key{}, retry.Policy{}, r.op)
	if !errors.Is(err, retry.ErrInvalid) {
		t.Fatalf("Do error = %v, want ErrInvalid", err)
	}
	if len(r.keys) != 0 {
		t.Fatalf("op ran %d times with a zero key", len(r.keys))
	}
}

func TestNilOpRejected(t *testing.T) {
	_, err := retry.Do[int](t.Context(), newKey(t, "cus_1"), retry.Policy{}, nil)
	if !errors.Is(err, retry.ErrInvalid) || !strings.Contains(err.Error(), "nil op") {
		t.Fatalf("Do error = %v, want a nil op error wrapping ErrInvalid", err)
	}
}

func TestInvalidPolicyRejected(t *testing.T) {
	tests := []struct {
		p     retry.Policy
		field string
	}{
		{retry.Policy{InitialInterval: -1}, "InitialInterval"},
		{retry.Policy{MaxInterval: -time.Second}, "MaxInterval"},
		{retry.Policy{MaxAttempts: -1}, "MaxAttempts"},
		{retry.Policy{AttemptTimeout: -time.Second}, "AttemptTimeout"},
		{retry.Policy{MaxElapsed: -time.Second}, "MaxElapsed"},
		{retry.Policy{MaxElapsed: retry.KeyWindow}, "MaxElapsed"},
		{retry.Policy{MaxElapsed: 48 * time.Hour}, "MaxElapsed"},
		{retry.Policy{InitialInterval: time.Minute}, "InitialInterval"}, // above the default MaxInterval
		{retry.Policy{InitialInterval: 2 * time.Second, MaxInterval: time.Second}, "InitialInterval"},
		// Past the key window no wait or attempt can be meant, and backoff's
		// jitter overflows on such intervals into waits of 0: a hot loop.
		{retry.Policy{InitialInterval: math.MaxInt64, MaxInterval: math.MaxInt64}, "InitialInterval"},
		{retry.Policy{MaxInterval: math.MaxInt64}, "MaxInterval"},
		{retry.Policy{MaxInterval: retry.KeyWindow}, "MaxInterval"},
		{retry.Policy{AttemptTimeout: math.MaxInt64}, "AttemptTimeout"},
	}
	for _, tt := range tests {
		t.Run(fmt.Sprintf("%+v", tt.p), func(t *testing.T) {
			err := tt.p.Validate()
			if !errors.Is(err, retry.ErrInvalid) {
				t.Fatalf("Validate() = %v, want ErrInvalid", err)
			}
			if !strings.Contains(err.Error(), tt.field) {
				t.Errorf("Validate() = %q, want it to name %s", err, tt.field)
			}
			r := &recorder{}
			if _, err := retry.Do(t.Context(), newKey(t, "cus_1"), tt.p, r.op); !errors.Is(err, retry.ErrInvalid) {
				t.Errorf("Do error = %v, want ErrInvalid", err)
			}
			if len(r.keys) != 0 {
				t.Errorf("op ran %d times under an invalid policy", len(r.keys))
			}
		})
	}
}

func TestValidPolicies(t *testing.T) {
	for _, p := range []retry.Policy{
		{},
		{MaxAttempts: 1},
		{MaxElapsed: retry.KeyWindow - time.Minute, AttemptTimeout: time.Hour},
		{InitialInterval: time.Second, MaxInterval: time.Second},
	} {
		if err := p.Validate(); err != nil {
			t.Errorf("Policy%+v.Validate() = %v, want nil", p, err)
		}
	}
}

// Notify is called once per retry, never for the attempt Do gives up on.
func TestNotifyOncePerRetry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		key := newKey(t, "cus_1")
		var events []retry.Event
		p := retry.Policy{MaxAttempts: 4, Notify: func(e retry.Event) { events = append(events, e) }}
		r := &recorder{errs: repeat(errReset, 10)}
		_, err := retry.Do(t.Context(), key, p, r.op)
		var ex *retry.ExhaustedError
		if !errors.As(err, &ex) {
			t.Fatalf("Do error = %v, want *ExhaustedError", err)
		}
		if len(events) != 3 {
			t.Fatalf("Notify called %d times for 4 attempts, want 3", len(events))
		}
		for i, e := range events {
			if e.Attempt != i+1 || e.Key != key || e.Err != errReset || e.Wait <= 0 {
				t.Errorf("event %d = %+v, want attempt %d, key %v, err %v, positive wait", i, e, i+1, key, errReset)
			}
		}
	})
}

func TestConcurrentCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var retries atomic.Int64
		p := retry.Policy{Notify: func(retry.Event) { retries.Add(1) }} // shared by all calls
		const n = 100
		var wg sync.WaitGroup
		for i := range n {
			key := newKey(t, fmt.Sprintf("cus_%d", i), "2025-01")
			wg.Go(func() {
				r := &recorder{errs: repeat(errReset, i%4)}
				got, err := retry.Do(t.Context(), key, p, r.op)
				if err != nil || got != "ch_1" {
					t.Errorf("call %d: Do = %q, %v", i, got, err)
				}
				for _, k := range r.keys {
					if k != key {
						t.Errorf("call %d: attempt carried %v, want %v", i, k, key)
					}
				}
			})
		}
		wg.Wait()
		if want := int64(n / 4 * (0 + 1 + 2 + 3)); retries.Load() != want {
			t.Errorf("retries = %d, want %d", retries.Load(), want)
		}
	})
}

func TestDecision(t *testing.T) {
	tests := []struct {
		d     retry.Decision
		retry bool
		wait  time.Duration
		str   string
	}{
		{retry.Decision{}, false, 0, "stop"},
		{retry.Stop(), false, 0, "stop"},
		{retry.After(0), true, 0, "again"},
		{retry.After(3 * time.Second), true, 3 * time.Second, "after 3s"},
		{retry.After(-time.Second), true, 0, "again"},
		{retry.After(time.Second).Until(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC), nil), true, time.Second, "after 1s until 2026-01-02T03:04:05Z"},
	}
	for _, tt := range tests {
		if tt.d.Retry() != tt.retry || tt.d.Wait() != tt.wait || tt.d.String() != tt.str {
			t.Errorf("%v: Retry=%v Wait=%v String=%q; want %v %v %q", tt.d, tt.d.Retry(), tt.d.Wait(), tt.d.String(), tt.retry, tt.wait, tt.str)
		}
	}
}

func BenchmarkDoFirstAttempt(b *testing.B) {
	key := newKey(b, "cus_1", "2025-01")
	op := func(context.Context, idemkey.Key) (int, error) { return 1, nil }
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := retry.Do(ctx, key, retry.Policy{}, op); err != nil {
			b.Fatal(err)
		}
	}
}
