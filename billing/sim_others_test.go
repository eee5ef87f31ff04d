package billing_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// The scenario's other writers: what people and other programs do to
// billonce's objects at Stripe and to its claim table while the runners
// bill, and a configuration that changes while a request is on its way.
// Infrastructure faults (crashes, lost answers, 5xx, clock jumps) never
// act on billonce's objects; these do. Each is a fault type of its own,
// drawn from the seed by a random stream apart from the scenario's, so
// that a seed plays the same scenario whichever fault types are on:
//
//   - rotate-in-flight (every simulation): a runner's write is held at
//     Stripe before Stripe executes it; the runner dies, the secret key is
//     rotated, the runner starts again with the new key and takes its step
//     again; the held request lands just before the new runner's first
//     write.
//   - dashboard-item (invoices): a person adds an invoice item to one of
//     billonce's drafts, while billonce adds its lines or between rounds.
//   - dashboard-pay, dashboard-void (invoices): a person marks an open
//     invoice paid outside Stripe, or voids it.
//   - dashboard-refund (charges): a person refunds a payment.
//   - foreign-charge (charges): a support script's own charge, made with
//     the secret key, copies a claim's metadata and is declined; its event
//     reaches billonce's webhook endpoint.
//   - foreign-invoice (invoices): a person duplicates one of billonce's
//     invoices, metadata and all, finalizes the copy and voids it.
//   - foreign-meter-event (usage): other code with the secret key sends a
//     meter event with the identifier of a report billonce delivered more
//     than a day ago; Stripe takes it and rejects it as it aggregates, and
//     its error report reaches billonce's webhook endpoint.
//   - intent-completed (charges): a customer completes on-session a
//     PaymentIntent that billonce's off-session confirmation saw declined,
//     before, during or after a re-bill of its period (in seeds whose
//     events reach a webhook endpoint: the service learns of it by its
//     event); one a re-bill canceled is refused.
//   - delete-failed-row (charges): a person deletes a failed claim: one
//     whose re-bill is pending if there is one, else, half the time, one
//     that a dunning job has just re-billed, dying before Stripe's answer.
//   - restore-rows (usage): the claim rows of window totals are restored
//     from a copy taken while a total was being sent, once the settle
//     phase has reported every total; a day later the application's queue
//     delivers again the report of each window's first total (ReportUsage
//     may be called as often as one likes), for the windows whose first
//     total the copy holds a row of. Only those rows and windows: the
//     simulation moves the database's and Stripe's clocks, not billonce's
//     own, so for increments the summary check billonce makes before
//     sending a window older than a day (see ReportUsage) cannot run here.
//   - old-window (usage): some customers also report a window that ended
//     34 days ago, while Stripe still takes it, and a backfill job reports
//     one and dies, after its claim or after Stripe took the event; a
//     report of it still pending a day later can no longer be delivered.
//   - overlap-window (usage): a reporter whose windows' grid moved by half
//     an hour reports again a window billonce delivered.
//
// Charge scenarios deliver Stripe's events to a webhook endpoint in most
// seeds once a fault type that acts through events is on (foreign-charge,
// intent-completed, dashboard-refund); foreign-charge and intent-completed
// play only in those seeds.
//
// BILLONCE_SIM_FAULTS chooses the fault types: unset or "all" for every
// one, "none" for none (the infrastructure faults alone), or a
// comma-separated list of names, each of which may be "-name" to take it
// out of all of them.

// simFault names one fault type of the other writers.
type simFault string

const (
	simRotateInFlight    simFault = "rotate-in-flight"
	simDashboardItem     simFault = "dashboard-item"
	simDashboardPay      simFault = "dashboard-pay"
	simDashboardVoid     simFault = "dashboard-void"
	simDashboardRefund   simFault = "dashboard-refund"
	simForeignCharge     simFault = "foreign-charge"
	simForeignInvoice    simFault = "foreign-invoice"
	simForeignMeterEvent simFault = "foreign-meter-event"
	simIntentCompleted   simFault = "intent-completed"
	simDeleteFailedRow   simFault = "delete-failed-row"
	simRestoreRows       simFault = "restore-rows"
	simOldWindow         simFault = "old-window"
	simOverlapWindow     simFault = "overlap-window"
)

// simFaultModes says which simulations play each fault type.
var simFaultModes = map[simFault][]simMode{
	simRotateInFlight:    {simCharges, simInvoices, simUsage, simRefunds, simMoneyOut},
	simDashboardItem:     {simInvoices},
	simDashboardPay:      {simInvoices},
	simDashboardVoid:     {simInvoices},
	simDashboardRefund:   {simCharges},
	simForeignCharge:     {simCharges},
	simForeignInvoice:    {simInvoices},
	simForeignMeterEvent: {simUsage},
	simIntentCompleted:   {simCharges},
	simDeleteFailedRow:   {simCharges},
	simRestoreRows:       {simUsage},
	simOldWindow:         {simUsage},
	simOverlapWindow:     {simUsage},
}

// simFaultsVar is the environment variable that chooses the fault types.
const simFaultsVar = "BILLONCE_SIM_FAULTS"

// simFaultSet reads BILLONCE_SIM_FAULTS.
func simFaultSet(t *testing.T) map[simFault]bool {
	t.Helper()
	v := strings.TrimSpace(os.Getenv(simFaultsVar))
	on := make(map[simFault]bool)
	all := func() {
		for f := range simFaultModes {
			on[f] = true
		}
	}
	switch v {
	case "", "all":
		all()
		return on
	case "none":
		return on
	}
	parts := strings.Split(v, ",")
	if slices.ContainsFunc(parts, func(p string) bool { return strings.HasPrefix(strings.TrimSpace(p), "-") }) {
		all()
	}
	for _, p := range parts {
		p = strings.TrimSpace(p)
		name, off := strings.CutPrefix(p, "-")
		f := simFault(name)
		if _, ok := simFaultModes[f]; !ok {
			var names []string
			for f := range simFaultModes {
				names = append(names, string(f))
			}
			slices.Sort(names)
			t.Fatalf("%s=%q: no fault type %q; use all, none, or names among %s (each may be -name)", simFaultsVar, v, name, strings.Join(names, ", "))
		}
		on[f] = !off
	}
	return on
}

// simOthers is what the other writers do in one scenario.
type simOthers struct {
	on     map[simFault]bool // the fault types played in this simulation
	hooks  bool              // the events reach a webhook endpoint (always, but for charges)
	rounds []simOtherRound   // by round
	old    []string          // usage: customers that also report a window from 34 days ago
	totals []string          // usage: customers that also report window totals
	// usage: the copy of the totals' rows is taken from round snapshotAt
	// on, at the first total claimed that is not a window's last, and
	// restored once the settle phase has reported every total; -1 for
	// none.
	snapshotAt int
}

// simOtherRound is what the other writers do in one round.
type simOtherRound struct {
	hold     string // rotate-in-flight: the step (simStep) whose write is held, or ""
	dashItem bool   // invoices: a person adds an item to the first draft billonce adds a line to
	acts     []simAct
}

// simAct is one act of another writer at the end of a round, on a target
// chosen by pick among those the state offers then.
type simAct struct {
	fault simFault
	pick  uint64
}

