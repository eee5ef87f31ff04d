package riverbilling

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/riverqueue/river/rivertype"

	"github.com/billonce/billonce/claim"
)

// PeriodState is an operator's view of a period billed through River: its
// charge jobs by River state (a job of several customers counts once) and
// its claims, one per customer, by state.
//
// Read together: claims succeeded is who is billed; claims failed is who
// was declined (and cancelled jobs, with their errors, say why); claims
// pending with no job available, running, retryable or scheduled were left
// by discarded or cancelled jobs: fan the period out again (or call
// Biller.Reconcile) to settle them with their keys.
type PeriodState struct {
	Period string
	Jobs   map[rivertype.JobState]int
	Claims map[claim.State]int
}

// State reads the state of period: charge jobs from River's job table
// (river_job on db's search_path) and claims from claims. It scans the
// period's jobs once; run it for an operator, not in a loop.
func State(ctx context.Context, db DB, claims *claim.Postgres, period string) (PeriodState, error) {
	st := PeriodState{Period: period, Jobs: map[rivertype.JobState]int{}}
	rows, err := db.Query(ctx, `SELECT state::text, count(*) FROM river_job
		WHERE kind = $1 AND args->>'period' = $2 GROUP BY state`, kindCharge, period)
	if err != nil {
		return st, fmt.Errorf("riverbilling: counting the jobs of period %s: %w", period, err)
	}
	for rows.Next() {
		var (
			s string
			n int
		)
		if err := rows.Scan(&s, &n); err != nil {
			rows.Close()
			return st, fmt.Errorf("riverbilling: counting the jobs of period %s: %w", period, err)
		}
		st.Jobs[rivertype.JobState(s)] = n
	}
	if err := rows.Err(); err != nil {
		return st, fmt.Errorf("riverbilling: counting the jobs of period %s: %w", period, err)
	}
	if st.Claims, err = claims.Count(ctx, period); err != nil {
		return st, err
	}
	return st, nil
}

// String prints the counts on one line, states in a fixed order.
func (s PeriodState) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "period %s: jobs", s.Period)
	for _, st := range rivertype.JobStates() {
		if n := s.Jobs[st]; n > 0 {
			fmt.Fprintf(&b, " %s=%d", st, n)
		}
	}
	b.WriteString("; claims")
	states := make([]string, 0, len(s.Claims))
	for st := range s.Claims {
		states = append(states, string(st))
	}
	slices.Sort(states)
	for _, st := range states {
		fmt.Fprintf(&b, " %s=%d", st, s.Claims[claim.State(st)])
	}
	return b.String()
}
