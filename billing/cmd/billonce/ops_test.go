package main

import (
	"context"
	"encoding/csv"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/idemkey"
	"github.com/billonce/billonce/internal/claimengine"
)

// pendingClaim makes a pending claim for customer, as a runner that died
// before sending would leave it: the key the command derives, sent to
// the endpoint with the credential of the claim of like (a customer the
// command billed), its lease over. Nothing is sent to Stripe.
func (e *env) pendingClaim(customer string, amount int64, like string) string {
	e.t.Helper()
	ref := e.getClaim(e.keyOf(like, period, 1))
	k, err := idemkey.For("billonce", customer, period, "1")
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := claim.NewPostgres(e.pool, claim.Config{Lease: time.Millisecond})
	if err != nil {
		e.t.Fatal(err)
	}
	eng := claimengine.Of[claim.Claim](st)
	res, err := eng.Claim(context.Background(), claimengine.Request{Customer: customer, Period: period, Key: k.String(),
		Amount: amount, Currency: "usd", Owner: "a-runner-that-died", Scope: "billonce", Attempt: 1,
		Endpoint: ref.Endpoint, Credential: ref.Credential})
	if err != nil || res.Outcome != claimengine.Won {
		e.t.Fatalf("claiming: %v, %v", err, res.Outcome)
	}
	time.Sleep(5 * time.Millisecond) // the lease of 1ms runs out
	return k.String()
}

// billed runs the command for customers and wants every one billed.
func (e *env) billed(rows string) {
	e.t.Helper()
	e.billonce(rows, "run", "-period", period).want(e.t, exitOK)
}

func TestStatusShowsStatesPendingAndFailures(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "expired_card"}})
	e.billonce("cus_a,100,usd\ncus_d,100,usd\n", "run", "-period", period).want(t, exitIncomplete)
	key := e.pendingClaim("cus_p", 300, "cus_a")
	e.exec("UPDATE billonce_claims SET last_error = 'reconciliation: Stripe search failed: boom' WHERE key = $1", key)

	r := e.billonce("", "status", "-period", period, "-json").want(t, exitOK)
	st := decode[statusJSON](t, r.stdout)
	if st.States["succeeded"] != 1 || st.States["failed"] != 1 || st.States["pending"] != 1 || st.States["processing"] != 0 {
		t.Errorf("states %v", st.States)
	}
	if len(st.Pending) != 1 || st.Pending[0].Key != key || st.Pending[0].Owner != "a-runner-that-died" || !st.Pending[0].Free {
		t.Errorf("pending %+v", st.Pending)
	}
	kinds := map[string]failure{}
	for _, f := range st.Failures {
		kinds[f.Kind] = f
	}
	if f := kinds["declined"]; f.Customer != "cus_d" || f.StripeCode != "card_declined" || f.DeclineCode != "expired_card" || f.Key == "" {
		t.Errorf("declined failure %+v", f)
	}
	if f := kinds["needs_reconciliation"]; f.Customer != "cus_p" || f.Key != key {
		t.Errorf("needs_reconciliation failure %+v", f)
	}
	r = e.billonce("", "status", "-period", period).want(t, exitOK)
	for _, want := range []string{"pending         1", "cus_p attempt 1", "free now", "cus_d attempt 1: declined (card_declined)"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("status text lacks %q:\n%s", want, r.stdout)
		}
	}
}

