package main

import (
	"encoding/csv"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
)

// moves is a period with every kind of claim made for it: cus_a charged
// 1000 usd, refunded 400 (succeeded) and 300 (pending at its bank);
// cus_b charged 500 eur, refunded in the dashboard, so that billonce's
// refund of it is refused (failed); cus_i invoiced 800 usd and credited
// all of it by a credit note; cus_c charged 700 usd on a connected
// account, which the platform pays 3000 usd by a transfer and pays out
// 2000 usd of (a payout on its way to the bank).
func moves(t *testing.T) (*env, string) {
	t.Helper()
	e := newEnv(t, billingtest.Config{})
	acct := e.fake.CreateAccount()
	e.fake.SetBalance("", "usd", 10_000)
	e.billed("cus_a,1000,usd\ncus_b,500,eur\n")
	e.billonce("cus_i,800,usd\n", "run", "-period", period, "-invoice").want(t, exitOK)
	e.billonce("cus_c,700,usd\n", "run", "-period", period, "-account", acct).want(t, exitOK)

	refund := func(customer, id, amount string, code int) {
		t.Helper()
		e.billonce("", "refund", "-customer", customer, "-period", period, "-id", id, "-amount", amount, "-yes").want(t, code)
	}
	refund("cus_a", "rma-1", "400", exitOK)
	e.fake.SettleLater("cus_a", billingtest.Async{After: time.Hour})
	refund("cus_a", "rma-2", "300", exitOK)
	if err := e.fake.Refund(e.getClaim(e.keyOf("cus_b", period, 1)).StripeID, 0); err != nil {
		t.Fatal(err)
	}
	refund("cus_b", "rma-3", "100", exitIncomplete)
	refund("cus_i", "cn-1", "800", exitOK)
	for _, what := range []string{"transfer", "payout"} {
		amount := map[string]string{"transfer": "3000", "payout": "2000"}[what]
		e.billonce("", what, "-account", acct, "-period", period, "-amount", amount, "-currency", "usd", "-yes").want(t, exitOK)
	}
	return e, acct
}