// simActChances are the acts that may end a round, by simulation, with
// their chance in percent.
var simActChances = map[simMode][]struct {
	fault simFault
	pct   int
}{
	simCharges: {{simForeignCharge, 20}, {simIntentCompleted, 30}, {simDashboardRefund, 10}, {simDeleteFailedRow, 25}},
	simInvoices: {{simDashboardItem, 10}, {simDashboardPay, 12}, {simDashboardVoid, 8},
		{simForeignInvoice, 6}},
	simUsage: {{simForeignMeterEvent, 35}, {simOverlapWindow, 10}, {simOldWindow, 30}},
}

// newSimOthers draws the other writers of plan's scenario in mode, from a
// random stream of the seed's own; on says which fault types are played.
// Every draw is made whatever is on, so that turning a fault type off
// changes no other.
func newSimOthers(plan *simPlan, mode simMode, on map[simFault]bool) *simOthers {
	rng := rand.New(rand.NewPCG(plan.seed, 0x07e2_5a1e_f0a1))
	o := &simOthers{on: make(map[simFault]bool), snapshotAt: -1}
	for f, ok := range on {
		if ok && slices.Contains(simFaultModes[f], mode) {
			o.on[f] = true
		}
	}
	o.hooks = mode != simCharges
	if rng.IntN(100) < 75 && (o.on[simForeignCharge] || o.on[simDashboardRefund] || o.on[simIntentCompleted]) {
		o.hooks = true
	}
	steps := []string{"payment"} // a charge or a payment intent, as the runner's API says
	switch mode {
	case simInvoices:
		// Lines twice as often: an invoice has up to three.
		steps = []string{"invoice draft", "invoice line", "invoice line", "invoice finalize", "invoice pay"}
	case simUsage:
		steps = []string{"meter event"}
	case simRefunds:
		steps = []string{"payment", "refund"}
	case simMoneyOut:
		steps = []string{"payment", "transfer", "payout"}
	}
	for _, rd := range plan.rounds {
		var or simOtherRound
		hold, step := rng.IntN(100) < 40, steps[rng.IntN(len(steps))]
		if o.on[simRotateInFlight] && hold && len(rd.ops) == 1 && !rd.faults.jumps() && rd.ops[0].crash == simCrashNone {
			// One step alone in its round, with no jump of the clock: the
			// lease of the runner that dies runs out while its request is
			// held, and nothing else is sent meanwhile.
			or.hold = step
		}
		or.dashItem = rng.IntN(100) < 12 && o.on[simDashboardItem]
		for _, c := range simActChances[mode] {
			draw, pick := rng.IntN(100), rng.Uint64()
			// A support script's event, or a PaymentIntent completed on a
			// hosted page, is learnt by webhook.
			needsHooks := c.fault == simForeignCharge || c.fault == simIntentCompleted
			if o.on[c.fault] && draw < c.pct && (o.hooks || !needsHooks) {
				or.acts = append(or.acts, simAct{fault: c.fault, pick: pick})
			}
		}
		o.rounds = append(o.rounds, or)
	}
	for _, c := range plan.customers {
		old, totals := rng.IntN(100) < 35, rng.IntN(100) < 60
		if old && o.on[simOldWindow] {
			o.old = append(o.old, c)
		}
		// Rejected events fail a customer's reports, and a total of a
		// window is not reported again after that: totals are for
		// customers whose events Stripe always counts.
		if totals && o.on[simRestoreRows] && !slices.Contains(plan.declined, c) {
			o.totals = append(o.totals, c)
		}
	}
	snap := 1 + rng.IntN(max(1, min(8, len(plan.rounds)-1)))
	if o.on[simRestoreRows] && len(o.totals) > 0 {
		o.snapshotAt = snap
	}
	return o
}

func (or simOtherRound) String() string {
	var parts []string
	if or.hold != "" {
		parts = append(parts, "the "+or.hold+" write of the step is held at Stripe, across a key rotation")
	}
	if or.dashItem {
		parts = append(parts, "a person adds an item to a draft billonce is adding lines to")
	}
	for _, a := range or.acts {
		parts = append(parts, string(a.fault)+" after the steps")
	}
	return strings.Join(parts, "; ")
}

// simOtherState is what the other writers did, for the checker: the
// objects and rows that are theirs, and who touched which customer and
// period.
type simOtherState struct {
	mu       sync.Mutex
	seq      int
	foreign  map[string]bool // payments and invoices made by other writers
	items    map[string]bool // invoice items a person added to billonce's drafts
	voided   map[string]bool // invoices a person voided
	deleted  map[string]bool // claim keys a person deleted
	shifted  map[string]bool // usage claim periods of reports on a moved grid
	restored map[[2]string]bool
	// inCopy: the (customer, period) of each row the restore brought back.
	inCopy  map[[2]string]bool
	touched map[[2]string][]string // (customer, claim period) → what was done to it
	// usage: the window totals the application holds a receipt for, by
	// (customer, period): its own record, which no restore of the claim
	// table reaches.
	totalsDone   map[[2]string]int
	held         map[[2]string]bool // reported for a person (ErrNeedsReconciliation) while settling
	snapArmed    bool               // the copy of the totals' rows is due
	snapshot     bool               // ... is taken
	restoredOnce bool               // ... and restored
}

func (o *simOtherState) init() {
	o.foreign, o.items, o.voided, o.deleted, o.shifted = map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}, map[string]bool{}
	o.restored, o.touched, o.totalsDone, o.held = map[[2]string]bool{}, map[[2]string][]string{}, map[[2]string]int{}, map[[2]string]bool{}
	o.inCopy = map[[2]string]bool{}
}

// touch records that another writer did what to customer's period.
func (w *simWorld) touch(customer, period, what string) {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	cp := [2]string{customer, period}
	if !slices.Contains(w.ow.touched[cp], what) {
		w.ow.touched[cp] = append(w.ow.touched[cp], what)
	}
}

// cause says what other writers did to customer's period, for a
// violation there.
// An empty period stands for every period of the customer.
func (w *simWorld) cause(customer, period string) string {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	if period != "" {
		return strings.Join(w.ow.touched[[2]string{customer, period}], "; ")
	}
	var all []string
	for cp, what := range w.ow.touched {
		if cp[0] == customer {
			all = append(all, what...)
		}
	}
	slices.Sort(all)
	return strings.Join(slices.Compact(all), "; ")
}

func (w *simWorld) is(set map[string]bool, id string) bool {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	return set[id]
}

func (w *simWorld) mark(set map[string]bool, id string) {
	w.ow.mu.Lock()
	set[id] = true
	w.ow.mu.Unlock()
}

// The other writers' requests: a person's dashboard session, or other code
// with one of billonce's secret keys. Their idempotency keys carry a
// prefix of their own, which the round's faults leave alone and the
// figures do not count.

const (
	simDashboardSecret = "sk_test_simulationDashboardDDDDDDDDD0004"
	simOtherKeyPrefix  = "simother_"
	simGoneCustomer    = "cus_deleted_long_ago" // a customer whose meter events Stripe rejects
)

func simOtherRequest(key string) bool { return strings.HasPrefix(key, simOtherKeyPrefix) }

// otherKey is the next idempotency key of an other writer.
func (w *simWorld) otherKey() string {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	w.ow.seq++
	return fmt.Sprintf("%s%d", simOtherKeyPrefix, w.ow.seq)
}