func TestExportWritesEveryClaimOfThePeriod(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\ncus_b,250,eur\n")
	e.billonce("cus_z,100,usd\n", "run", "-period", "2026-10").want(t, exitOK)

	r := e.billonce("", "export", "-period", period).want(t, exitOK)
	recs, err := csv.NewReader(strings.NewReader(r.stdout)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || strings.Join(recs[0], ",") != strings.Join(exportHeader, ",") {
		t.Fatalf("export:\n%s", r.stdout)
	}
	if recs[2][0] != "cus_b" || recs[2][4] != "succeeded" || recs[2][5] != "250" || recs[2][6] != "eur" || !strings.HasPrefix(recs[2][7], "ch_") {
		t.Errorf("row %v", recs[2])
	}
	r = e.billonce("", "export", "-period", period, "-format", "json").want(t, exitOK)
	rows := decode[[]exportRow](t, r.stdout)
	if len(rows) != 2 || rows[0].Customer != "cus_a" || rows[0].Amount != 100 || rows[0].StripeID == "" {
		t.Errorf("json export %+v", rows)
	}
}

func TestInspectShowsWhereTheKeyWent(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.keyOf("cus_a", period, 1)
	byKey := decode[[]claimJSON](t, e.billonce("", "inspect", "-key", key, "-json").want(t, exitOK).stdout)
	byCustomer := decode[[]claimJSON](t, e.billonce("", "inspect", "-customer", "cus_a", "-period", period, "-json").want(t, exitOK).stdout)
	for _, got := range [][]claimJSON{byKey, byCustomer} {
		if len(got) != 1 || got[0].Key != key || got[0].State != "succeeded" || got[0].Endpoint != "charges" ||
			!strings.HasPrefix(got[0].Credential, "sha256:") || !strings.HasPrefix(got[0].StripeID, "ch_") {
			t.Errorf("inspect %+v", got)
		}
	}
	r := e.billonce("", "inspect", "-key", key).want(t, exitOK)
	if !strings.Contains(r.stdout, "key sent to charges with credential sha256:") || strings.Contains(r.stdout, testKey) {
		t.Errorf("inspect text:\n%s", r.stdout)
	}
	e.billonce("", "inspect", "-customer", "cus_nobody", "-period", period).want(t, exitStopped)
}

func TestReconcileFinishesWhatARunnerLeftPending(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.pendingClaim("cus_p", 300, "cus_a")
	billingtest.RequireNotCharged(t, e.fake, "cus_p", period)

	r := e.billonce("", "reconcile", "-json").want(t, exitOK)
	if s := decode[summaryJSON](t, r.stdout); s.Status != "complete" || s.Created != 1 {
		t.Errorf("reconcile %+v", s)
	}
	billingtest.RequireChargedOnce(t, e.fake, "cus_p", period)
	if c := e.getClaim(key); c.State != claim.StateSucceeded {
		t.Errorf("claim %s, want succeeded", c.State)
	}
	e.billonce("", "reconcile").want(t, exitOK)
	billingtest.RequireChargedOnce(t, e.fake, "cus_p", period)
}

func TestRebillPrintsFirstAndBillsOnlyWithYes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "insufficient_funds"}})
	e.billonce("cus_d,700,usd\n", "run", "-period", period).want(t, exitIncomplete)
	billingtest.RequireNotCharged(t, e.fake, "cus_d", period)
	e.fake.Honor("cus_d")

	r := e.billonce("", "rebill", "-customer", "cus_d", "-period", period, "-attempt", "2").want(t, exitUsage)
	if !strings.Contains(r.stdout, "attempt 1: failed, 700 usd") || !strings.Contains(r.stdout, "will charge customer cus_d 700 usd for 2026-09 as attempt 2") ||
		!strings.Contains(r.stderr, "pass -yes") {
		t.Errorf("rebill without -yes:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	billingtest.RequireNotCharged(t, e.fake, "cus_d", period)

	e.billonce("", "rebill", "-customer", "cus_d", "-period", period, "-attempt", "2", "-yes").want(t, exitOK)
	billingtest.RequireChargedOnce(t, e.fake, "cus_d", period)
	e.billonce("", "rebill", "-customer", "cus_d", "-period", period, "-attempt", "2", "-yes").want(t, exitOK)
	billingtest.RequireChargedOnce(t, e.fake, "cus_d", period)
}

func TestResolveRecordsOnlyAVerifiedPayment(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\ncus_b,200,usd\n")
	ka, kb := e.keyOf("cus_a", period, 1), e.keyOf("cus_b", period, 1)
	cha, chb := e.getClaim(ka).StripeID, e.getClaim(kb).StripeID
	// cus_a was charged but its claim does not know it, and search failed.
	e.exec(`UPDATE billonce_claims SET state = 'pending', stripe_id = '', lease_until = now(),
		last_error = 'reconciliation: Stripe search failed: boom' WHERE key = $1`, ka)

	for _, c := range []struct{ payment, want string }{
		{chb, "customer is \"cus_b\", the claim's is \"cus_a\""},
		{"ch_does_not_exist", "Stripe answered 404"},
		{"none", "\"none\" is accepted only after 24h0m0s"},
	} {
		r := e.billonce("", "resolve", "-key", ka, "-payment", c.payment).want(t, exitUsage)
		if !strings.Contains(r.stderr, c.want) {
			t.Errorf("resolve %s: stderr %q lacks %q", c.payment, r.stderr, c.want)
		}
		if got := e.getClaim(ka); got.State != claim.StatePending || got.LastError != "reconciliation: Stripe search failed: boom" {
			t.Errorf("resolve %s changed the claim: %s %q", c.payment, got.State, got.LastError)
		}
	}
	// A runner holds the claim: resolve leaves it to the runner.
	e.exec("UPDATE billonce_claims SET owner = 'a-live-runner', lease_until = now() + interval '1 hour' WHERE key = $1", ka)
	r := e.billonce("", "resolve", "-key", ka, "-payment", cha).want(t, exitUsage)
	if !strings.Contains(r.stderr, `held by "a-live-runner"`) || e.getClaim(ka).State != claim.StatePending {
		t.Errorf("resolve of a held claim: %s", r.stderr)
	}
	e.exec("UPDATE billonce_claims SET lease_until = now() WHERE key = $1", ka)

	requests := e.fake.Stats().Created
	e.billonce("", "resolve", "-key", ka, "-payment", cha).want(t, exitOK)
	if got := e.getClaim(ka); got.State != claim.StateSucceeded || got.StripeID != cha {
		t.Errorf("claim %s %s, want succeeded %s", got.State, got.StripeID, cha)
	}
	if got := e.fake.Stats().Created; got != requests {
		t.Errorf("resolve created %d payments", got-requests)
	}
	billingtest.RequireChargedOnce(t, e.fake, "cus_a", period)
	e.billonce("", "resolve", "-key", ka, "-payment", cha).want(t, exitUsage)
}

func TestResolveNoneAfterTheWindowSendsTheKeyOnceMore(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,100,usd\n")
	key := e.pendingClaim("cus_p", 300, "cus_a")
	// Sent 25 hours ago, as far as the claim knows; a person checked
	// Stripe and found no payment.
	e.exec(`UPDATE billonce_claims SET first_sent_at = now() - interval '25 hours', created_at = now() - interval '25 hours',
		last_error = 'reconciliation: Stripe search failed: boom' WHERE key = $1`, key)

	e.billonce("", "resolve", "-key", key, "-payment", "none").want(t, exitOK)
	c := e.getClaim(key)
	if c.State != claim.StatePending || c.ReconciledAt.IsZero() || c.SentAge > time.Minute || c.Owner == "a-runner-that-died" {
		t.Errorf("claim after resolve none: %s, reconciled %v, sent %v ago, owner %q", c.State, c.ReconciledAt, c.SentAge, c.Owner)
	}
	billingtest.RequireNotCharged(t, e.fake, "cus_p", period)
	e.billed("cus_a,100,usd\ncus_p,300,usd\n")
	billingtest.RequireChargedOnce(t, e.fake, "cus_p", period)
	if got := e.getClaim(key); got.State != claim.StateSucceeded {
		t.Errorf("claim %s after the run, want succeeded", got.State)
	}
}

func TestReconcilePaymentIntentsTakesMethodsFromTheCustomersFile(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billonce("cus_a,100,usd,pm_card_visa\n", "run", "-api", "payment_intents", "-period", period).want(t, exitOK)
	e.pendingClaim("cus_p", 300, "cus_a")

	r := e.billonce("", "reconcile", "-api", "payment_intents", "-json").want(t, exitIncomplete)
	if s := decode[summaryJSON](t, r.stdout); len(s.Failures) != 1 || s.Failures[0].Customer != "cus_p" || s.Failures[0].Kind != "invalid" {
		t.Errorf("reconcile without the file: %+v", s)
	}
	billingtest.RequireNotCharged(t, e.fake, "cus_p", period)
	file := customersFile(t, "cus_a,100,usd,pm_card_visa\ncus_p,300,usd,pm_card_visa\n")
	e.billonce("", "reconcile", "-api", "payment_intents", "-customers", file).want(t, exitOK)
	billingtest.RequireChargedOnce(t, e.fake, "cus_p", period)
}

// A CSV export is opened in spreadsheets, which run a cell that starts
// with =, +, - or @ (or a tab or carriage return before one) as a formula:
// such a cell is written with a ' before it, as OWASP advises, and the
// JSON export keeps the values as they are.
func TestExportCSVCellsNeverStartAFormula(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	customers := []string{"=1+2", "+1", "-1", "@SUM(A1)"}
	rows := ""
	for _, c := range customers {
		rows += c + ",100,usd\n"
	}
	e.billed(rows)
	e.exec(`UPDATE billonce_claims SET last_error = E'\t=cmd', dispute = E'\r=2' WHERE customer = '-1'`)
	// A refund's row has the cells of its customer too, and its own.
	e.billonce("", "refund", "-customer", "=1+2", "-period", period, "-id", "=rma", "-amount", "10", "-yes").want(t, exitOK)
	e.exec(`UPDATE billonce_claims SET last_error = '@refund' WHERE refund_of IS NOT NULL`)

	r := e.billonce("", "export", "-period", period).want(t, exitOK)
	recs, err := csv.NewReader(strings.NewReader(r.stdout)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string][]string{}
	refunds := 0
	for _, rec := range recs[1:] {
		switch rec[15] {
		case "charge":
			got[rec[0]] = rec
		case "refund":
			refunds++
			if rec[0] != "'=1+2" || rec[11] != "'@refund" {
				t.Errorf("refund row %q: want its customer and last error after a '", rec)
			}
		}
	}
	if refunds != 1 {
		t.Errorf("%d refund rows; want 1", refunds)
	}
	for _, c := range customers {
		rec, ok := got["'"+c]
		if !ok {
			t.Errorf("customer %q: no row whose first cell is %q in\n%s", c, "'"+c, r.stdout)
			continue
		}
		if c == "-1" && (rec[9] != "'\r=2" || rec[11] != "'\t=cmd") {
			t.Errorf("customer -1: dispute %q, last_error %q; want them after a '", rec[9], rec[11])
		}
	}
	for _, rec := range recs {
		for _, cell := range rec {
			if cell != "" && strings.ContainsRune("=+-@\t\r", rune(cell[0])) {
				t.Errorf("cell %q starts a formula", cell)
			}
		}
	}
	rowsJSON := decode[[]exportRow](t, e.billonce("", "export", "-period", period, "-format", "json").want(t, exitOK).stdout)
	for _, row := range rowsJSON {
		if !slices.Contains(customers, row.Customer) {
			t.Errorf("json export has customer %q; want the IDs unchanged", row.Customer)
		}
	}
}

// The reading subcommands on a database without billonce's tables (never
// migrated, or another database than the services') say so and what to
// do, not PostgreSQL's "relation does not exist".
func TestReadsOnADatabaseWithoutTheTablesSayToMigrate(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	for _, args := range [][]string{
		{"status", "-period", period},
		{"export", "-period", period},
		{"inspect", "-customer", "cus_a", "-period", period},
		{"inspect", "-key", "bo1_0000"},
	} {
		r := e.billonce("", args...).want(t, exitStopped)
		if !strings.Contains(r.stderr, "no claim table billonce_claims") || !strings.Contains(r.stderr, "billonce migrate") ||
			!strings.Contains(r.stderr, "-database-url") || strings.Contains(r.stderr, "does not exist (SQLSTATE") {
			t.Errorf("%v: stderr %q; want it to say there is no claim table, to run billonce migrate or check -database-url", args, r.stderr)
		}
	}
}

// status -customers FILE names the customers of the run's file that have
// no claim for the period: those a run stopped or killed before reaching,
// which no claim shows.
func TestStatusNamesTheCustomersOfTheFileWithoutAClaim(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{Declines: map[string]string{"cus_d": "expired_card"}})
	e.billonce("cus_a,100,usd\ncus_d,100,usd\n", "run", "-period", period).want(t, exitIncomplete)
	file := customersFile(t, "\ufeffcustomer,amount,currency\ncus_a,100,usd\ncus_b,100,usd\ncus_d,100,usd\ncus_c,100,usd\n")

	r := e.billonce("", "status", "-period", period, "-customers", file, "-json").want(t, exitOK)
	type unclaimed struct {
		Unclaimed []string `json:"unclaimed"`
	}
	st := decode[unclaimed](t, r.stdout)
	if !slices.Equal(st.Unclaimed, []string{"cus_b", "cus_c"}) {
		t.Errorf("unclaimed %q; want cus_b and cus_c, in the file's order", st.Unclaimed)
	}
	r = e.billonce("", "status", "-period", period, "-customers", file).want(t, exitOK)
	if !strings.Contains(r.stdout, "no claim, never reached by a run: 2 of the 4 customers of "+file+"\n  cus_b\n  cus_c\n") {
		t.Errorf("status text:\n%s", r.stdout)
	}
	// IDs alone, from standard input; every customer claimed.
	r = e.billonce("cus_a\ncus_d\n", "status", "-period", period, "-customers", "-", "-json").want(t, exitOK)
	if st := decode[unclaimed](t, r.stdout); st.Unclaimed == nil || len(st.Unclaimed) != 0 {
		t.Errorf("unclaimed %q; want an empty list", st.Unclaimed)
	}
	e.billonce("cus_a,12.50\n", "status", "-period", period, "-customers", "-").want(t, exitOK)
	e.billonce("cus a\n", "status", "-period", period, "-customers", "-").want(t, exitUsage)
}

