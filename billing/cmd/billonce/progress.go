package main

import (
	"fmt"
	"io"
	"time"

	"github.com/billonce/billonce/billing"
)

// progress prints a run's progress on standard error: a line at every
// tenth of the way, and between two tenths a line every progressEvery, so
// that a long run shows it is still at work. Billing calls it from one
// goroutine at a time.
type progress struct {
	w        io.Writer
	label    string
	start    time.Time
	lastStep int
	lastLine time.Time
}

// progressEvery is how often a run between two tenths of the way prints
// its progress.
const progressEvery = 10 * time.Second

func newProgress(w io.Writer, label string) *progress {
	now := time.Now()
	return &progress{w: w, label: label, start: now, lastLine: now}
}

func (p *progress) update(s billing.Progress) {
	if s.Total == 0 {
		return
	}
	now := time.Now()
	step := 10 * s.Done / s.Total
	if step <= p.lastStep && s.Done != s.Total && now.Sub(p.lastLine) < progressEvery {
		return
	}
	if s.Done == s.Total && p.lastStep == 10 {
		return
	}
	p.lastStep, p.lastLine = step, now
	fmt.Fprintf(p.w, "%s %3d%% %d/%d  created %d, already billed %d, declined %d, processing %d, pending %d, invalid %d  (%s)\n",
		p.label, 100*s.Done/s.Total, s.Done, s.Total, s.Created, s.AlreadyBilled, s.Declined, s.Processing, s.Pending, s.Invalid,
		now.Sub(p.start).Round(100*time.Millisecond))
}