// otherPost sends one POST of an other writer with key and returns the
// answer's status and JSON.
func (w *simWorld) otherPost(ctx context.Context, secret, path, key string, form url.Values) (int, map[string]any, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, w.srv.URL+path, strings.NewReader(form.Encode()))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Authorization", "Bearer "+secret)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", key)
	resp, err := w.base.RoundTrip(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		return resp.StatusCode, nil, fmt.Errorf("%s: HTTP %d: %v", path, resp.StatusCode, err)
	}
	return resp.StatusCode, body, nil
}

func jsonString(m map[string]any, path ...string) string {
	var v any = m
	for _, p := range path {
		mm, ok := v.(map[string]any)
		if !ok {
			return ""
		}
		v = mm[p]
	}
	s, _ := v.(string)
	return s
}

func simMetaForm(meta map[string]string) url.Values {
	form := url.Values{}
	for k, v := range meta {
		form.Set("metadata["+k+"]", v)
	}
	return form
}

// The key rotation with a request held at Stripe.

// simHold is a write held at Stripe before Stripe executes it.
type simHold struct {
	step string   // the step whose write is held
	proc *simProc // the runner that sends it

	mu      sync.Mutex
	fired   bool      // the write was sent
	caught  bool      // the fake holds it
	key     string    // its idempotency key
	path    string    // its path
	slot    [2]string // the customer and period it bills
	by      *simProc  // the runner whose first write lands it
	status  string    // how it landed
	arrived chan struct{}
	release chan struct{}
	done    chan struct{}
	once    sync.Once
}

// sent reports whether the held write was sent.
func (h *simHold) sent() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.fired
}

// armHold holds the first write of step that p sends in this round.
func (w *simWorld) armHold(p *simProc, step string) {
	w.mu.Lock()
	w.hold = &simHold{step: step, proc: p, arrived: make(chan struct{}), release: make(chan struct{}), done: make(chan struct{})}
	w.mu.Unlock()
}

func (w *simWorld) currentHold() *simHold {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.hold
}