// status -period P shows, beside the period's bills, its refunds and
// credit notes, transfers and payouts: how many, in which states, what
// the succeeded ones moved per currency, and those not settled or
// failed; -account only what is on the account or paid to it.
func TestStatusShowsThePeriodsRefundsTransfersAndPayouts(t *testing.T) {
	t.Parallel()
	e, acct := moves(t)
	st := decode[statusJSON](t, e.billonce("", "status", "-period", period, "-json").want(t, exitOK).stdout)
	if st.States["succeeded"] != 4 || st.States["failed"]+st.States["pending"]+st.States["processing"] != 0 {
		t.Errorf("bills %v; want the 4 bills succeeded, the refunds apart", st.States)
	}
	r := st.Refunds
	if r.Count != 4 || r.States["succeeded"] != 2 || r.States["processing"] != 1 || r.States["failed"] != 1 ||
		!maps.Equal(r.Amounts, map[string]int64{"usd": 1200}) {
		t.Errorf("refunds %+v; want 4: 400 and 800 usd refunded, one processing, one failed", r)
	}
	if len(r.Pending) != 1 || r.Pending[0].Customer != "cus_a" || r.Pending[0].Amount != 300 || r.Pending[0].Kind != "refund" ||
		r.Pending[0].RefundOf != e.keyOf("cus_a", period, 1) || !strings.HasPrefix(r.Pending[0].StripeID, "re_") {
		t.Errorf("refunds not settled %+v; want cus_a's refund of 300", r.Pending)
	}
	if len(r.Failed) != 1 || r.Failed[0].Customer != "cus_b" || r.Failed[0].Amount != 100 || r.Failed[0].Currency != "eur" || r.Failed[0].StripeCode != "charge_already_refunded" {
		t.Fatalf("refunds failed %+v; want cus_b's refund of 100 eur, with Stripe's code", r.Failed)
	}
	if tr := st.Transfers; tr.Count != 1 || tr.States["succeeded"] != 1 || !maps.Equal(tr.Amounts, map[string]int64{"usd": 3000}) {
		t.Errorf("transfers %+v; want one of 3000 usd", tr)
	}
	if po := st.Payouts; po.Count != 1 || len(po.Pending) != 1 || po.Pending[0].Account != acct || po.Pending[0].Amount != 2000 || len(po.Amounts) != 0 {
		t.Errorf("payouts %+v; want one of 2000 usd on its way", po)
	}
	// What status counts is what the fake holds: the refunds, credit
	// notes and transfers billonce made (those with its key), their
	// amounts per currency; the refused refund made none, and the pending
	// refund and the payout are on their way.
	byKey := map[string]billingtest.Movement{}
	moved := map[string]map[string]int64{"refund": {}, "transfer": {}}
	for _, what := range []string{"refund", "credit_note", "transfer", "payout"} {
		for _, m := range e.fake.Movements(what) {
			if k := m.Metadata[billing.MetaKey]; k != "" {
				byKey[k] = m
				switch {
				case what == "transfer":
					moved["transfer"][m.Currency] += m.Amount
				case m.Status == "succeeded" || m.Status == "issued":
					moved["refund"][m.Currency] += m.Amount
				}
			}
		}
	}
	if len(byKey) != 5 || !maps.Equal(moved["refund"], r.Amounts) || !maps.Equal(moved["transfer"], st.Transfers.Amounts) {
		t.Errorf("the fake holds %d of billonce's refunds, credit notes, transfers and payouts (want 5), refunded %v, transferred %v", len(byKey), moved["refund"], moved["transfer"])
	}
	for _, mv := range append(r.Pending, st.Payouts.Pending...) {
		if m, ok := byKey[mv.Key]; !ok || m.ID != mv.StripeID || m.Amount != mv.Amount || m.Status != "pending" {
			t.Errorf("%s %s not settled: at the fake %+v", mv.Kind, mv.Key, m)
		}
	}
	if m, ok := byKey[r.Failed[0].Key]; ok {
		t.Errorf("the failed refund is at the fake: %+v", m)
	}

	out := e.billonce("", "status", "-period", period).want(t, exitOK).stdout
	for _, want := range []string{
		"refunds and credit notes: 4, succeeded 2, processing 1, failed 1\n  refunded 1200 usd\n  not settled: refund cus_a, processing 300 usd",
		"  failed: refund cus_b, failed 100 eur, key " + r.Failed[0].Key + " (charge_already_refunded): ",
		"transfers: 1, succeeded 1\n  transferred 3000 usd\n",
		"payouts: 1, processing 1\n  not settled: payout " + acct + " on account " + acct + ", processing 2000 usd",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("status lacks %q:\n%s", want, out)
		}
	}

	st = decode[statusJSON](t, e.billonce("", "status", "-period", period, "-account", acct, "-json").want(t, exitOK).stdout)
	if st.Account != acct || st.States["succeeded"] != 1 || st.Refunds.Count != 0 || st.Transfers.Count != 1 || st.Payouts.Count != 1 {
		t.Errorf("status -account: %+v; want cus_c's bill, the transfer and the payout", st)
	}
}

