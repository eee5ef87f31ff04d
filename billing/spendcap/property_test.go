package spendcap_test

import (
	"context"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/billing/spendcap/spendcaptest"
	"github.com/billonce/billonce/internal/testenv"
)

var (
	propIterations = flag.Int("spendcap.iterations", testenv.Size(10, 40), "iterations of TestProxyNeverPassesTheCap")
	propSeed       = flag.Uint64("spendcap.seed", 1, "first seed of TestProxyNeverPassesTheCap")
)

// TestProxyNeverPassesTheCap sends random concurrent sequences of new
// writes, replays, lost answers, amounts above the cap, clock jumps
// across Stripe's key lifetime and cap changes through the proxy, to a fake
// Stripe that fails on purpose (5xx before and after executing, cut and
// dropped connections, declines, keys in use). Whatever the interleaving,
// the money moved at the fake stays within what the proxy counted, and
// that within the highest cap the key had; a replay is never counted.
//
//	go test ./billing/spendcap -run NeverPasses -spendcap.iterations=10000
func TestProxyNeverPassesTheCap(t *testing.T) {
	t.Parallel()
	n := *propIterations
	var sent, refused, moved int64
	for i := range n {
		seed := *propSeed + uint64(i)
		s, r, m := capProperty(t, seed)
		sent, refused, moved = sent+s, refused+r, moved+m
		if t.Failed() {
			t.Fatalf("seed %d failed; rerun with -spendcap.seed=%d -spendcap.iterations=1", seed, seed)
		}
	}
	t.Logf("%d iterations from seed %d: %d requests, %d refused by the proxy, %d cents moved at the fake", n, *propSeed, sent, refused, moved)
}

type propOp struct {
	kind     int // 0 new write, 1 replay, 2 write whose answer is lost, 3 clock jump, 4 cap change, 5 huge amount
	amount   int64
	jump     time.Duration
	capValue int64
	pick     int
}

