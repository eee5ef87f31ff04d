package main

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"os"
	"runtime/pprof"
	"slices"
	"sync/atomic"
	"time"
)

// stripeDelays draws n answer times shaped like Stripe's for a charge: a
// log-normal with a median of 300ms and σ = 0.6 (p90 about 650ms, p99
// about 1.2s), capped at 10s. The seed is fixed, so that billonce and the
// naive loop meet the same delays in the same order.
func stripeDelays(n int) []time.Duration {
	r := rand.New(rand.NewPCG(1, 2))
	out := make([]time.Duration, n)
	for i := range out {
		d := 0.3 * math.Exp(0.6*r.NormFloat64())
		out[i] = time.Duration(min(d, 10) * float64(time.Second))
	}
	return out
}

// latency delays each answer by the next of delays, as if Stripe took that
// long to answer.
type latency struct {
	base   http.RoundTripper
	delays []time.Duration
	next   atomic.Int64
}

func newLatency(delays []time.Duration, conns int) *latency {
	base := http.DefaultTransport.(*http.Transport).Clone()
	base.MaxIdleConnsPerHost = conns
	return &latency{base: base, delays: delays}
}

func (l *latency) RoundTrip(req *http.Request) (*http.Response, error) {
	resp, err := l.base.RoundTrip(req)
	d := l.delays[int(l.next.Add(1)-1)%len(l.delays)]
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-req.Context().Done():
	}
	return resp, err
}

func benchLatency(ctx context.Context, e *env, o options, t *table) error {
	n := o.latencyN
	delays := stripeDelays(n)
	var safe, naive []float64
	for range max(1, o.reps) {
		s, err := billonceRun(ctx, e, o, n, nil, newLatency(delays, o.concurrency))
		if err != nil {
			return err
		}
		nv, err := naiveRun(ctx, o, n, newLatency(delays, o.concurrency))
		if err != nil {
			return err
		}
		safe, naive = append(safe, s.rate), append(naive, nv.rate)
	}
	sorted := slices.Sorted(slices.Values(delays))
	ms, mn := median(safe), median(naive)
	t.add(fmt.Sprintf("Run of %d, Stripe-like latency, billonce", n), fmt.Sprintf("%.1f charges/s", ms),
		fmt.Sprintf("answers after %v median, %v p90, %v p99 (log-normal, same delays for both); concurrency %d",
			sorted[n/2].Round(time.Millisecond), sorted[n*9/10].Round(time.Millisecond), sorted[n*99/100].Round(time.Millisecond), o.concurrency))
	t.add(fmt.Sprintf("Run of %d, Stripe-like latency, naive loop", n), fmt.Sprintf("%.1f charges/s", mn), "stripe-go, random keys, no database")
	t.add("billonce / naive, Stripe-like latency", fmt.Sprintf("%.2f", ms/mn), fmt.Sprintf("per rep: billonce %s, naive %s", rates(safe), rates(naive)))
	return nil
}

func rates(xs []float64) string {
	s := ""
	for i, x := range xs {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%.1f", x)
	}
	return s
}

// writeAllocs writes the allocation profile to path.
func writeAllocs(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("allocs").WriteTo(f, 0)
}
