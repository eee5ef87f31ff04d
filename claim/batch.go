package claim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// CheckSendSucceed answers many CheckSend questions and records many
// successes in one round trip to the database. checkErrs[i] is what
// CheckSend(ctx, checks[i].Key, checks[i].Owner, window) would return, and
// doneErrs[i] what Succeed(ctx, done[i].Key, done[i].StripeID) would.
//
// Each check is made on the database clock when the statement reads the
// row, after the call began, exactly as CheckSend makes it: a nil answer
// allows one send that starts after CheckSendSucceed returns. The
// successes are written in one transaction; a key the batch cannot settle
// (its claim is not pending, or the batch failed) is recorded on its own
// with Succeed, which reports conflicts the same way.
func (p *pgEngine) CheckSendSucceed(ctx context.Context, window time.Duration, checks []sendCheck, done []success) (checkErrs, doneErrs []error) {
	checkErrs, doneErrs = make([]error, len(checks)), make([]error, len(done))
	var badCheck, badDone bool
	for i, c := range checks {
		if err := errors.Join(validateID("key", c.Key), validateID("owner", c.Owner), validateWindow(window)); err != nil {
			checkErrs[i], badCheck = err, true
		}
	}
	for i, d := range done {
		if err := errors.Join(validateID("key", d.Key), validateID("stripe id", d.StripeID)); err != nil {
			doneErrs[i], badDone = err, true
		}
	}
	if badCheck || badDone || len(checks)+len(done) == 0 {
		// Bad arguments are rare: answer each on its own.
		for i, c := range checks {
			if checkErrs[i] == nil {
				checkErrs[i] = p.CheckSend(ctx, c.Key, c.Owner, window)
			}
		}
		for i, d := range done {
			if doneErrs[i] == nil {
				doneErrs[i] = p.Succeed(ctx, d.Key, d.StripeID)
			}
		}
		return checkErrs, doneErrs
	}

	// Checks first, so that no row lock taken by the update delays them;
	// clock_timestamp() is the time the row is read, never earlier.
	var b pgx.Batch
	open := make([]bool, len(checks)) // held and inside the window
	if len(checks) > 0 {
		keys, owners := make([]string, len(checks)), make([]string, len(checks))
		for i, c := range checks {
			keys[i], owners[i] = c.Key, c.Owner
		}
		b.Queue(`SELECT k.ord FROM unnest($1::text[], $2::text[]) WITH ORDINALITY AS k(key, owner, ord)
			JOIN `+p.names.table+` t ON t.key = k.key
			WHERE t.key = ANY ($1::text[]) AND t.owner = k.owner AND t.state = 'pending'
				AND clock_timestamp() < t.first_sent_at + $3 * interval '1 microsecond'`,
			keys, owners, window.Microseconds()).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var ord int64
				if err := rows.Scan(&ord); err != nil {
					return err
				}
				if ord < 1 || int(ord) > len(open) {
					return fmt.Errorf("the database answered check %d of %d", ord, len(open))
				}
				open[ord-1] = true
			}
			return rows.Err()
		})
	}
	written := make([]bool, len(done))
	if len(done) > 0 {
		// Two batches over the same rows lock them in the same order, of
		// their row ids (a deadlock would only cost a retry below).
		order := make([]int, len(done))
		for i := range order {
			order[i] = i
		}
		slices.SortFunc(order, func(a, b int) int {
			if done[a].Key < done[b].Key {
				return -1
			}
			if done[a].Key > done[b].Key {
				return 1
			}
			return 0
		})
		keys, ids, ords := make([]string, len(done)), make([]string, len(done)), make([]int32, len(done))
		for j, i := range order {
			keys[j], ids[j], ords[j] = done[i].Key, done[i].StripeID, int32(i+1)
		}
		// The rows are found by a probe of each key, and updated by their
		// row ids: a connection caches one generic plan for the
		// statement, and a join of the table with the batch's keys,
		// planned while the table was small, read every pending claim
		// for each batch once a killed run had left many
		// (TestSucceedBatchReadsNoMoreWhenPendingClaimsPileUp). A key
		// whose row the update misses is recorded on its own below, as
		// any key the batch does not settle.
		b.Queue(`UPDATE `+p.names.table+` t SET state = 'succeeded', stripe_id = ($2::text[])[array_position($1::text[], t.key)], updated_at = now()
			WHERE t.ctid = ANY (ARRAY(SELECT x.ctid FROM unnest($1::text[]) AS d(key)
				CROSS JOIN LATERAL (SELECT ctid FROM `+p.names.table+` x WHERE x.key = d.key AND x.state = 'pending' OFFSET 0) x))
				AND t.key = ANY ($1::text[]) AND t.state = 'pending'
			RETURNING ($3::int[])[array_position($1::text[], t.key)]`,
			keys, ids, ords).Query(func(rows pgx.Rows) error {
			for rows.Next() {
				var ord int32
				if err := rows.Scan(&ord); err != nil {
					return err
				}
				if ord < 1 || int(ord) > len(written) {
					return fmt.Errorf("the database answered success %d of %d", ord, len(written))
				}
				written[ord-1] = true
			}
			return rows.Err()
		})
	}
	if err := p.db.SendBatch(ctx, &b).Close(); err != nil {
		// Nothing of the batch was committed (it runs as one transaction):
		// answer each on its own.
		clear(open)
		clear(written)
	}
	for i, c := range checks {
		if !open[i] {
			// Not allowed, or not answered: CheckSend says why, on a
			// later reading of the clock.
			checkErrs[i] = p.CheckSend(ctx, c.Key, c.Owner, window)
		}
	}
	for i, d := range done {
		if !written[i] {
			doneErrs[i] = p.Succeed(ctx, d.Key, d.StripeID)
		}
	}
	return checkErrs, doneErrs
}