// inspect -customer C -period P shows the customer's refunds and credit
// notes of the period beside its payment, and inspect -account A -period
// P the account's transfer and payout, each with its state and amount.
func TestInspectShowsACustomersRefundsAndAnAccountsTransfersAndPayouts(t *testing.T) {
	t.Parallel()
	e, acct := moves(t)
	type seen struct {
		kind, state string
		amount      int64
	}
	got := func(args ...string) []seen {
		t.Helper()
		var out []seen
		for _, c := range decode[[]claimJSON](t, e.billonce("", append([]string{"inspect", "-period", period, "-json"}, args...)...).want(t, exitOK).stdout) {
			out = append(out, seen{c.Kind, c.State, c.Amount})
		}
		return out
	}
	for _, c := range []struct {
		args []string
		want []seen
	}{
		{[]string{"-customer", "cus_a"}, []seen{{"charge", "succeeded", 1000}, {"refund", "succeeded", 400}, {"refund", "processing", 300}}},
		{[]string{"-customer", "cus_b"}, []seen{{"charge", "succeeded", 500}, {"refund", "failed", 100}}},
		{[]string{"-customer", "cus_i"}, []seen{{"invoice", "succeeded", 800}, {"credit_note", "succeeded", 800}}},
		{[]string{"-account", acct}, []seen{{"transfer", "succeeded", 3000}, {"payout", "processing", 2000}}},
		{[]string{"-customer", "cus_c", "-account", acct}, []seen{{"charge", "succeeded", 700}}},
	} {
		g := got(c.args...)
		slices.SortFunc(g, func(a, b seen) int { return strings.Compare(a.kind+a.state, b.kind+b.state) })
		slices.SortFunc(c.want, func(a, b seen) int { return strings.Compare(a.kind+a.state, b.kind+b.state) })
		if !slices.Equal(g, c.want) {
			t.Errorf("inspect %v: %v; want %v", c.args, g, c.want)
		}
	}
	out := e.billonce("", "inspect", "-customer", "cus_i", "-period", period).want(t, exitOK).stdout
	if !strings.Contains(out, "state succeeded, credit note of 800 usd, Stripe cn_") || !strings.Contains(out, ", of the payment of claim "+e.keyOf("cus_i", period, 1)) {
		t.Errorf("inspect text:\n%s", out)
	}
	out = e.billonce("", "inspect", "-account", acct, "-period", period).want(t, exitOK).stdout
	if !strings.Contains(out, "payout, customer "+acct+" on account "+acct+", period payout 2026-09") || !strings.Contains(out, "state succeeded, transfer of 3000 usd, Stripe tr_") {
		t.Errorf("inspect -account text:\n%s", out)
	}
	e.billonce("", "inspect", "-account", e.fake.CreateAccount(), "-period", period).want(t, exitStopped)
}

// export -period P has a row for each bill, refund, credit note,
// transfer and payout of the period, with its kind and account.
func TestExportHasARowOfEachKindMadeForThePeriod(t *testing.T) {
	t.Parallel()
	e, acct := moves(t)
	recs, err := csv.NewReader(strings.NewReader(e.billonce("", "export", "-period", period).want(t, exitOK).stdout)).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	col := map[string]int{}
	for i, h := range recs[0] {
		col[h] = i
	}
	kinds := map[string]int64{}
	for _, rec := range recs[1:] {
		if rec[col["state"]] == "succeeded" {
			amount := int64(0)
			for _, d := range rec[col["amount"]] {
				amount = amount*10 + int64(d-'0')
			}
			kinds[rec[col["kind"]]] += amount
		}
		wantAcct := ""
		if rec[col["customer"]] == "cus_c" || rec[col["kind"]] == "payout" {
			wantAcct = acct
		}
		if rec[col["account"]] != wantAcct {
			t.Errorf("row %v: account %q; want %q", rec, rec[col["account"]], wantAcct)
		}
		if k := rec[col["kind"]]; (k == "refund" || k == "credit_note") != (rec[col["refund_of"]] != "") {
			t.Errorf("row %v: kind %s, refund_of %q", rec, k, rec[col["refund_of"]])
		}
	}
	if len(recs) != 1+10 || !maps.Equal(kinds, map[string]int64{"charge": 2200, "invoice": 800, "refund": 400, "credit_note": 800, "transfer": 3000}) {
		t.Errorf("%d rows, succeeded amounts by kind %v:\n%v", len(recs)-1, kinds, recs)
	}
	rows := decode[[]exportRow](t, e.billonce("", "export", "-period", period, "-account", acct, "-format", "json").want(t, exitOK).stdout)
	var got []string
	for _, r := range rows {
		got = append(got, r.Kind+" "+r.State)
	}
	slices.Sort(got)
	if want := []string{"charge succeeded", "payout processing", "transfer succeeded"}; !slices.Equal(got, want) {
		t.Errorf("export -account: %v; want %v", got, want)
	}
}