func capProperty(t *testing.T, seed uint64) (sent, refused, moved int64) {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	srv := billingtest.NewServer(billingtest.Config{APIKeys: []string{upstreamKey}})
	defer srv.Close()
	script, err := billingtest.RandomFaults(int64(seed), map[billingtest.FaultKind]float64{
		billingtest.FaultErrorBefore: 0.05, billingtest.FaultErrorAfter: 0.05, billingtest.FaultCut: 0.05,
		billingtest.FaultDrop: 0.03, billingtest.FaultDecline: 0.05, billingtest.FaultInFlight: 0.03,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv.SetScript(script)
	px := spendcaptest.NewProxy(spendcaptest.Config{Upstream: srv.URL, StripeKey: upstreamKey, Clock: srv})
	defer px.Close()
	capAmount := 1000 + rng.Int64N(9000)
	maxCap := capAmount
	px.IssueKey(vaultKey, spendcap.Key{CapAmount: capAmount})

	workers := 2 + rng.IntN(4)
	plans := make([][]propOp, workers)
	for w := range plans {
		for range 4 + rng.IntN(8) {
			op := propOp{kind: weighted(rng, []int{45, 20, 10, 8, 8, 4}), amount: 1 + rng.Int64N(capAmount/2), pick: rng.IntN(1 << 20)}
			switch op.kind {
			case 3:
				op.jump = []time.Duration{time.Hour, 23*time.Hour + 57*time.Minute, 24*time.Hour + time.Minute, 25 * time.Hour}[rng.IntN(4)]
			case 4:
				op.capValue = 500 + rng.Int64N(12000)
				if op.capValue > maxCap {
					maxCap = op.capValue
				}
			case 5:
				op.amount = []int64{math.MaxInt64, math.MaxInt64 - 1, 99999999, capAmount + 1}[rng.IntN(4)]
			}
			plans[w] = append(plans[w], op)
		}
	}

	// Time jumps only while no request is in flight: a request takes at
	// most UpstreamTimeout between the proxy and Stripe, while a jump
	// stands for hours.
	var clock sync.RWMutex
	px.LoseAnswers(func(r *http.Request) bool { return r.Header.Get("X-Test-Lose") != "" })
	var (
		mu     sync.Mutex
		stats  [2]int64
		wg     sync.WaitGroup
		client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 16}}
	)
	defer client.CloseIdleConnections()
	for w, plan := range plans {
		wg.Add(1)
		go func() {
			defer wg.Done()
			type sentReq struct {
				idem, customer string
				amount         int64
			}
			var mine []sentReq
			send := func(r sentReq, lose bool) {
				clock.RLock()
				defer clock.RUnlock()
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				defer cancel()
				form := url.Values{"amount": {fmt.Sprint(r.amount)}, "currency": {"usd"}, "customer": {r.customer}}
				req, _ := http.NewRequestWithContext(ctx, http.MethodPost, px.URL+"/v1/charges", strings.NewReader(form.Encode()))
				req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
				req.Header.Set("Authorization", "Bearer "+vaultKey)
				req.Header.Set("Idempotency-Key", r.idem)
				if lose {
					req.Header.Set("X-Test-Lose", "1")
				}
				resp, err := client.Do(req)
				mu.Lock()
				stats[0]++
				if err == nil && resp.Header.Get("Request-Id") == "" && resp.StatusCode >= 400 && resp.StatusCode != http.StatusBadGateway {
					stats[1]++
				}
				mu.Unlock()
				if err == nil {
					resp.Body.Close()
				}
			}
			for j, op := range plan {
				fresh := sentReq{idem: fmt.Sprintf("w%d-%d", w, j), customer: fmt.Sprintf("cus_%d_%d", w, j), amount: op.amount}
				switch op.kind {
				case 0, 5:
					mine = append(mine, fresh)
					send(fresh, false)
				case 1:
					if len(mine) > 0 {
						send(mine[op.pick%len(mine)], op.pick%5 == 0)
					}
				case 2:
					mine = append(mine, fresh)
					send(fresh, true)
				case 3:
					clock.Lock()
					srv.Advance(op.jump)
					clock.Unlock()
				case 4:
					px.SetCap(vaultKey, op.capValue)
				}
			}
		}()
	}
	wg.Wait()
	u := px.Usage(vaultKey)
	if u.Reserved != 0 {
		t.Errorf("seed %d: %d still reserved after every request ended", seed, u.Reserved)
	}
	moved, _ = paid(srv)
	if moved > u.Spent {
		t.Errorf("seed %d: %d moved at the fake, %d counted by the proxy: money moved uncounted", seed, moved, u.Spent)
	}
	if u.Spent > maxCap {
		t.Errorf("seed %d: the proxy counted %d; the highest cap was %d", seed, u.Spent, maxCap)
	}
	if debugProp {
		for _, e := range px.Log() {
			t.Logf("%s %s amt=%d st=%d refused=%s replayed=%v kept=%v", e.Time.Format("01-02T15:04:05.000"), e.IdempotencyKey, e.Amount, e.Status, e.Refused, e.Replayed, e.Kept)
		}
		for _, p := range srv.Payments() {
			t.Logf("payment %+v", p)
		}
		for _, l := range srv.Log() {
			t.Logf("fake %+v", l)
		}
	}
	var charged int64
	for _, e := range px.Log() {
		if e.Replayed && e.Kept {
			t.Errorf("seed %d: a replay of %s was counted against the budget", seed, e.IdempotencyKey)
		}
		if e.Kept && e.Status < 300 {
			charged += e.Amount
		}
	}
	if charged > moved {
		t.Errorf("seed %d: the proxy counted %d as charged by Stripe, which moved %d", seed, charged, moved)
	}
	return stats[0], stats[1], moved
}

var debugProp bool

func weighted(rng *rand.Rand, weights []int) int {
	total := 0
	for _, w := range weights {
		total += w
	}
	x := rng.IntN(total)
	for i, w := range weights {
		if x < w {
			return i
		}
		x -= w
	}
	return len(weights) - 1
}
