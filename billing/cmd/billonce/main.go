// Command billonce is the operators' tool for billonce: it migrates the
// tables billonce owns, runs a period's billing, shows what is pending and
// why, finishes a stopped run, re-bills or refunds one customer, settles a claim that
// Stripe's search could not, and exports a period for accounting; it bills
// by charge or by invoice, and reports usage to Stripe's meters.
//
//	go install github.com/billonce/billonce/billing/cmd/billonce@latest
//
//	billonce migrate [-dry-run]
//	billonce run -period P [-customers FILE | -amount N -currency C] [-account A] [-invoice [-days-until-due N]] [-json]
//	billonce usage -file FILE [-account A] [-json]
//	billonce status -period P [-account A] [-customers FILE] [-json]
//	billonce inspect (-key K | -customer C -period P [-account A] | -account A -period P) [-json]
//	billonce reconcile [-json] [-customers FILE]
//	billonce rebill -customer C -period P -attempt N [-amount N -currency C] [-account A] [-yes]
//	billonce refund -customer C -period P -id ID -amount N [-yes]
//	billonce transfer -account A -period P -amount N -currency C [-attempt N] [-yes]
//	billonce payout -account A -period P -amount N -currency C [-attempt N] [-yes]
//	billonce resolve -key K -payment (pi_…|ch_…|none)
//	billonce export -period P [-account A] [-format csv|json]
//
// -account A is a connected account (acct_…): run, usage and rebill bill
// on it (the Stripe-Account header), and status, inspect and export show
// only the claims on it and the transfers to it. A period's refunds and
// credit notes, transfers and payouts are shown with it by status,
// inspect and export, each claim with its kind and account.
//
// Every subcommand works on the database named by -database-url or
// DATABASE_URL; there is no default, and no throwaway database. Those that
// call Stripe (run, usage, reconcile, rebill, refund, transfer, payout, resolve) take the secret key from
// STRIPE_SECRET_KEY (never from a flag, so that it stays out of process
// listings and shell history) and Stripe's URL from -stripe-url or
// STRIPE_URL (defaults to https://api.stripe.com); run -vault-proxy-url
// instead bills through a spendcap-proxy with a vault key it has the proxy
// issue for the run (capped at what it has left to bill, plus a margin)
// and revokes at its end, the admin token from SPENDCAP_ADMIN_TOKEN. The
// claim table is billonce_claims in the connection's search_path, and the
// scope of every key is -scope (default "billonce"): both must be those of
// the services that bill through the library.
//
// Every flag and input file is checked, with the library's own checks,
// before anything is opened: a setting that cannot work exits 2 with
// nothing connected to and no vault key issued. Every call the command
// makes itself to another machine has a bound, named in the error it ends
// with: -db-timeout for the database, -vault-timeout for the spend-cap
// proxy's admin API, resolve's -stripe-timeout for its reads from Stripe
// (30s each). What the library sends during a run, a usage report or a
// reconciliation has the library's bounds (billing.Config.Retry for
// Stripe). -h names the environment variables a command
// reads, never their values.
//
// # Exit status
//
// Every billonce program exits with one of these:
//
//	0  success: every customer billed, or the command did what was asked
//	1  stopped: an answer that stops runs (billing.StopsRun: a refused key,
//	   a refused request, a spend cap), or another error that ended the
//	   command early (database unreachable, interrupted)
//	2  usage: bad flags or input, or a request refused before anything
//	   changed (rebill without -yes, resolve that cannot be verified)
//	3  lock held elsewhere: another runner is billing the period; nothing
//	   was done here
//	4  finished with customers not billed: declined, pending or invalid
//	   ones are listed; run again or look at them with status
//
// -h and --help print help on standard output and exit 0, for the command
// and each subcommand.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"strings"
	"syscall"

	"github.com/billonce/billonce/billing"
)

// Exit statuses; see the package documentation.
const (
	exitOK         = 0
	exitStopped    = 1
	exitUsage      = 2
	exitLockHeld   = 3
	exitIncomplete = 4
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// app is what every subcommand gets: its streams and the environment.
type app struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
}

// A command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, a *app, args []string) error
}

var commands map[string]command