// holdFor returns the armed hold if p's write of step is the one it
// holds, marking it fired.
func (w *simWorld) holdFor(p *simProc, step string) *simHold {
	h := w.currentHold()
	if h == nil || h.proc != p || (h.step != step && !(h.step == "payment" && (step == "charge" || step == "payment_intent"))) {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fired {
		return nil
	}
	h.fired = true
	return h
}

// caughtAt reports whether the fake's request r is the held write, the
// first time it arrives: the fault script then holds it until released.
func (w *simWorld) caughtAt(r billingtest.Request) *simHold {
	h := w.currentHold()
	if h == nil || r.Method != http.MethodPost {
		return nil
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.fired || h.caught || h.key == "" || r.IdempotencyKey != h.key || r.Path != h.path {
		return nil
	}
	h.caught = true
	return h
}

// landBefore releases the held write before p's first write, and waits
// until Stripe has executed it.
func (w *simWorld) landBefore(p *simProc) {
	h := w.currentHold()
	if h == nil {
		return
	}
	h.mu.Lock()
	mine := h.by == p
	h.mu.Unlock()
	if mine {
		w.land(h, "just before "+p.name+"'s first write")
	}
}

// land releases the held write and waits until Stripe has answered it.
func (w *simWorld) land(h *simHold, when string) {
	h.once.Do(func() {
		close(h.release)
		select {
		case <-h.done:
		case <-time.After(30 * time.Second):
			w.harnessf("the held request %s did not land within 30s", w.keyLabel(h.key))
			return
		}
		h.mu.Lock()
		status := h.status
		h.mu.Unlock()
		w.logf("  ! the held %s request lands at Stripe %s: %s", h.step, when, status)
	})
}

// hold sends req, which the fake holds, and kills the runner once the
// request has reached Stripe, before Stripe executed it.
func (t *simTransport) hold(req *http.Request, h *simHold) (*http.Response, error) {
	w := t.p.w
	body, err := io.ReadAll(req.Body)
	req.Body.Close()
	if err != nil {
		return nil, err
	}
	form, _ := url.ParseQuery(string(body))
	req = req.Clone(context.WithoutCancel(req.Context()))
	req.Body = io.NopCloser(bytes.NewReader(body))
	h.mu.Lock()
	h.key, h.path = req.Header.Get("Idempotency-Key"), req.URL.Path
	h.mu.Unlock()
	slot := w.slotOf(req.URL.Path, form)
	h.mu.Lock()
	h.slot = slot
	h.mu.Unlock()
	w.inflight.Add(1)
	go func() {
		defer w.inflight.Add(-1)
		defer close(h.done)
		status := "no answer"
		resp, err := t.base.RoundTrip(req)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			status = resp.Status
			if resp.StatusCode >= 300 {
				status += " " + strings.TrimSpace(string(b))
			}
		}
		h.mu.Lock()
		h.status = status
		h.mu.Unlock()
	}()
	select {
	case <-h.arrived:
	case <-h.done:
	}
	w.count("faults: a request held at Stripe across a key rotation", 1)
	t.p.die(fmt.Sprintf("while its %s request %s was on its way: Stripe holds it, unexecuted", h.step, w.keyLabel(h.key)))
	return nil, errSimCrashed
}

// slotOf says which customer and period a write bills.
func (w *simWorld) slotOf(path string, form url.Values) [2]string {
	if c, p := form.Get("metadata["+billing.MetaCustomer+"]"), form.Get("metadata["+billing.MetaPeriod+"]"); c != "" && p != "" {
		return [2]string{c, p}
	}
	if id := form.Get("identifier"); id != "" {
		var c, p string
		if w.pool.QueryRow(context.Background(), "SELECT customer, period FROM "+pgx.Identifier{w.table}.Sanitize()+" WHERE key = $1", id).Scan(&c, &p) == nil {
			return [2]string{c, p}
		}
	}
	if rest, ok := strings.CutPrefix(path, "/v1/invoices/"); ok {
		id, _, _ := strings.Cut(rest, "/")
		for _, in := range w.srv.Invoices("") {
			if in.ID == id {
				return [2]string{in.Customer, in.Metadata[billing.MetaPeriod]}
			}
		}
	}
	return [2]string{}
}

// rotateAfterHold is what follows a runner's death with its request held:
// its lease runs out, the secret key is rotated, the runner starts again
// with it and takes op again, and the held request lands before the new
// runner's first write (or after its step, if it writes nothing).
func (w *simWorld) rotateAfterHold(ctx context.Context, op simOp, h *simHold) string {
	r := w.runners[op.runner]
	cfg := r.cfg
	cfg.Secret = (cfg.Secret + 1) % len(simSecrets)
	// The dead runner's lease runs out: a few seconds, while its request
	// is held.
	w.move(ctx, r.cfg.Lease+2*time.Second, "while the request is held, until the dead runner's lease is over")
	if err := w.boot(r, cfg); err != nil {
		w.harnessf("starting %s: %v", r.name, err)
		w.land(h, "after a failed start")
		return "not started"
	}
	w.logf("  deploy while the request is held: secret key rotated #%d → #%d; start %s.%d: %s", (cfg.Secret+len(simSecrets)-1)%len(simSecrets), cfg.Secret, r.name, r.life, cfg)
	h.mu.Lock()
	h.by = r.proc
	slot := h.slot
	h.mu.Unlock()
	if slot[0] != "" {
		w.touch(slot[0], slot[1], "its request held at Stripe across a key rotation")
	}
	op.crash, op.crashAt, op.crashStep = simCrashNone, 0, ""
	out := w.runOp(ctx, op)
	w.land(h, "after "+r.name+"'s step, which wrote nothing")
	return out
}

// The acts at the end of a round.

// actOthers plays the round's acts of other writers.
func (w *simWorld) actOthers(ctx context.Context, or simOtherRound) {
	for _, a := range or.acts {
		var out string
		var err error
		switch a.fault {
		case simForeignCharge:
			out, err = w.foreignCharge(ctx, a.pick)
		case simIntentCompleted:
			out, err = w.completeIntent(a.pick)
		case simDashboardRefund:
			out, err = w.refund(a.pick)
		case simDeleteFailedRow:
			out, err = w.deleteFailedRow(ctx, a.pick)
		case simDashboardItem:
			out, err = w.dashboardItemOn(ctx, a.pick)
		case simDashboardPay:
			out, err = w.dashboardInvoice(ctx, a.pick, "pay")
		case simDashboardVoid:
			out, err = w.dashboardInvoice(ctx, a.pick, "void")
		case simForeignInvoice:
			out, err = w.foreignInvoice(ctx, a.pick)
		case simForeignMeterEvent:
			out, err = w.foreignMeterEvent(ctx, a.pick)
		case simOverlapWindow:
			out, err = w.overlapWindow(ctx, a.pick)
		case simOldWindow:
			out, err = w.backfill(ctx, a.pick)
		}
		switch {
		case err != nil:
			w.harnessf("%s: %v", a.fault, err)
		case out != "":
			w.logf("  other writer, %s: %s", a.fault, out)
		}
	}
}

// otherClaims lists the claims for the other writers to choose from.
func (w *simWorld) otherClaims(ctx context.Context, keep func(simClaim) bool) ([]simClaim, error) {
	claims, err := simListClaims(ctx, w.pool, w.table)
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(claims, func(c simClaim) bool { return !keep(c) }), nil
}

func simPick[T any](items []T, pick uint64) T { return items[pick%uint64(len(items))] }

func simPaymentClaim(c simClaim) bool {
	return c.Endpoint == "charges" || c.Endpoint == "payment_intents"
}

// foreignCharge: a support script's charge of its own amount for a
// claim's customer and period, copying the claim's metadata (a pending
// claim's if there is one), made with the deployed secret key and
// declined.
func (w *simWorld) foreignCharge(ctx context.Context, pick uint64) (string, error) {
	all, err := w.otherClaims(ctx, simPaymentClaim)
	if err != nil || len(all) == 0 {
		return "", err
	}
	pending := slices.DeleteFunc(slices.Clone(all), func(c simClaim) bool { return c.State != string(claim.StatePending) })
	c := simPick(all, pick)
	if len(pending) > 0 {
		c = simPick(pending, pick)
	}
	form := simMetaForm(map[string]string{billing.MetaKey: c.Key, billing.MetaCustomer: c.Customer, billing.MetaPeriod: c.Period})
	form.Set("amount", "4242") // the script's own amount, not the claim's
	form.Set("currency", c.Currency)
	form.Set("customer", c.Customer)
	path := "/v1/charges"
	if c.Endpoint == "payment_intents" {
		path = "/v1/payment_intents"
		form.Set("payment_method", "pm_card_visa")
		form.Set("confirm", "true")
		form.Set("off_session", "true")
	}
	key := w.otherKey()
	w.srv.FailNext(billingtest.Match{IdempotencyKey: key}, billingtest.Fault{Kind: billingtest.FaultDecline, DeclineCode: "card_velocity_exceeded"})
	status, body, err := w.otherPost(ctx, simSecrets[w.runners[0].cfg.Secret], path, key, form)
	if err != nil {
		return "", err
	}
	id := jsonString(body, "error", "charge")
	if id == "" {
		id = jsonString(body, "error", "payment_intent", "id")
	}
	if id == "" {
		id = jsonString(body, "id")
	}
	w.mark(w.ow.foreign, id)
	w.count("faults: a support script's declined charge with a claim's metadata", 1)
	w.touch(c.Customer, c.Period, "a support script's declined charge carrying its claim's metadata")
	return fmt.Sprintf("a support script's charge %s for %s (claim %s), HTTP %d", id, w.keyLabel(c.Key), c.State, status), nil
}

// completeIntent: a customer completes on-session one of billonce's
// PaymentIntents that was declined off-session, whatever became of its
// period since: one a re-bill canceled first is refused.
func (w *simWorld) completeIntent(pick uint64) (string, error) {
	var can []billingtest.Payment
	for _, p := range w.srv.Payments() {
		if p.Object == "payment_intent" && (p.Status == "requires_payment_method" || p.Status == "canceled") && p.DeclineCode != "" &&
			p.Metadata[billing.MetaKey] != "" && !w.is(w.ow.foreign, p.ID) {
			can = append(can, p)
		}
	}
	if len(can) == 0 {
		return "", nil
	}
	p := simPick(can, pick)
	if err := w.srv.ConfirmIntent(p.ID); err != nil {
		if p.Status != "canceled" {
			return "", err
		}
		w.count("faults: a declined PaymentIntent's completion refused, canceled by a re-bill", 1)
		return fmt.Sprintf("%s tries to complete %s (%s, declined %s) on-session: refused, canceled", p.Customer, p.ID, w.keyLabel(simPayKey(p)), p.DeclineCode), nil
	}
	w.count("faults: a declined PaymentIntent completed on-session", 1)
	w.touch(p.Customer, p.Period, "its declined PaymentIntent completed on-session by the customer")
	return fmt.Sprintf("%s completes %s (%s, declined %s) on-session", p.Customer, p.ID, w.keyLabel(simPayKey(p)), p.DeclineCode), nil
}

// refund: a person refunds one of billonce's payments in the dashboard.
func (w *simWorld) refund(pick uint64) (string, error) {
	var can []billingtest.Payment
	for _, p := range w.srv.Payments() {
		if p.Paid && p.AmountRefunded == 0 && p.Metadata[billing.MetaKey] != "" && !w.is(w.ow.foreign, p.ID) {
			can = append(can, p)
		}
	}
	if len(can) == 0 {
		return "", nil
	}
	p := simPick(can, pick)
	if err := w.srv.Refund(p.ID, 0); err != nil {
		return "", err
	}
	w.count("faults: a payment refunded in the dashboard", 1)
	w.touch(p.Customer, p.Period, "refunded in the dashboard")
	return fmt.Sprintf("a person refunds %s (%s)", p.ID, w.keyLabel(simPayKey(p))), nil
}

// deleteFailedRow: a person deletes a failed claim, one whose period has a
// later attempt pending if there is one. The person checks the dashboard
// first: a claim whose key has a payment that moved money (a PaymentIntent
// completed since, whose event has not come yet) is not one to delete, and
// the declined PaymentIntent of one that is gets canceled before its claim
// is deleted (README: "What billonce does not protect against").
func (w *simWorld) deleteFailedRow(ctx context.Context, pick uint64) (string, error) {
	claims, err := w.otherClaims(ctx, simPaymentClaim)
	if err != nil {
		return "", err
	}
	paid := make(map[string]bool)
	for _, p := range w.srv.Payments() {
		if p.Paid {
			paid[simPayKey(p)] = true
		}
	}
	var failed, before []simClaim
	for _, c := range claims {
		if c.State != string(claim.StateFailed) || paid[c.Key] {
			continue
		}
		failed = append(failed, c)
		if slices.ContainsFunc(claims, func(o simClaim) bool {
			return o.Customer == c.Customer && o.Period == c.Period && o.Attempt > c.Attempt && o.State == string(claim.StatePending)
		}) {
			before = append(before, c)
		}
	}
	if len(failed) == 0 {
		return "", nil
	}
	c := simPick(failed, pick)
	dunning := ""
	switch {
	case len(before) > 0:
		c = simPick(before, pick)
	case pick>>32%2 == 0 && !slices.ContainsFunc(claims, func(o simClaim) bool {
		return o.Customer == c.Customer && o.Period == c.Period && o.Attempt > c.Attempt
	}):
		var err error
		if dunning, err = w.dunning(ctx, c); err != nil {
			return "", err
		}
	}
	// The person cancels the claim's declined PaymentIntent first, as the
	// README says: the claim is the only record of it, and its customer
	// could otherwise complete it after the period is billed again.
	canceled := ""
	if strings.HasPrefix(c.StripeID, "pi_") {
		status, _, err := w.otherPost(ctx, simSecrets[w.runners[0].cfg.Secret], "/v1/payment_intents/"+c.StripeID+"/cancel", w.otherKey(), url.Values{})
		if err != nil {
			return "", err
		}
		if status == http.StatusOK {
			canceled = ", after canceling its PaymentIntent " + c.StripeID
		}
	}
	if _, err := w.pool.Exec(ctx, "DELETE FROM "+pgx.Identifier{w.table}.Sanitize()+" WHERE key = $1", c.Key); err != nil {
		return "", err
	}
	w.mark(w.ow.deleted, c.Key)
	w.count("faults: a failed claim deleted by hand", 1)
	w.touch(c.Customer, c.Period, fmt.Sprintf("its failed attempt %d's claim deleted by hand", c.Attempt))
	return fmt.Sprintf("%sa person deletes the failed claim %s%s%s", dunning, w.keyLabel(c.Key), simIf(len(before) > 0, ", whose re-bill is pending"), canceled), nil
}

// dunning: a dunning job re-bills c's period with the next attempt and
// dies once Stripe has the payment, before its answer.
func (w *simWorld) dunning(ctx context.Context, c simClaim) (string, error) {
	cfg := w.runners[0].cfg
	cfg.Scope = c.Scope
	if cfg.Scope == billing.DefaultScope {
		cfg.Scope = ""
	}
	w.cleanRuns++
	p, b, err := w.process(fmt.Sprintf("dunning.%d", w.cleanRuns), cfg)
	if err != nil {
		return "", err
	}
	sctx, cancel := context.WithTimeout(ctx, simStepBudget)
	defer cancel()
	p.arm(simCrashBeforeAnswer, 1, "", cancel)
	r, rerr := b.Rebill(sctx, c.Customer, c.Period, c.Attempt+1, nil)
	p.die("at the end of the dunning job")
	w.count("faults: a dunning job's re-bill that dies before Stripe's answer", 1)
	w.touch(c.Customer, c.Period, "re-billed by a dunning job that died before Stripe's answer")
	return fmt.Sprintf("a dunning job re-bills %s as attempt %d and dies: %s; then ", w.keyLabel(c.Key), c.Attempt+1, simReceipt(r, rerr)), nil
}

// billonceInvoices returns billonce's invoices at the fake with status.
func (w *simWorld) billonceInvoices(status string) []billingtest.Invoice {
	var out []billingtest.Invoice
	for _, in := range w.srv.Invoices("") {
		if in.Metadata[billing.MetaKey] != "" && !w.is(w.ow.foreign, in.ID) && (status == "" || in.Status == status) {
			out = append(out, in)
		}
	}
	return out
}

// dashboardItemOn: a person adds an item to one of billonce's drafts.
func (w *simWorld) dashboardItemOn(ctx context.Context, pick uint64) (string, error) {
	drafts := w.billonceInvoices("draft")
	if len(drafts) == 0 {
		return "", nil
	}
	return w.dashboardItem(ctx, simPick(drafts, pick).ID, "a draft billonce left")
}

// dashboardItem adds an item to invoice id in the dashboard.
func (w *simWorld) dashboardItem(ctx context.Context, id, when string) (string, error) {
	var in billingtest.Invoice
	for _, x := range w.srv.Invoices("") {
		if x.ID == id {
			in = x
		}
	}
	if in.Status != "draft" {
		return "", nil
	}
	form := url.Values{"customer": {in.Customer}, "invoice": {id}, "amount": {"1234"},
		"currency": {w.plan.prices[in.Customer].Currency}, "description": {"Added in the dashboard"}}
	status, body, err := w.otherPost(ctx, simDashboardSecret, "/v1/invoiceitems", w.otherKey(), form)
	if err != nil {
		return "", err
	}
	item := jsonString(body, "id")
	if status != http.StatusOK || item == "" {
		return fmt.Sprintf("a person's item on %s (%s) is refused: HTTP %d", id, when, status), nil
	}
	w.mark(w.ow.items, item)
	w.count("faults: an item added in the dashboard to billonce's draft", 1)
	w.touch(in.Customer, in.Metadata[billing.MetaPeriod], "an item added in the dashboard to its draft")
	return fmt.Sprintf("a person adds item %s to %s (%s)", item, id, when), nil
}

// dashboardInvoice: a person marks one of billonce's open invoices paid
// outside Stripe, or voids it.
func (w *simWorld) dashboardInvoice(ctx context.Context, pick uint64, action string) (string, error) {
	open := w.billonceInvoices("open")
	if len(open) == 0 {
		return "", nil
	}
	in := simPick(open, pick)
	form := url.Values{}
	what := "voided by hand"
	if action == "pay" {
		form.Set("paid_out_of_band", "true")
		what = "marked paid outside Stripe by hand"
	}
	status, _, err := w.otherPost(ctx, simDashboardSecret, "/v1/invoices/"+in.ID+"/"+action, w.otherKey(), form)
	if err != nil {
		return "", err
	}
	if status == http.StatusOK {
		if action == "void" {
			w.mark(w.ow.voided, in.ID)
		}
		w.count("faults: an open invoice "+what, 1)
		w.touch(in.Customer, in.Metadata[billing.MetaPeriod], "its open invoice "+what)
	}
	return fmt.Sprintf("%s: %s, HTTP %d", in.ID, what, status), nil
}

// foreignInvoice: a person duplicates one of billonce's invoices, its
// metadata with it, finalizes the copy and voids it.
func (w *simWorld) foreignInvoice(ctx context.Context, pick uint64) (string, error) {
	all := w.billonceInvoices("")
	if len(all) == 0 {
		return "", nil
	}
	src := simPick(all, pick)
	cur := w.plan.prices[src.Customer].Currency
	form := simMetaForm(src.Metadata)
	form.Set("customer", src.Customer)
	form.Set("currency", cur)
	form.Set("auto_advance", "false")
	_, body, err := w.otherPost(ctx, simDashboardSecret, "/v1/invoices", w.otherKey(), form)
	if err != nil {
		return "", err
	}
	id := jsonString(body, "id")
	if id == "" {
		return "", fmt.Errorf("duplicating %s: no invoice in the answer", src.ID)
	}
	w.mark(w.ow.foreign, id)
	steps := []struct {
		path string
		form url.Values
	}{
		{"/v1/invoiceitems", url.Values{"customer": {src.Customer}, "invoice": {id}, "amount": {"999"}, "currency": {cur}}},
		{"/v1/invoices/" + id + "/finalize", url.Values{}},
		{"/v1/invoices/" + id + "/void", url.Values{}},
	}
	for _, s := range steps {
		if status, _, err := w.otherPost(ctx, simDashboardSecret, s.path, w.otherKey(), s.form); err != nil || status != http.StatusOK {
			return "", fmt.Errorf("duplicating %s: %s: HTTP %d, %v", src.ID, s.path, status, err)
		}
	}
	w.count("faults: a duplicate of billonce's invoice made and voided", 1)
	w.touch(src.Customer, src.Metadata[billing.MetaPeriod], "a duplicate of its invoice, with its metadata, finalized and voided")
	return fmt.Sprintf("a person duplicates %s as %s, finalizes and voids it", src.ID, id), nil
}

// foreignMeterEvent: other code with the secret key sends a meter event
// with the identifier of a report delivered more than a day ago; Stripe
// rejects it as it aggregates (its customer is gone).
func (w *simWorld) foreignMeterEvent(ctx context.Context, pick uint64) (string, error) {
	can, err := w.otherClaims(ctx, func(c simClaim) bool {
		return c.Endpoint == "meter_events" && c.State == string(claim.StateSucceeded) && c.Age > 25*time.Hour
	})
	if err != nil || len(can) == 0 {
		return "", err
	}
	c := simPick(can, pick)
	meter := strings.Fields(c.Period)[1]
	form := url.Values{"event_name": {meter}, "identifier": {c.Key}, "payload[stripe_customer_id]": {simGoneCustomer}, "payload[value]": {"1"}}
	status, _, err := w.otherPost(ctx, simSecrets[w.runners[0].cfg.Secret], meterEvents, w.otherKey(), form)
	if err != nil {
		return "", err
	}
	if status != http.StatusOK {
		return fmt.Sprintf("another program's meter event with the identifier of %s %s is refused: HTTP %d", c.Customer, c.Period, status), nil
	}
	w.count("faults: another program's rejected meter event with billonce's identifier", 1)
	w.touch(c.Customer, c.Period, "another program's meter event with its identifier, rejected by Stripe")
	return fmt.Sprintf("another program sends a meter event with the identifier of %s %s (claimed %s ago); Stripe takes it", c.Customer, c.Period, simDur(c.Age)), nil
}

// overlapWindow: a reporter whose grid moved half an hour reports again a
// window billonce delivered, on the moved grid.
func (w *simWorld) overlapWindow(ctx context.Context, pick uint64) (string, error) {
	can, err := w.otherClaims(ctx, func(c simClaim) bool {
		return c.Endpoint == "meter_events" && c.State == string(claim.StateSucceeded) && strings.HasPrefix(c.Period, "usage "+simMeter+" ") &&
			!w.is(w.ow.shifted, c.Period)
	})
	if err != nil || len(can) == 0 {
		return "", err
	}
	c := simPick(can, pick)
	start, err := time.Parse(time.RFC3339, strings.Fields(c.Period)[2])
	if err != nil {
		return "", err
	}
	if w.oldWindow(start) {
		return "", nil
	}
	u := billing.Usage{Customer: c.Customer, Meter: simMeter, Kind: billing.Increments, Start: start.Add(30 * time.Minute),
		End: start.Add(90 * time.Minute), Value: c.Amount}
	w.mark(w.ow.shifted, simUsagePeriod(u))
	b := w.clean(w.runners[0].cfg)
	if b == nil {
		return "", nil
	}
	r, rerr := b.ReportUsage(ctx, u)
	w.count("faults: a window reported again on a grid moved by 30 minutes", 1)
	w.touch(c.Customer, c.Period, "reported again on a grid moved by 30 minutes")
	w.touch(c.Customer, simUsagePeriod(u), "reported again on a grid moved by 30 minutes")
	return fmt.Sprintf("a reporter on a grid moved 30 minutes reports %s %s to %s again: %s", c.Customer, u.Start.Format("15:04"), u.End.Format("15:04"), simUsageReceipt(r, rerr)), nil
}

// backfill: a backfill job reports a customer's window from 34 days ago
// and dies, after its claim or after Stripe took the event, while Stripe
// still takes the window; nothing reports it again.
func (w *simWorld) backfill(ctx context.Context, pick uint64) (string, error) {
	if w.now() >= simOldUntil || len(w.others.old) == 0 {
		return "", nil
	}
	cust := simPick(w.others.old, pick)
	u, _ := w.oldReport(cust)
	w.cleanRuns++
	p, b, err := w.process(fmt.Sprintf("backfill.%d", w.cleanRuns), w.runners[0].cfg)
	if err != nil {
		return "", err
	}
	crash := simCrashAfterClaim
	if pick>>32%2 == 1 {
		crash = simCrashBeforeAnswer
	}
	sctx, cancel := context.WithTimeout(ctx, simStepBudget)
	defer cancel()
	p.arm(crash, 1, "", cancel)
	r, rerr := b.ReportUsage(sctx, u)
	p.die("at the end of the backfill")
	w.count("faults: a backfill of a window from 34 days ago that dies", 1)
	w.touch(cust, simUsagePeriod(u), "a backfill of it that died, 34 days after the window")
	return fmt.Sprintf("a backfill job reports %s's window of %s, crash %s: %s", cust, u.Start.Format("Jan 2 15:04"), simCrashNames[crash], simUsageReceipt(r, rerr)), nil
}

// The in-step faults, which the round's fault script plays.

// otherInStep plays the round's fault of other writers that falls on the
// fake's request r, before Stripe executes it: the held write, and the
// item a person adds to a draft while billonce adds its lines, before it
// can have looked at them. It reports whether the request is the held
// one, which it lets through once released.
func (w *simWorld) otherInStep(r billingtest.Request) bool {
	if h := w.caughtAt(r); h != nil {
		close(h.arrived)
		select {
		case <-h.release:
		case <-w.closing:
		}
		return true
	}
	w.mu.Lock()
	or := w.orRound
	w.mu.Unlock()
	if or.dashItem && r.Method == http.MethodPost && r.Path == "/v1/invoiceitems" && w.dashDone.CompareAndSwap(false, true) {
		var id string
		for _, in := range w.billonceInvoices("draft") {
			if in.Customer == r.Customer {
				id = in.ID // the newest
			}
		}
		if id == "" {
			return false
		}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out, err := w.dashboardItem(ctx, id, "while billonce adds its lines")
		switch {
		case err != nil:
			w.harnessf("dashboard item: %v", err)
		case out != "":
			w.logf("  other writer, %s: %s", simDashboardItem, out)
		}
	}
	return false
}

// The claim rows of window totals: a copy, restored later.

// snapshotIfDue takes the copy of the window totals' rows once it is due,
// when a claim of a window's total (not its last) has just been made: a
// copy taken while that total is being sent.
func (w *simWorld) snapshotIfDue(ctx context.Context, req claimengine.Request, res claimResult) {
	w.ow.mu.Lock()
	due := w.ow.snapArmed && !w.ow.snapshot && !w.ow.restoredOnce && res.Outcome == claimengine.Won && req.Attempt < simTotalRevisions &&
		strings.HasPrefix(req.Period, "usage "+simTotalsMeter+" ")
	if due {
		w.ow.snapshot = true
	}
	w.ow.mu.Unlock()
	if !due {
		return
	}
	backup := pgx.Identifier{w.table + "_backup"}.Sanitize()
	if _, err := w.pool.Exec(ctx, "CREATE TABLE "+backup+" AS SELECT * FROM "+pgx.Identifier{w.table}.Sanitize()+
		" WHERE starts_with(period, $1)", "usage "+simTotalsMeter+" "); err != nil {
		w.harnessf("copying the totals' claims: %v", err)
		return
	}
	w.clock.Lock()
	w.shift = nil // the copy's times move with the table's
	w.clock.Unlock()
	w.count("faults: a copy of the totals' claim rows taken", 1)
	w.logf("  ! a copy of the window totals' claim rows is taken, as %s's total %d is claimed", req.Customer, req.Attempt)
}

// restoreRows restores the window totals' claim rows from the copy.
func (w *simWorld) restoreRows(ctx context.Context, when string) {
	w.ow.mu.Lock()
	taken := w.ow.snapshot
	w.ow.snapshot, w.ow.restoredOnce = false, taken // restored once
	w.ow.mu.Unlock()
	if !taken {
		return
	}
	table, backup := pgx.Identifier{w.table}.Sanitize(), pgx.Identifier{w.table + "_backup"}.Sanitize()
	var slots [][2]string
	err := pgx.BeginFunc(ctx, w.pool, func(tx pgx.Tx) error {
		rows, err := tx.Query(ctx, "DELETE FROM "+table+" WHERE starts_with(period, $1) RETURNING customer, period", "usage "+simTotalsMeter+" ")
		if err != nil {
			return err
		}
		gone, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ C, P string }])
		if err != nil {
			return err
		}
		rows, err = tx.Query(ctx, "INSERT INTO "+table+" SELECT * FROM "+backup+" RETURNING customer, period")
		if err != nil {
			return err
		}
		back, err := pgx.CollectRows(rows, pgx.RowToStructByPos[struct{ C, P string }])
		for _, s := range append(gone, back...) {
			slots = append(slots, [2]string{s.C, s.P})
		}
		w.ow.mu.Lock()
		for _, s := range back {
			w.ow.inCopy[[2]string{s.C, s.P}] = true
		}
		w.ow.mu.Unlock()
		return err
	})
	if err != nil {
		w.harnessf("restoring the totals' claims: %v", err)
		return
	}
	for _, s := range slots {
		w.touch(s[0], s[1], "its claim rows restored from an older copy")
		w.ow.mu.Lock()
		w.ow.restored[s] = true
		w.ow.mu.Unlock()
	}
	w.count("faults: the totals' claim rows restored from an older copy", 1)
	w.logf("  ! a person restores the window totals' claim rows from the copy (%s): %d rows touched", when, len(slots))
}

