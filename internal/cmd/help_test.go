// Package cmd_test checks what every program of the module has in common.
package cmd_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// secretEnv are the secrets billonce's programs read from their
// environment, set to values the test can look for.
var secretEnv = map[string]string{
	"DATABASE_URL":          "postgres://billing:pw_secret_9f3c1a@127.0.0.1:1/billing",
	"BILLONCE_DATABASE_URL": "postgres://billing:pw_secret_7b2e4d@127.0.0.1:1/billing",
	"STRIPE_SECRET_KEY":     "sk_test_secret_5d8a2c7e",
	"STRIPE_WEBHOOK_SECRET": "whsec_secret_3e6b9f1d",
	"SPENDCAP_ADMIN_TOKEN":  "admin_token_secret_8c4f2a6e",
	"VAULT_KEY":             "vault_secret_1a7d3b9c",
}

// Every program's -h says which environment variables it reads, never
// what they hold: a help text lands in terminals, CI logs and tickets.
func TestNoProgramPrintsASecretOfItsEnvironmentInItsHelp(t *testing.T) {
	t.Parallel()
	list, err := exec.Command("go", "list", "-f", `{{if eq .Name "main"}}{{.ImportPath}}{{end}}`, "github.com/billonce/billonce/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	pkgs := strings.Fields(string(list))
	if len(pkgs) < 5 {
		t.Fatalf("go list found %d programs: %v", len(pkgs), pkgs)
	}
	dir := t.TempDir()
	// Without symbols and debug information: the programs only print
	// their help, and linking a dozen of them is most of the test's time.
	build := exec.Command("go", append([]string{"build", "-ldflags=-s -w", "-o", dir + string(filepath.Separator)}, pkgs...)...)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building the programs: %v\n%s", err, out)
	}
	env := os.Environ()
	for k, v := range secretEnv {
		env = append(env, k+"="+v)
	}
	for _, pkg := range pkgs {
		name := pkg[strings.LastIndexByte(pkg, '/')+1:]
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), filepath.Join(dir, name), "-h")
			cmd.Env = env
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			cmd.Run() // the exit status of -h is each program's own test's
			for k, v := range secretEnv {
				if strings.Contains(out.String(), v) {
					t.Errorf("%s -h prints $%s:\n%s", name, k, out.String())
				}
			}
		})
	}
}
