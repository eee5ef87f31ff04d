package billing

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/claimengine"
)

// claimResult and claimApplied are the claim engine's answers.
type (
	claimResult  = claimengine.Result[claim.Claim]
	claimApplied = claimengine.Applied[claim.Claim]
)

// recordLinger bounds how long a charge Stripe made waits for others to
// share the round trip that records it. Until it is written its claim is
// pending and leased to this run: a runner that dies meanwhile leaves it
// to be resumed with the same key, and Stripe replays the charge. No
// worker waits for it (a send check ends the wait at once), so it costs a
// Run only its last success's 10 ms; and a round trip costs PostgreSQL
// about as much for one row as for a dozen, so a longer wait is cheaper
// for the database: on a quiet 2-core machine (internal/cmd/bench), 10 ms
// against 2 ms took PostgreSQL's CPU per charge from 167 to 116 µs, and
// per 3-line invoice, whose successes arrive more slowly, from 450 to
// 270 µs.
var recordLinger = 10 * time.Millisecond

// recordBatch bounds the successes written in one round trip; the queue
// holds as many, so that a slow database slows the workers down instead
// of growing the queue.
const recordBatch = 256

// errRecording is what settleClaim returns for a charge whose success was
// handed to the run's recorder, which settles it once it is written.
var errRecording = errors.New("billing: the outcome is being recorded")

// A recorder serves one Run: it makes the send checks of the run's workers
// (each made on the database clock after the worker asked and before it
// sends, as CheckSend is) and records their successes (a charge, a paid
// invoice), many of both per
// round trip. A check never waits for company: it goes with whatever is
// queued when the previous round trip ends.
type recorder struct {
	b      *Biller
	r      *runner
	store  claimengine.Batcher
	checks chan sendCheck
	succ   chan success
	ended  chan struct{}
}

type sendCheck struct {
	key, owner string
	reply      chan error // buffered: the recorder never waits for a worker
}

type success struct {
	j   job
	out object
}

// newRecorder returns the run's recorder, or nil when the claim store
// cannot batch (each check and success is then a call of its own).
func (r *runner) newRecorder() *recorder {
	bs, ok := r.b.claims.(claimengine.Batcher)
	if !ok {
		return nil
	}
	rec := &recorder{b: r.b, r: r, store: bs, checks: make(chan sendCheck), succ: make(chan success, recordBatch), ended: make(chan struct{})}
	go rec.loop()
	return rec
}

// close writes what is queued and returns once every success is settled.
// No worker may use the recorder afterwards.
func (rec *recorder) close() {
	close(rec.succ)
	<-rec.ended
}

// check is CheckSend for key, made with the next round trip.
func (rec *recorder) check(ctx context.Context, key, owner string) error {
	q := sendCheck{key: key, owner: owner, reply: make(chan error, 1)}
	select {
	case rec.checks <- q:
	case <-ctx.Done():
		return fmt.Errorf("claim: checking %q before sending: %w", key, ctx.Err())
	}
	select {
	case err := <-q.reply:
		return err
	case <-ctx.Done():
		return fmt.Errorf("claim: checking %q before sending: %w", key, ctx.Err())
	}
}

// succeeded queues Stripe's answer out for j; the recorder settles j once
// it is written.
func (rec *recorder) succeeded(j job, out object) {
	rec.succ <- success{j, out}
}

func (rec *recorder) loop() {
	defer close(rec.ended)
	var (
		checks []sendCheck
		succ   []success
		closed bool
	)
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	add := func(s success, ok bool) {
		if ok {
			succ = append(succ, s)
		} else {
			closed = true
		}
	}
	for !closed || len(succ) > 0 {
		if len(checks) == 0 && len(succ) == 0 {
			select {
			case q := <-rec.checks:
				checks = append(checks, q)
			case s, ok := <-rec.succ:
				add(s, ok)
			}
		}
		// Successes alone wait a little for company; a check does not.
		if len(checks) == 0 && len(succ) > 0 && len(succ) < recordBatch && !closed {
			timer.Reset(recordLinger)
		linger:
			for len(succ) < recordBatch && !closed {
				select {
				case q := <-rec.checks:
					checks = append(checks, q)
					break linger
				case s, ok := <-rec.succ:
					add(s, ok)
				case <-timer.C:
					break linger
				}
			}
			timer.Stop()
		}
		// Whatever else is queued goes along.
	more:
		for len(succ) < recordBatch && !closed {
			select {
			case q := <-rec.checks:
				checks = append(checks, q)
			case s, ok := <-rec.succ:
				add(s, ok)
			default:
				break more
			}
		}
		if len(checks) > 0 || len(succ) > 0 {
			rec.round(checks, succ)
		}
		clear(checks)
		clear(succ)
		checks, succ = checks[:0], succ[:0]
	}
}

// round makes one round trip for checks and succ and hands out the answers.
func (rec *recorder) round(checks []sendCheck, succ []success) {
	cs := make([]claimengine.SendCheck, len(checks))
	for i, q := range checks {
		cs[i] = claimengine.SendCheck{Key: q.key, Owner: q.owner}
	}
	ds := make([]claimengine.Success, len(succ))
	for i, s := range succ {
		ds[i] = claimengine.Success{Key: s.j.key.String(), StripeID: s.out.id}
	}
	// Record even if the run was stopped meanwhile: the charges exist.
	// Only the run's caller giving up bounds the wait (see recordCtx).
	ctx, cancel := recordCtx(rec.r.caller)
	defer cancel()
	checkErrs, doneErrs := rec.store.CheckSendSucceed(ctx, rec.b.cfg.WindowMargin, cs, ds)
	for i, q := range checks {
		q.reply <- checkErrs[i]
	}
	for i, s := range succ {
		rc, err := rec.b.recorded(ctx, s.j, s.out, recordErr(ctx, doneErrs[i]))
		rec.b.outcome(s.j, s.j.start, rc, err)
		rec.r.settled(s.j, rc, err)
	}
}