// retryFirstTotals: a day after the restore, the application's queue
// delivers again the report of the first total of every window whose
// later totals it holds receipts for.
func (w *simWorld) retryFirstTotals(ctx context.Context, b *billing.Biller) {
	if b == nil || !w.restoredOnce() {
		return
	}
	for _, c := range w.others.totals {
		for _, per := range w.plan.periods {
			w.ow.mu.Lock()
			done := w.ow.totalsDone[[2]string{c, per}]
			w.ow.mu.Unlock()
			if done < 2 {
				continue
			}
			u := w.totalReport(c, per, 1)
			w.ow.mu.Lock()
			inCopy := w.ow.inCopy[[2]string{c, simUsagePeriod(u)}]
			w.ow.mu.Unlock()
			if !inCopy {
				// A first total the copy has no row of is claimed afresh,
				// and billonce tells its window's age by its own clock,
				// which the simulation does not move (see restore-rows).
				w.count("first totals not delivered again: no row in the copy", 1)
				continue
			}
			r, err := b.ReportUsage(ctx, u)
			w.noteHeld(err)
			w.count("faults: a first total's report delivered again after the restore", 1)
			w.touch(c, simUsagePeriod(u), "its first total's report delivered again after the restore")
			w.logf("  the application's queue reports %s's first total of %s (%d) again: %s", c, per, u.Value, simUsageReceipt(r, err))
		}
	}
}

