package main

import (
	"bufio"
	"fmt"
	"os"
	"strings"
	"syscall"
	"testing"
	"unsafe"

	"github.com/billonce/billonce/billing/billingtest"
)

// openTerminal returns a pseudo-terminal: the side a person types on, and
// the side a process reads as its terminal.
func openTerminal(t *testing.T) (keyboard, term *os.File) {
	t.Helper()
	m, err := os.OpenFile("/dev/ptmx", os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening a pseudo-terminal: %v", err)
	}
	t.Cleanup(func() { m.Close() })
	var unlock int32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCSPTLCK, uintptr(unsafe.Pointer(&unlock))); errno != 0 {
		t.Fatalf("unlocking the pseudo-terminal: %v", errno)
	}
	var n uint32
	if _, _, errno := syscall.Syscall(syscall.SYS_IOCTL, m.Fd(), syscall.TIOCGPTN, uintptr(unsafe.Pointer(&n))); errno != 0 {
		t.Fatalf("naming the pseudo-terminal: %v", errno)
	}
	s, err := os.OpenFile(fmt.Sprintf("/dev/pts/%d", n), os.O_RDWR|syscall.O_NOCTTY, 0)
	if err != nil {
		t.Fatalf("opening the pseudo-terminal's other side: %v", err)
	}
	t.Cleanup(func() { s.Close() })
	go func() { // the terminal's echo, read so that it never fills
		buf := make([]byte, 4096)
		for {
			if _, err := m.Read(buf); err != nil {
				return
			}
		}
	}()
	return m, s
}

// run without -customers, on a terminal, says on standard error that it
// reads the customers from it and how to end them, and bills what is
// typed.
func TestRunOnATerminalSaysItWaitsForTheCustomers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, billingtest.Config{})
	keyboard, term := openTerminal(t)
	cmd := e.command("run", "-period", period, "-amount", "100", "-currency", "usd")
	cmd.Stdin = term
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stderr)
	var said []string
	for lines.Scan() {
		said = append(said, lines.Text())
		if strings.Contains(lines.Text(), "standard input") {
			break
		}
	}
	if len(said) == 0 || !strings.Contains(said[len(said)-1], "reading the customers from standard input") ||
		!strings.Contains(said[len(said)-1], "Ctrl-D") || !strings.Contains(said[len(said)-1], "-customers") {
		t.Fatalf("on a terminal, run said %q before reading; want it to say it reads the customers there, how to end them, and -customers", said)
	}
	fmt.Fprint(keyboard, "cus_a\ncus_b\n\x04")
	for lines.Scan() {
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("run: %v", err)
	}
	for _, c := range []string{"cus_a", "cus_b"} {
		billingtest.RequireChargedOnce(t, e.fake, c, period)
	}
}