func init() {
	commands = map[string]command{
		"migrate":   {"create or update every table billonce owns", cmdMigrate},
		"run":       {"bill a period's customers, under the period's lock", cmdRun},
		"status":    {"a period's claims by state: pending, unsettled, failed", cmdStatus},
		"inspect":   {"one claim (by key, or a customer's for a period) and its events", cmdInspect},
		"reconcile": {"settle the claims runners left pending, under the lock", cmdReconcile},
		"rebill":    {"bill one customer again under a new attempt (needs -yes)", cmdRebill},
		"refund":    {"refund a customer's payment for a period, once per refund id (needs -yes)", cmdRefund},
		"transfer":  {"transfer to a connected account for a period, once per attempt (needs -yes)", cmdTransfer},
		"payout":    {"pay a connected account's balance out for a period, once per attempt (needs -yes)", cmdPayout},
		"resolve":   {"settle a pending claim with a payment a person verified", cmdResolve},
		"export":    {"a period's claims as CSV or JSON, for accounting", cmdExport},
		"usage":     {"report a file of usage to Stripe's meters, each row once, under the lock", cmdUsage},
	}
}

func usage(w io.Writer) {
	fmt.Fprint(w, `billonce: the operators' tool for billonce.

Usage: billonce <command> [flags]   (billonce <command> -h for its flags)

Commands:
`)
	names := make([]string, 0, len(commands))
	for n := range commands {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-10s %s\n", n, commands[n].summary)
	}
	fmt.Fprint(w, `
Environment: DATABASE_URL (or -database-url), STRIPE_SECRET_KEY, STRIPE_URL (or -stripe-url),
SPENDCAP_ADMIN_TOKEN (run -vault-proxy-url).

Exit status: 0 success; 1 stopped (an answer that stops runs, or another error);
2 usage error or refused request; 3 lock held elsewhere; 4 customers not billed.
`)
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{stdin: stdin, stdout: stdout, stderr: stderr, getenv: os.Getenv}
	if len(args) == 0 {
		usage(stderr)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		usage(stdout)
		return exitOK
	}
	c, ok := commands[args[0]]
	if !ok {
		fmt.Fprintf(stderr, "billonce: unknown command %q\n\n", args[0])
		usage(stderr)
		return exitUsage
	}
	err := c.run(ctx, a, args[1:])
	code := exitCode(err)
	if err != nil && !errors.Is(err, flag.ErrHelp) && !errors.Is(err, errReported) {
		fmt.Fprintf(stderr, "billonce %s: %v\n", args[0], err)
	}
	return code
}

// errReported is returned by a command that printed its outcome itself and
// only needs the exit status of exitError's code.
var errReported = errors.New("reported")

// exitError carries an exit status other than the one exitCode would
// choose.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

// usageError is bad flags or input, or a request refused before anything
// changed.
func usageError(format string, args ...any) error {
	return &exitError{code: exitUsage, err: fmt.Errorf(format, args...)}
}

// errIncomplete is returned when a command finished with customers not
// billed; it has printed them.
var errIncomplete = &exitError{code: exitIncomplete, err: errReported}

func exitCode(err error) int {
	var ee *exitError
	switch {
	case err == nil, errors.Is(err, flag.ErrHelp):
		return exitOK
	case errors.As(err, &ee):
		return ee.code
	case errors.Is(err, billing.ErrRunHeldElsewhere):
		return exitLockHeld
	}
	return exitStopped
}

// flags is a subcommand's flag set. Parse prints help on standard output
// for -h, and errors on standard error.
type flags struct {
	*flag.FlagSet
	a   *app
	buf bytes.Buffer
}

func newFlags(a *app, name, synopsis string) *flags {
	f := &flags{FlagSet: flag.NewFlagSet(name, flag.ContinueOnError), a: a}
	f.SetOutput(&f.buf)
	f.Usage = func() {
		fmt.Fprintf(&f.buf, "Usage: billonce %s\n\n", synopsis)
		f.PrintDefaults()
	}
	return f
}

// parse parses args; an error it returns is flag.ErrHelp or a usage error.
func (f *flags) parse(args []string) error {
	err := f.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		f.a.stdout.Write(f.buf.Bytes())
		return err
	case err != nil:
		f.a.stderr.Write(f.buf.Bytes())
		return &exitError{code: exitUsage, err: errReported}
	case f.NArg() > 0:
		return usageError("unexpected argument %q: every setting is a flag (see -h)", f.Arg(0))
	}
	return nil
}

// set reports whether the flag name was given.
func (f *flags) set(name string) bool {
	found := false
	f.Visit(func(fl *flag.Flag) { found = found || fl.Name == name })
	return found
}

// required returns a usage error naming the first empty flag of pairs
// (name, value).
func required(pairs ...string) error {
	var missing []string
	for i := 0; i+1 < len(pairs); i += 2 {
		if pairs[i+1] == "" {
			missing = append(missing, "-"+pairs[i])
		}
	}
	if missing != nil {
		return usageError("%s required", strings.Join(missing, ", "))
	}
	return nil
}