func (w *simWorld) restoredOnce() bool {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	return w.ow.restoredOnce
}

// Usage reports of the other workloads: old windows and window totals.

const (
	simTotalsMeter    = "api_calls_hourly" // a meter that keeps the newest event of each hour
	simTotalRevisions = 3                  // totals of one window
	simOldUntil       = 20 * time.Hour     // old windows are reported until then
)

// simTotalSteps are what each revision adds to a window's total.
var simTotalSteps = [simTotalRevisions]int64{0, 7, 19}

// oldWindow reports whether start is that of a window from 34 days ago.
func (w *simWorld) oldWindow(start time.Time) bool {
	return start.Before(w.usageBase.Add(-24 * time.Hour))
}

// oldReport is customer's report of a window that ended 34 days ago, when
// it has one: reported while Stripe takes it, which on the fake's clock
// ends a day and two hours into the scenario.
func (w *simWorld) oldReport(customer string) (billing.Usage, bool) {
	if !slices.Contains(w.others.old, customer) {
		return billing.Usage{}, false
	}
	start := w.oldBase
	return billing.Usage{Customer: customer, Meter: simMeter, Kind: billing.Increments, Start: start, End: start.Add(time.Hour),
		Value: w.plan.prices[customer].Amount/10 + 100}, true
}

