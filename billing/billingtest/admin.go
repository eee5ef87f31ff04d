package billingtest

import (
	"encoding/json"
	"fmt"
	"net/http"
	"time"
)

// adminPrefix is the path of the test-only control endpoints. They need no
// API key: the server is a test double on loopback, never a real service.
const adminPrefix = "/_billingtest/"

// State is what GET /_billingtest/state returns.
type State struct {
	Now      time.Time `json:"now"`
	Payments []Payment `json:"payments"`
	Stats    Stats     `json:"stats"`
	Log      []Entry   `json:"log,omitempty"` // only with ?log=1
}

// Control is the body of POST /_billingtest/control. Absent fields leave the
// setting as it is.
type Control struct {
	Seed      *int64                `json:"seed,omitempty"`
	Rates     map[FaultKind]float64 `json:"rates,omitempty"` // replaces all rates; {} clears them
	RateLimit *float64              `json:"rate_limit,omitempty"`
	RateBurst int                   `json:"rate_burst,omitempty"`
	Declines  map[string]string     `json:"declines,omitempty"` // customer → decline_code; "" honours the customer again
	Advance   string                `json:"advance,omitempty"`  // a time.ParseDuration string
}

func (s *Server) serveAdmin(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == adminPrefix+"state":
		st := State{Now: s.Now(), Payments: s.Payments(), Stats: s.Stats()}
		if r.URL.Query().Get("log") == "1" {
			st.Log = s.Log()
		}
		json.NewEncoder(w).Encode(st)
	case r.Method == http.MethodPost && r.URL.Path == adminPrefix+"control":
		var c Control
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			adminError(w, fmt.Errorf("billingtest: decode control body: %w", err))
			return
		}
		if err := s.apply(c); err != nil {
			adminError(w, err)
			return
		}
		w.Write([]byte(`{"ok":true}` + "\n"))
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":%q}`+"\n", "unknown admin endpoint; use GET "+adminPrefix+"state[?log=1] or POST "+adminPrefix+"control")
	}
}

// apply validates all of c before changing anything.
func (s *Server) apply(c Control) error {
	var adv time.Duration
	if c.Advance != "" {
		d, err := time.ParseDuration(c.Advance)
		if err != nil || d < 0 {
			return fmt.Errorf("billingtest: advance %q: want a non-negative Go duration such as \"24h1s\"", c.Advance)
		}
		adv = d
	}
	if c.Rates != nil || c.Seed != nil {
		s.mu.Lock()
		seed, rates := int64(s.rates.seed), c.Rates
		if rates == nil {
			rates = make(map[FaultKind]float64)
			for i, k := range s.rates.kinds {
				prev := 0.0
				if i > 0 {
					prev = s.rates.cum[i-1]
				}
				rates[k] = s.rates.cum[i] - prev
			}
		}
		s.mu.Unlock()
		if c.Seed != nil {
			seed = *c.Seed
		}
		if _, err := newRateTable(seed, rates); err != nil {
			return err
		}
		defer s.SetRates(seed, rates)
	}
	if c.RateLimit != nil {
		if _, err := newBucket(*c.RateLimit, c.RateBurst); err != nil {
			return err
		}
		defer s.SetRateLimit(*c.RateLimit, c.RateBurst)
	}
	for cust, code := range c.Declines {
		if code == "" {
			s.Honor(cust)
		} else {
			s.Decline(cust, code)
		}
	}
	s.Advance(adv)
	return nil
}

func adminError(w http.ResponseWriter, err error) {
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, `{"error":%q}`+"\n", err.Error())
}
