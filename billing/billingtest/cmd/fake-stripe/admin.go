package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
)

// state is what GET /state returns.
type state struct {
	Now      time.Time             `json:"now"` // on the fake's clock
	Payments []billingtest.Payment `json:"payments"`
	Invoices []billingtest.Invoice `json:"invoices"`
	// Movements are the refunds, credit notes, transfers and payouts.
	Movements []billingtest.Movement `json:"movements"`
	Stats     billingtest.Stats      `json:"stats"`
	Log       []billingtest.Entry    `json:"log,omitempty"` // only with ?log=1
}

// meterTotal is what GET /meter_total returns.
type meterTotal struct {
	Total  float64 `json:"total"`  // Server.MeterTotal
	Events int     `json:"events"` // Server.MeterEvents
}

// control is the body of POST /control. Absent fields leave the setting as
// it is.
type control struct {
	Seed      *int64                            `json:"seed,omitempty"`
	Rates     map[billingtest.FaultKind]float64 `json:"rates,omitempty"` // replaces all rates; {} clears them
	RateLimit *float64                          `json:"rate_limit,omitempty"`
	RateBurst int                               `json:"rate_burst,omitempty"`
	Declines  map[string]string                 `json:"declines,omitempty"`  // customer → decline_code; "" honours the customer again
	Advance   string                            `json:"advance,omitempty"`   // a time.ParseDuration string
	Aggregate bool                              `json:"aggregate,omitempty"` // process every meter event now
}

// admin serves the fake's ledger and settings as JSON, for processes that
// drive a fake they did not start. It needs no API key: keep it on
// loopback.
type admin struct {
	srv   *billingtest.Server
	mu    sync.Mutex // guards seed and rates, the fault settings in force
	seed  int64
	rates map[billingtest.FaultKind]float64
}

func (a *admin) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	switch {
	case r.Method == http.MethodGet && r.URL.Path == "/state":
		st := state{Now: a.srv.Now(), Payments: a.srv.Payments(), Invoices: a.srv.Invoices(""), Movements: a.srv.Movements(""),
			Stats: a.srv.Stats()}
		if r.URL.Query().Get("log") == "1" {
			st.Log = a.srv.Log()
		}
		json.NewEncoder(w).Encode(st)
	case r.Method == http.MethodGet && r.URL.Path == "/meter_total":
		q := r.URL.Query()
		var bounds [2]time.Time
		for i, p := range []string{"start", "end"} {
			n, err := strconv.ParseInt(q.Get(p), 10, 64)
			if err != nil {
				adminError(w, fmt.Errorf("%s %q: want unix seconds", p, q.Get(p)))
				return
			}
			bounds[i] = time.Unix(n, 0)
		}
		ev, cust := q.Get("event_name"), q.Get("customer")
		json.NewEncoder(w).Encode(meterTotal{a.srv.MeterTotal(ev, cust, bounds[0], bounds[1]), a.srv.MeterEvents(ev, cust)})
	case r.Method == http.MethodPost && r.URL.Path == "/control":
		var c control
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 1<<20))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&c); err != nil {
			adminError(w, fmt.Errorf("decode control body: %w", err))
			return
		}
		if err := a.apply(c); err != nil {
			adminError(w, err)
			return
		}
		w.Write([]byte(`{"ok":true}` + "\n"))
	default:
		w.WriteHeader(http.StatusNotFound)
		fmt.Fprintf(w, `{"error":%q}`+"\n", "unknown endpoint; use GET /state[?log=1], GET /meter_total?event_name=&customer=&start=&end= or POST /control")
	}
}

// apply checks all of c before changing anything.
func (a *admin) apply(c control) error {
	var adv time.Duration
	if c.Advance != "" {
		d, err := time.ParseDuration(c.Advance)
		if err != nil || d < 0 {
			return fmt.Errorf("advance %q: want a non-negative Go duration such as \"24h1s\"", c.Advance)
		}
		adv = d
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if c.Rates != nil || c.Seed != nil {
		seed, rates := a.seed, a.rates
		if c.Seed != nil {
			seed = *c.Seed
		}
		if c.Rates != nil {
			rates = c.Rates
		}
		random, err := billingtest.RandomFaults(seed, rates)
		if err != nil {
			return err
		}
		a.srv.SetScript(random)
		a.seed, a.rates = seed, rates
	}
	if c.RateLimit != nil {
		if err := a.srv.SetRateLimit(*c.RateLimit, c.RateBurst); err != nil {
			return err
		}
	}
	for cust, code := range c.Declines {
		if code == "" {
			a.srv.Honor(cust)
		} else {
			a.srv.Decline(cust, code)
		}
	}
	a.srv.Advance(adv)
	if c.Aggregate {
		a.srv.AggregateNow()
	}
	return nil
}

func adminError(w http.ResponseWriter, err error) {
	w.WriteHeader(http.StatusBadRequest)
	fmt.Fprintf(w, `{"error":%q}`+"\n", err.Error())
}