// totalReport is customer's window total of revision rev (from 1) for
// period.
func (w *simWorld) totalReport(customer, period string, rev int) billing.Usage {
	start := w.usageBase.Add(time.Duration(slices.Index(w.plan.periods, period)*simUsageWindows) * time.Hour)
	return billing.Usage{Customer: customer, Meter: simTotalsMeter, Kind: billing.WindowTotals, Start: start, End: start.Add(time.Hour),
		Value: w.plan.prices[customer].Amount/20 + simTotalSteps[rev-1], Attempt: rev}
}

// reportTotal reports customer's next window total for period, if there
// is one, and records the receipt the application holds for it. A Biller
// of the second scope is another product's: it reports no totals.
func (w *simWorld) reportTotal(ctx context.Context, b *billing.Biller, scope, customer, period string) (string, error, bool) {
	if !slices.Contains(w.others.totals, customer) || scope != "" {
		return "", nil, false
	}
	cp := [2]string{customer, period}
	w.ow.mu.Lock()
	rev := w.ow.totalsDone[cp] + 1
	w.ow.mu.Unlock()
	if rev > simTotalRevisions {
		return "", nil, false
	}
	u := w.totalReport(customer, period, rev)
	r, err := b.ReportUsage(ctx, u)
	if err == nil {
		w.ow.mu.Lock()
		w.ow.totalsDone[cp] = max(w.ow.totalsDone[cp], rev)
		w.ow.mu.Unlock()
	}
	return fmt.Sprintf("total %d (%d): %s", rev, u.Value, simUsageReceipt(r, err)), err, true
}

