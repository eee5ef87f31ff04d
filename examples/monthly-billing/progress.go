package main

import (
	"cmp"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/billonce/billonce/billing"
)

// isTerminal reports whether w is a character device (a terminal), using
// nothing but the file mode.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// progress draws a run's progress: a bar redrawn in place on a terminal, or
// a plain line at every tenth of the way otherwise. Billing calls it from
// one goroutine at a time.
type progress struct {
	w        io.Writer
	bar      bool
	label    string
	start    time.Time
	lastDraw time.Time
	lastStep int
	unit     string // what is created: charges (the default), invoices, events
}

func newProgress(w io.Writer, label, unit string) *progress {
	return &progress{w: w, bar: isTerminal(w), label: label, unit: unit, start: time.Now()}
}

func (p *progress) update(s billing.Progress) {
	now := time.Now()
	if p.bar {
		if s.Done != s.Total && now.Sub(p.lastDraw) < 100*time.Millisecond {
			return
		}
		p.lastDraw = now
		const width = 30
		filled := 0
		if s.Total > 0 {
			filled = min(width, width*s.Done/s.Total)
		}
		fmt.Fprintf(p.w, "\r%s [%s%s] %s", p.label, strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.counts(s, now))
		if s.Done == s.Total {
			fmt.Fprintln(p.w)
		}
		return
	}
	if s.Total == 0 {
		return
	}
	step := 10 * s.Done / s.Total
	if step > p.lastStep || (s.Done == s.Total && p.lastStep < 10) {
		p.lastStep = step
		fmt.Fprintf(p.w, "%s %s\n", p.label, p.counts(s, now))
	}
}

func (p *progress) counts(s billing.Progress, now time.Time) string {
	pct := 0
	if s.Total > 0 {
		pct = 100 * s.Done / s.Total
	}
	rate := float64(s.Created) / max(now.Sub(p.start).Seconds(), 1e-3)
	bank := ""
	if s.Processing+s.DeclinedAfterProcessing > 0 {
		bank = fmt.Sprintf(", processing %d, failed after settlement %d", s.Processing, s.DeclinedAfterProcessing)
	}
	return fmt.Sprintf("%3d%% %d/%d  created %d, already billed %d, declined %d%s, pending %d, invalid %d  %.0f %s/s",
		pct, s.Done, s.Total, s.Created, s.AlreadyBilled, s.Declined, bank, s.Pending, s.Invalid, rate, cmp.Or(p.unit, "charges"))
}
