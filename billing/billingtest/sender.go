package billingtest

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"math/rand/v2"
	"net/http"
	"strconv"
	"sync"
	"time"
)

// Defaults for [SenderConfig] fields left zero.
const (
	defaultSenderAttempts = 8
	defaultSenderRetry    = 5 * time.Millisecond
	defaultSenderWorkers  = 4
)

// SenderConfig configures a [Sender].
type SenderConfig struct {
	// URL is the webhook endpoint. Required.
	URL string
	// Secret is the endpoint's signing secret ("whsec_…"). Required.
	Secret string
	// Seed makes duplicates, order and delays repeatable.
	Seed int64
	// Duplicate is the probability that an event is delivered twice
	// (Stripe delivers at least once), from 0 to 1.
	Duplicate float64
	// Reorder delivers each batch in a shuffled order instead of the order
	// the events happened in.
	Reorder bool
	// MaxDelay delays each delivery by a random time up to MaxDelay.
	MaxDelay time.Duration
	// Attempts is how many times one delivery is tried while the endpoint
	// answers anything but 2xx (or does not answer), with Retry, doubled
	// each time, between tries. Defaults to defaultSenderAttempts and
	// defaultSenderRetry.
	Attempts int
	Retry    time.Duration
	// Workers is how many deliveries run at once. Defaults to 4.
	Workers int
	// Client sends the deliveries. Defaults to a client with a 10 s timeout.
	Client *http.Client
}

// Sender delivers a [Server]'s events to a webhook endpoint the way Stripe
// does: each body signed in a Stripe-Signature header (t=…,v1=HMAC-SHA256
// of "t.body" with the secret, t the time of the delivery), at least once,
// in no particular order, retried while the endpoint does not answer 2xx.
type Sender struct {
	cfg SenderConfig
	mu  sync.Mutex
	rnd *rand.Rand
}

// SendReport counts what a [Sender.Send] did.
type SendReport struct {
	Events      int      // events given
	Deliveries  int      // deliveries made, duplicates included
	Duplicates  int      // extra deliveries of the same event
	Attempts    int      // HTTP requests, retries included
	Retries     int      // requests answered with something else than 2xx, or not answered
	Statuses    []int    // status of every answered request, in no order
	Undelivered []string // ids of events never answered 2xx after every attempt
}

// NewSender checks cfg and returns a Sender.
func NewSender(cfg SenderConfig) (*Sender, error) {
	switch {
	case cfg.URL == "":
		return nil, errors.New("billingtest: SenderConfig.URL is empty")
	case cfg.Secret == "":
		return nil, errors.New("billingtest: SenderConfig.Secret is empty")
	case cfg.Duplicate < 0 || cfg.Duplicate > 1:
		return nil, fmt.Errorf("billingtest: SenderConfig.Duplicate %v; want a probability from 0 to 1", cfg.Duplicate)
	case cfg.MaxDelay < 0 || cfg.Retry < 0 || cfg.Attempts < 0 || cfg.Workers < 0:
		return nil, errors.New("billingtest: SenderConfig's durations and counts must not be negative")
	}
	if cfg.Attempts == 0 {
		cfg.Attempts = defaultSenderAttempts
	}
	if cfg.Retry == 0 {
		cfg.Retry = defaultSenderRetry
	}
	if cfg.Workers == 0 {
		cfg.Workers = defaultSenderWorkers
	}
	if cfg.Client == nil {
		cfg.Client = &http.Client{Timeout: 10 * time.Second}
	}
	h := fnv.New64a()
	fmt.Fprint(h, cfg.Seed)
	return &Sender{cfg: cfg, rnd: rand.New(rand.NewPCG(uint64(cfg.Seed), h.Sum64()))}, nil
}

// Sign returns the Stripe-Signature header for body signed with secret at
// time t, as Stripe computes it.
func Sign(body []byte, secret string, t time.Time) string {
	ts := strconv.FormatInt(t.Unix(), 10)
	mac := hmac.New(sha256.New, []byte(secret))
	mac.Write([]byte(ts + "."))
	mac.Write(body)
	return "t=" + ts + ",v1=" + hex.EncodeToString(mac.Sum(nil))
}

type delivery struct {
	ev    Event
	delay time.Duration
}

// Send delivers events and returns when every delivery is answered 2xx or
// has used its attempts, or ctx is done.
func (s *Sender) Send(ctx context.Context, events []Event) SendReport {
	rep := SendReport{Events: len(events)}
	s.mu.Lock()
	var plan []delivery
	for _, e := range events {
		n := 1
		if s.rnd.Float64() < s.cfg.Duplicate {
			n = 2
			rep.Duplicates++
		}
		for range n {
			var d time.Duration
			if s.cfg.MaxDelay > 0 {
				d = time.Duration(s.rnd.Int64N(int64(s.cfg.MaxDelay)))
			}
			plan = append(plan, delivery{e, d})
		}
	}
	if s.cfg.Reorder {
		s.rnd.Shuffle(len(plan), func(i, j int) { plan[i], plan[j] = plan[j], plan[i] })
	}
	s.mu.Unlock()
	rep.Deliveries = len(plan)

	work := make(chan delivery)
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range s.cfg.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for d := range work {
				ok, attempts, statuses := s.deliver(ctx, d)
				mu.Lock()
				rep.Attempts += attempts
				rep.Statuses = append(rep.Statuses, statuses...)
				if ok {
					rep.Retries += attempts - 1
				} else {
					rep.Retries += attempts
					rep.Undelivered = append(rep.Undelivered, d.ev.ID)
				}
				mu.Unlock()
			}
		}()
	}
	for _, d := range plan {
		select {
		case work <- d:
		case <-ctx.Done():
		}
	}
	close(work)
	wg.Wait()
	return rep
}

// deliver makes one delivery, retrying on anything but 2xx.
func (s *Sender) deliver(ctx context.Context, d delivery) (ok bool, attempts int, statuses []int) {
	if !sleep(ctx, d.delay) {
		return false, 0, nil
	}
	wait := s.cfg.Retry
	for attempts < s.cfg.Attempts && ctx.Err() == nil {
		attempts++
		status, err := s.post(ctx, d.ev.Body)
		if err == nil {
			statuses = append(statuses, status)
			if status >= 200 && status < 300 {
				return true, attempts, statuses
			}
		}
		if !sleep(ctx, wait) {
			break
		}
		wait *= 2
	}
	return false, attempts, statuses
}

func (s *Sender) post(ctx context.Context, body []byte) (int, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.cfg.URL, bytes.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json; charset=utf-8")
	req.Header.Set("User-Agent", "Stripe/1.0 (+https://stripe.com/docs/webhooks)")
	req.Header.Set("Stripe-Signature", Sign(body, s.cfg.Secret, time.Now()))
	resp, err := s.cfg.Client.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	return resp.StatusCode, nil
}

func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