// checkOthers adds what the other workloads' reports must satisfy to the
// usage checker, and removes their claims from byWindow.
func (w *simWorld) checkOthers(byWindow map[[2]string][]simClaim, add func(cust, period, kind, format string, args ...any)) (oldCounted map[string]int) {
	oldCounted = make(map[string]int)
	// Reports on a moved grid: their claims are not the checker's
	// windows; what they counted shows in the windows they overlap.
	for cp, cs := range byWindow {
		if !w.is(w.ow.shifted, cp[1]) {
			continue
		}
		delete(byWindow, cp)
		for _, c := range cs {
			if c.State == string(claim.StateSucceeded) {
				w.count("reports on a moved grid recorded as delivered", 1)
			}
		}
	}
	for _, cust := range w.others.old {
		u, _ := w.oldReport(cust)
		cp := [2]string{cust, simUsagePeriod(u)}
		cs := byWindow[cp]
		delete(byWindow, cp)
		if len(cs) > 0 {
			w.touch(cp[0], cp[1], "a window reported 34 days after it")
		}
		var states []string
		succeeded := 0
		for _, c := range cs {
			states = append(states, c.State)
			if c.State == string(claim.StateSucceeded) {
				succeeded++
			}
		}
		at := cust + " " + u.Start.Format("Jan 2 15:04") + " (34 days before)"
		switch total := w.srv.MeterTotal(simMeter, cust, u.Start, u.End); {
		case total == float64(u.Value):
			oldCounted[cust]++
			w.count("old windows counted once", 1)
			if succeeded != 1 {
				add(cp[0], cp[1], "unrecorded usage", "%s: counted once at Stripe, but %d succeeded claims %v", at, succeeded, states)
			}
		case total == 0 && succeeded > 0:
			add(cp[0], cp[1], "false success", "%s: %d succeeded claims %v, but Stripe counts nothing", at, succeeded, states)
		case total == 0 && slices.Contains(states, string(claim.StatePending)) && !w.heldFor(cp[0], cp[1]):
			// Stripe no longer takes it: billonce fails it or leaves it to
			// a person, and says so.
			add(cp[0], cp[1], "unsettled", "%s: Stripe counts nothing and its claims %v stay pending, unreported, after settling", at, states)
		case total == 0:
			if len(cs) > 0 {
				w.count("old windows left uncounted, their claims "+strings.Join(slices.Compact(slices.Sorted(slices.Values(states))), "/"), 1)
			}
		default:
			add(cp[0], cp[1], "wrong total", "%s: total %v, value %d; claims %v", at, total, u.Value, states)
		}
	}
	for _, cust := range w.others.totals {
		for _, per := range w.plan.periods {
			w.checkTotals(byWindow, cust, per, add)
		}
	}
	return oldCounted
}

// checkTotals checks one window's totals: the meter keeps the newest
// total the application holds a receipt for, or a later one that may
// have been delivered without one; never an older one.
func (w *simWorld) checkTotals(byWindow map[[2]string][]simClaim, cust, per string, add func(cust, period, kind, format string, args ...any)) {
	w.ow.mu.Lock()
	done := w.ow.totalsDone[[2]string{cust, per}]
	w.ow.mu.Unlock()
	values := make([]float64, simTotalRevisions+1)
	allowed := map[float64]bool{}
	var states []string
	restored := false
	claims := make([][]simClaim, simTotalRevisions+1)
	var periods []string
	for rev := 1; rev <= simTotalRevisions; rev++ {
		cp := [2]string{cust, simUsagePeriod(w.totalReport(cust, per, rev))}
		claims[rev] = byWindow[cp]
		delete(byWindow, cp)
		restored = restored || w.restoredAt(cp)
		periods = append(periods, cp[1])
	}
	// One cause for the window: what was done to any of its totals.
	for _, p := range periods[1:] {
		for _, what := range strings.Split(w.cause(cust, p), "; ") {
			if what != "" {
				w.touch(cust, periods[0], what)
			}
		}
	}
	var period string
	for rev := 1; rev <= simTotalRevisions; rev++ {
		u := w.totalReport(cust, per, rev)
		values[rev] = float64(u.Value)
		period = simUsagePeriod(u)
		if rev > done && restored {
			// Its claim may be gone with the restore, after it was sent.
			allowed[values[rev]] = true
		}
		for _, c := range claims[rev] {
			states = append(states, fmt.Sprintf("%d:%s", rev, c.State))
			if rev > done && (c.State == string(claim.StatePending) || c.State == string(claim.StateSucceeded)) {
				allowed[values[rev]] = true
			}
			if rev <= done && !restored && c.State != string(claim.StateSucceeded) {
				add(cust, period, "unrecorded usage", "%s total %d (%d) of %s: the application holds its receipt, but its claim is %s", cust, rev, u.Value, per, c.State)
			}
		}
	}
	allowed[values[done]] = true
	u := w.totalReport(cust, per, 1)
	total := w.srv.MeterTotal(simTotalsMeter, cust, u.Start, u.End)
	if allowed[total] {
		if done > 0 {
			w.count("window totals ending at the newest receipted", 1)
		}
		return
	}
	kind := "wrong total"
	if i := slices.Index(values[1:done+1], total); i >= 0 && done > 0 {
		kind = "older total kept"
	}
	add(cust, periods[0], kind, "%s totals of %s: the meter keeps %v, the newest total with a receipt is %v (revision %d of %v); claims %v",
		cust, per, total, values[done], done, values[1:], states)
}

func (w *simWorld) restoredAt(cp [2]string) bool {
	w.ow.mu.Lock()
	defer w.ow.mu.Unlock()
	return w.ow.restored[cp]
}

// noteHeld records the customers and periods that errs, of the settle
// phase, leave for a person.
func (w *simWorld) noteHeld(errs ...error) {
	for _, err := range errs {
		var ce *billing.ChargeError
		if errors.As(err, &ce) && errors.Is(err, billing.ErrNeedsReconciliation) {
			w.ow.mu.Lock()
			w.ow.held[[2]string{ce.Customer, ce.Period}] = true
			w.ow.mu.Unlock()
		}
	}
}

// heldFor reports whether customer's period is left for a person, as
// billonce may leave it once another writer acted on it: the settle phase
// reported it (ErrNeedsReconciliation) and another writer touched it.
// With infrastructure faults alone nothing is left for a person.
func (w *simWorld) heldFor(customer, period string) bool {
	w.ow.mu.Lock()
	held := w.ow.held[[2]string{customer, period}]
	w.ow.mu.Unlock()
	return held && w.cause(customer, period) != ""
}

// rowsEdited reports whether a person deleted claims of err's customer
// and period: a re-bill may then meet a gap in its attempts, which
// billonce refuses as invalid.
func (w *simWorld) rowsEdited(err error) bool {
	var ce *billing.ChargeError
	if !errors.As(err, &ce) {
		return false
	}
	return strings.Contains(w.cause(ce.Customer, ce.Period), "deleted by hand")
}
