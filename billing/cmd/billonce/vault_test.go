package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
	"github.com/billonce/billonce/internal/pgtest"
)

const (
	proxySecret = "sk_test_held_by_the_spendcap_proxy_9f8e7d6c"
	adminToken  = "admin_token_of_the_vault_key_test_5a4b3c"
)

// startSpendcapProxy builds and starts the spendcap-proxy command on its
// own database, in front of upstream, and returns its URL and what it
// printed so far (complete once the test has ended it).
func startSpendcapProxy(t *testing.T, upstream string) (string, func() string) {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "spendcap-proxy")
	build := exec.Command("go", "build", "-o", bin, "github.com/billonce/billonce/billing/spendcap/cmd/spendcap-proxy")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("building spendcap-proxy: %v\n%s", err, out)
	}
	cmd := exec.Command(bin, "-upstream", upstream, "-database-url", pgtest.URL(t))
	cmd.Env = append(os.Environ(), "STRIPE_SECRET_KEY="+proxySecret, "SPENDCAP_ADMIN_TOKEN="+adminToken)
	var mu sync.Mutex
	var printed bytes.Buffer
	cmd.Stderr = &lockedWriter{mu: &mu, w: &printed}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(stdout)
	var base string
	for base == "" && lines.Scan() {
		mu.Lock()
		printed.WriteString(lines.Text() + "\n")
		mu.Unlock()
		if rest, ok := strings.CutPrefix(lines.Text(), "spend-cap proxy on "); ok {
			base, _, _ = strings.Cut(rest, " ")
		}
	}
	if base == "" {
		cmd.Wait()
		t.Fatalf("spendcap-proxy did not start:\n%s", printed.String())
	}
	done := make(chan struct{})
	go func() {
		for lines.Scan() {
			mu.Lock()
			printed.WriteString(lines.Text() + "\n")
			mu.Unlock()
		}
		close(done)
	}()
	stop := sync.OnceFunc(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		<-done
		cmd.Wait()
	})
	t.Cleanup(stop)
	return base, func() string {
		stop()
		mu.Lock()
		defer mu.Unlock()
		return printed.String()
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A run with -vault-proxy-url mints a vault key capped at its total plus
// 5%, bills through the proxy with it, and revokes it at the end; the key
// cannot spend past its cap; no secret is printed.
func TestRunWithVaultKeyFromTheProxy(t *testing.T) {
	e := newEnv(t, billingtest.Config{APIKeys: []string{proxySecret}})
	fake := e.fake
	proxyURL, proxyPrinted := startSpendcapProxy(t, fake.URL)

	// The test reaches the proxy's admin API through a reverse proxy that
	// keeps the issued vault keys, so that it can try them after the run.
	target, _ := url.Parse(proxyURL)
	var mu sync.Mutex
	var issued []string
	rp := httputil.NewSingleHostReverseProxy(target)
	rp.ModifyResponse = func(resp *http.Response) error {
		if resp.Request.Method != http.MethodPost || resp.Request.URL.Path != "/admin/keys" {
			return nil
		}
		b, err := io.ReadAll(resp.Body)
		resp.Body = io.NopCloser(bytes.NewReader(b))
		var ans struct {
			VaultKey string `json:"vault_key"`
		}
		json.Unmarshal(b, &ans)
		mu.Lock()
		issued = append(issued, ans.VaultKey)
		mu.Unlock()
		return err
	}
	watched := httptest.NewServer(rp)
	t.Cleanup(watched.Close)

	e.fake = nil // no Stripe key nor Stripe URL in billonce's environment: the proxy holds them
	e.extra = []string{"SPENDCAP_ADMIN_TOKEN=" + adminToken}
	file := customersFile(t, "cus_a,1000,usd\ncus_b,2000,usd\ncus_c,3000,eur\n")
	r := e.billonce("", "run", "-period", period, "-customers", file, "-vault-proxy-url", watched.URL, "-credential", "acct_test/billing-key").want(t, exitOK)
	// 6000 × 1.05 = 6300.
	if !strings.Contains(r.stderr, "cap 6300 ") || !strings.Contains(r.stderr, "vault key revoked") {
		t.Errorf("want the cap 6300 and the revocation on standard error:\n%s", r.stderr)
	}
	for _, c := range []string{"cus_a", "cus_b", "cus_c"} {
		billingtest.RequireChargedOnce(t, fake, c, period)
	}
	if len(issued) != 1 || issued[0] == "" {
		t.Fatalf("the run issued %d vault keys, want 1", len(issued))
	}
	vk := issued[0]

	// The key is revoked: a request with it is refused by the proxy.
	hc, err := spendcap.Client(proxyURL, vk, nil)
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("POST", "http://stripe.invalid/v1/charges",
		strings.NewReader(url.Values{"amount": {"100"}, "currency": {"usd"}, "customer": {"cus_late"}}.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Idempotency-Key", "after-the-run")
	if _, err := hc.Do(req); !errors.Is(err, spendcap.ErrVaultKeyRevoked) {
		t.Errorf("a request with the run's key after the run: %v; want %v", err, spendcap.ErrVaultKeyRevoked)
	}

	// A key minted for prices that then rise cannot spend past its cap:
	// cap from three customers at 1000, billed at 1500.
	items := []billing.Item{
		{Customer: "cus_x", Price: &billing.Price{Amount: 1000, Currency: "usd"}},
		{Customer: "cus_y", Price: &billing.Price{Amount: 1000, Currency: "usd"}},
		{Customer: "cus_z", Price: &billing.Price{Amount: 1000, Currency: "usd"}},
	}
	capAmount, err := runCap(items, defaultVaultMargin)
	if err != nil || capAmount != 3150 {
		t.Fatalf("runCap: %d, %v; want 3150", capAmount, err)
	}
	ctx := context.Background()
	admin, err := spendcap.Client(proxyURL, adminToken, nil)
	if err != nil {
		t.Fatal(err)
	}
	vk2, revoke, err := spendcap.IssueRunKey(ctx, admin, spendcap.Key{CapAmount: capAmount, AllowedEndpoints: endpoints(billing.Charges), ExpiresAt: time.Now().Add(time.Hour)}, "raised prices")
	if err != nil {
		t.Fatal(err)
	}
	defer revoke(ctx)
	through, err := spendcap.Client(proxyURL, vk2, nil)
	if err != nil {
		t.Fatal(err)
	}
	claims, err := claim.NewPostgres(e.pool, claim.Config{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := billing.New(billing.Config{SecretKey: vk2, Credential: "acct_test/billing-key", StripeURL: proxyURL, HTTPClient: through, Claims: claims, RateLimit: -1})
	if err != nil {
		t.Fatal(err)
	}
	const raised = "2026-10"
	for _, it := range items {
		it.Price.Amount = 1500
	}
	_, runErr := b.Run(ctx, raised, func(yield func(billing.Item, error) bool) {
		for _, it := range items {
			if !yield(it, nil) {
				return
			}
		}
	}, &billing.RunOptions{Concurrency: 1})
	if !errors.Is(runErr, spendcap.ErrSpendCapReached) {
		t.Errorf("billing 3 × 1500 with a cap of 3150: %v; want %v", runErr, spendcap.ErrSpendCapReached)
	}
	var moved int64
	for _, p := range fake.Payments() {
		if p.Period == raised {
			moved += p.Amount
		}
	}
	if moved != 3000 {
		t.Errorf("%d moved at the fake Stripe for %s; want 3000 (two charges of 1500 under the cap of 3150)", moved, raised)
	}
	if err := revoke(ctx); err != nil {
		t.Errorf("revoke: %v", err)
	}

	// No secret anywhere: billonce's output, the proxy's, the errors.
	printed := r.stdout + r.stderr + proxyPrinted() + errString(runErr)
	for name, s := range map[string]string{"Stripe key": proxySecret, "admin token": adminToken, "vault key": vk, "second vault key": vk2} {
		if strings.Contains(printed, s) {
			t.Errorf("the %s was printed:\n%s", name, printed)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// A run that resumes a period caps its vault key at what is still to
// bill: the customers of the file without a claim or with a pending one
// (which may still be charged), not those already billed or declined. A
// run with nothing left gets the smallest cap.
func TestResumedRunCapsItsVaultKeyAtWhatIsLeftToBill(t *testing.T) {
	e := newEnv(t, billingtest.Config{APIKeys: []string{proxySecret}, Declines: map[string]string{"cus_d": "expired_card"}})
	fake := e.fake
	proxyURL, _ := startSpendcapProxy(t, fake.URL)
	e.fake = nil
	e.extra = []string{"SPENDCAP_ADMIN_TOKEN=" + adminToken}
	vault := []string{"-vault-proxy-url", proxyURL, "-credential", "acct_test/billing-key"}
	run := func(rows string, code int) string {
		t.Helper()
		return e.billonce("", append([]string{"run", "-period", period, "-customers", customersFile(t, rows)}, vault...)...).want(t, code).stderr
	}

	if out := run("cus_a,1000,usd\ncus_d,4000,usd\n", exitIncomplete); !strings.Contains(out, "cap 5250 ") {
		t.Errorf("first run: want the cap 5250 (5000 × 1.05):\n%s", out)
	}
	e.pendingClaim("cus_p", 300, "cus_a") // a runner died after claiming it
	all := "cus_a,1000,usd\ncus_d,4000,usd\ncus_b,2000,usd\ncus_c,3000,usd\ncus_p,300,usd\n"
	if out := run(all, exitIncomplete); !strings.Contains(out, "cap 5565 ") {
		t.Errorf("resumed run: want the cap 5565 ((2000 + 3000 + 300) × 1.05), not counting cus_a (billed) nor cus_d (declined):\n%s", out)
	}
	if out := run(all, exitIncomplete); !strings.Contains(out, "cap 1 ") {
		t.Errorf("a run with nothing left to bill: want the smallest cap, 1:\n%s", out)
	}
	for _, c := range []string{"cus_a", "cus_b", "cus_c", "cus_p"} {
		billingtest.RequireChargedOnce(t, fake, c, period)
	}
	billingtest.RequireNotCharged(t, fake, "cus_d", period)
}