func TestRefundPrintsFirstAndRefundsOncePerIDOnlyWithYes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	e.billed("cus_a,1000,usd\n")
	refunds := func() (n int, sum int64) {
		for _, m := range e.fake.Movements("refund") {
			n++
			sum += m.Amount
		}
		return n, sum
	}
	r := e.billonce("", "refund", "-customer", "cus_a", "-period", period, "-id", "rma-7", "-amount", "400").want(t, exitUsage)
	if !strings.Contains(r.stdout, "will refund 400 of customer cus_a's payment for 2026-09, refund id rma-7") || !strings.Contains(r.stderr, "pass -yes") {
		t.Errorf("refund without -yes:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	if n, _ := refunds(); n != 0 {
		t.Fatalf("%d refunds without -yes", n)
	}
	for range 2 { // the operator runs it twice
		e.billonce("", "refund", "-customer", "cus_a", "-period", period, "-id", "rma-7", "-amount", "400", "-yes").want(t, exitOK)
	}
	if n, sum := refunds(); n != 1 || sum != 400 {
		t.Fatalf("Stripe holds %d refunds of %d, want one of 400", n, sum)
	}
	r = e.billonce("", "refund", "-customer", "cus_a", "-period", period, "-id", "rma-8", "-amount", "700", "-yes").want(t, exitUsage)
	if !strings.Contains(r.stderr, "600 usd left") {
		t.Errorf("refund past the payment:\nstdout:\n%s\nstderr:\n%s", r.stdout, r.stderr)
	}
	e.billonce("", "refund", "-customer", "cus_a", "-period", period, "-id", "rma-8", "-amount", "0", "-yes").want(t, exitUsage)
	if n, sum := refunds(); n != 1 || sum != 400 {
		t.Fatalf("Stripe holds %d refunds of %d after refused refunds, want one of 400", n, sum)
	}
	billingtest.RequireChargedOnce(t, e.fake, "cus_a", period)
}

func TestTransferAndPayoutPayEachAccountOncePerAttemptOnlyWithYes(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	e.fake.SetBalance("", "usd", 10_000)
	for _, what := range []string{"transfer", "payout"} {
		args := []string{what, "-account", acct, "-period", period, "-amount", "3000", "-currency", "usd"}
		r := e.billonce("", args...).want(t, exitUsage)
		if !strings.Contains(r.stdout, "will ") || !strings.Contains(r.stderr, "pass -yes") {
			t.Errorf("%s without -yes:\nstdout:\n%s\nstderr:\n%s", what, r.stdout, r.stderr)
		}
		for range 2 {
			e.billonce("", append(args, "-yes")...).want(t, exitOK)
		}
		if n := len(e.fake.Movements(what)); n != 1 {
			t.Fatalf("%d %ss at the fake, want 1", n, what)
		}
	}
	if b := e.fake.Balance(acct, "usd"); b != 0 {
		t.Fatalf("account balance %d, want 0: 3000 in, 3000 paid out", b)
	}
	e.billonce("", "transfer", "-account", "cus_x", "-period", period, "-amount", "1", "-currency", "usd", "-yes").want(t, exitUsage)
}
