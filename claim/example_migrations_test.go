package claim_test

import (
	"fmt"
	"strings"

	"github.com/billonce/billonce/claim"
)

// A team that applies migrations with goose writes each of billonce's into
// a migration file of its own, once, and adds the new ones a billonce
// upgrade brings. Each lists itself in the migrations record, so Migrate
// afterwards finds nothing to do.
func ExampleMigrations() {
	ms, err := claim.Migrations(claim.Config{Schema: "billing"})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, m := range ms {
		file := fmt.Sprintf("%05d_billonce_claims_%s.sql", m.Version, m.Name)
		// os.WriteFile(filepath.Join("db/migrations", file), []byte("-- +goose Up\n"+m.SQL), 0o644)
		first, _, _ := strings.Cut(m.SQL, "\n")
		fmt.Printf("%s: %s\n", file, first)
	}
	// Output:
	// 00001_billonce_claims_create.sql: CREATE SCHEMA IF NOT EXISTS "billing";
	// 00002_billonce_claims_identity.sql: -- What a claim knows about where its key went and the window of Stripe's
	// 00003_billonce_claims_settlement.sql: -- Payments that settle later (bank debits: ACH, SEPA, BACS) and the Stripe
	// 00004_billonce_claims_event_pruning.sql: -- Records of applied Stripe events are pruned once they are older than
	// 00005_billonce_claims_steps.sql: -- Claims of other Stripe writes than a single payment.
	// 00006_billonce_claims_usage_windows.sql: -- A usage report's identity as columns of its own: the meter's event name
	// 00007_billonce_claims_meter_ids.sql: -- The Stripe id of a usage report's meter ("mtr_…"), recorded when the
	// 00008_billonce_claims_unsent.sql: -- Whether a pending claim's key is known never to have executed at
	// 00009_billonce_claims_failed_periods.sql: -- A declined period is re-billed only from the scope that claimed it: a
	// 00010_billonce_claims_window_hashes.sql: -- The exclusion constraints that keep a customer's usage windows of one
	// 00011_billonce_claims_refunds.sql: -- A refund is a claim of its own, of the payment claim it refunds:
	// 00012_billonce_claims_accounts.sql: -- The Stripe account a claim's key goes to: a connected account's id
	// 00013_billonce_claims_pending_keys.sql: -- The claim statement takes over a pending claim by its key. The pending
}
