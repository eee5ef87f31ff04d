package billingtest_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/billonce/billonce/billing/billingtest"
)

// recorder is a testing.TB that records a failure instead of stopping.
type recorder struct {
	testing.TB
	failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
}

// Start closes the server when the test ends; RequireChargedOnce and
// RequireNotCharged judge by the ledger and name the payments when they
// fail.
func TestStartAndRequire(t *testing.T) {
	var srv *billingtest.Server
	t.Run("start", func(t *testing.T) {
		srv = billingtest.Start(t, billingtest.Config{})
		api := newAPI(t, srv, testKey, nil)
		for _, key := range []string{"k1", "k1", "k2"} { // a replay, then a second charge
			if _, err := api.Charges.New(chargeParams("cus_1", "2026-09", key)); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := api.Charges.New(chargeParams("cus_2", "2026-09", "k3")); err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			check    func(testing.TB)
			failWith string
		}{
			{func(tb testing.TB) { billingtest.RequireChargedOnce(tb, srv, "cus_2", "2026-09") }, ""},
			{func(tb testing.TB) { billingtest.RequireNotCharged(tb, srv, "cus_3", "2026-09") }, ""},
			{func(tb testing.TB) { billingtest.RequireChargedOnce(tb, srv, "cus_1", "2026-09") }, `charged 2 times for 2026-09; want exactly once`},
			{func(tb testing.TB) { billingtest.RequireChargedOnce(tb, srv, "cus_1", "2026-10") }, `charged 0 times`},
			{func(tb testing.TB) { billingtest.RequireNotCharged(tb, srv, "cus_2", "2026-09") }, `key="k3"`},
		} {
			r := &recorder{TB: t}
			tc.check(r)
			if tc.failWith == "" && r.failed != "" || !strings.Contains(r.failed, tc.failWith) {
				t.Errorf("failure %q; want one containing %q", r.failed, tc.failWith)
			}
		}
	})
	if _, err := newAPI(t, srv, testKey, nil).Charges.New(chargeParams("cus_9", "2026-09", "k9")); err == nil {
		t.Fatal("the server still answers after the test that started it ended")
	}
}
