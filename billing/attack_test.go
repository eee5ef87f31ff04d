package billing_test

// Attacks that once broke the exactly-once guarantee or leaked a secret,
// kept as regression tests. The oracle is always the fake Stripe's ledger
// (Server.CountPeriod / Payments) or the text a secret could leak into,
// never billonce's own bookkeeping.

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/billonce/billonce/billing"
	"github.com/billonce/billonce/billing/billingtest"
	"github.com/billonce/billonce/billing/spendcap"
	"github.com/billonce/billonce/claim"
)

// rotatedKey is the Stripe key after a rotation.
const rotatedKey = "sk_test_rotatedKey000000000000000000000000000abcd"

// lateTransport delivers the first POST carrying key late: the request has
// left the Biller (its CheckSend passed) but reaches Stripe only when
// release is closed, as a request does that sits in a network or proxy
// queue for part of its attempt timeout.
type lateTransport struct {
	base    http.RoundTripper
	key     string
	held    chan struct{} // closed once the request is held
	release chan struct{}
	once    sync.Once
}

func newLateTransport(key string) *lateTransport {
	return &lateTransport{base: testTransport, key: key, held: make(chan struct{}), release: make(chan struct{})}
}

func (t *lateTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPost && r.Header.Get("Idempotency-Key") == t.key {
		first := false
		t.once.Do(func() { first = true })
		if first {
			close(t.held)
			<-t.release
		}
	}
	return t.base.RoundTrip(r)
}

// A double charge across a key rotation (I5 + I11), now guarded.
//
// Scenario: replica A (old Stripe key) runs a Run; cus_1's claim was made
// 22h55m ago and is resumed in A's claim batch. cus_1 waits in A's queue
// behind cus_0 for ~5 minutes (rate limits), so its 2-minute lease runs out
// before A sends it; CheckSend does not look at the lease, so A sends at
// 22h59m50s, inside the window. The request takes 20 s to reach Stripe
// (well inside the 30 s attempt timeout). Meanwhile replica B, already
// deployed with the rotated key, bills cus_1: the lease has expired, so B
// takes the claim over; the key is past its deadline and under another
// credential, so B searches, finds nothing (A's request has not landed
// yet), reopens the window and sends under the new key. A's request then
// lands under the old key, where Stripe has never seen the idempotency key.
//
// Expected: cus_1 charged exactly once. Before the fix: twice (ch from B under
// the rotated key, ch from A under the old one).
func TestAttackExpiredLeaseSendRacesRotatedTakeover(t *testing.T) {
	// With B on the same key the race holds by itself: B's reopened send
	// and A's late request carry one key in one key space, and Stripe
	// replays.
	for name, bKey := range map[string]string{"same key": secretKey, "rotated key": rotatedKey} {
		t.Run(name, func(t *testing.T) {
			e := newEnv(t)
			ctx := context.Background()
			e.crashedClaim("cus_1", amount) // claimed, never sent
			e.advance(22*time.Hour + 55*time.Minute)

			late := newLateTransport(e.key("cus_1"))
			var once sync.Once
			a := e.biller(func(c *billing.Config) {
				c.HTTPClient = &http.Client{Transport: late}
				c.Retry.AttemptTimeout = 30 * time.Second
				c.Retry.MaxAttempts = 1
				c.Observe = func(ev billing.Event) {
					if ev.Kind == billing.EventStripeCall && ev.Customer == "cus_0" {
						// cus_0 took ~5 minutes of rate-limited retries.
						once.Do(func() { e.advance(4*time.Minute + 50*time.Second) })
					}
				}
			})
			runDone := make(chan error, 1)
			go func() {
				_, err := a.Run(ctx, period, billing.Customers("cus_0", "cus_1"), &billing.RunOptions{Concurrency: 1})
				runDone <- err
			}()
			select {
			case <-late.held:
			case err := <-runDone:
				t.Fatalf("A's run ended before sending cus_1: %v", err)
			case <-time.After(10 * time.Second):
				t.Fatal("A never sent cus_1")
			}

			// A's request is on its way; 20 seconds pass.
			e.advance(20 * time.Second)
			b := e.biller(func(c *billing.Config) { c.SecretKey = bKey })
			rb, errB := b.Charge(ctx, "cus_1", period, nil)

			close(late.release) // A's request lands
			<-runDone

			if n := e.count("cus_1"); n != 1 {
				var ids []string
				for _, p := range e.srv.Payments() {
					if p.Customer == "cus_1" && p.Paid {
						ids = append(ids, p.ID)
					}
				}
				t.Fatalf("cus_1 charged %d times (%v), want 1; B's Charge = %+v, %v", n, ids, rb, errB)
			}
		})
	}
}

// Two products bill the same customer for the same period. Sharing one
// claim table, the second is refused with a *claim.MismatchError and
// nothing is sent: one live claim per customer and period, whatever the
// scope, is also what keeps a renamed scope from billing everyone again.
// With a claim table each, each product bills the customer once.
func TestProductsBillingOneCustomerUseATableEach(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	subs := e.biller(func(c *billing.Config) { c.Scope = "subscription" })
	shared := e.biller(func(c *billing.Config) { c.Scope = "overage" })
	if _, err := subs.Charge(ctx, "cus_1", period, nil); err != nil {
		t.Fatal(err)
	}
	var mm *claim.MismatchError
	if _, err := shared.Charge(ctx, "cus_1", period, nil); !errors.As(err, &mm) || e.count("cus_1") != 1 {
		t.Fatalf("product B on the shared table = %v; %d payments, want a mismatch and 1", err, e.count("cus_1"))
	}
	own, err := claim.NewPostgres(e.pool, claim.Config{Table: "overage_claims"})
	if err != nil {
		t.Fatal(err)
	}
	if err := own.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	overage := e.biller(func(c *billing.Config) { c.Scope = "overage"; c.Claims = own })
	if r, err := overage.Charge(ctx, "cus_1", period, nil); err != nil || r.Outcome != billing.Created || e.count("cus_1") != 2 {
		t.Fatalf("product B on its own table = %+v, %v; %d payments, want 2", r, err, e.count("cus_1"))
	}
	if r, err := overage.Charge(ctx, "cus_1", period, nil); err != nil || r.Outcome != billing.AlreadyBilled || e.count("cus_1") != 2 {
		t.Fatalf("product B again = %+v, %v; %d payments", r, err, e.count("cus_1"))
	}
}

// Customers once delayed ~23 h with an error (this contradicted the
// documented recovery of ErrStripeAuth).
//
// Scenario: the Stripe key has expired. A Run claims its first batch, the
// first send gets 401, the run stops with ErrStripeAuth and leaves the
// claims pending "to be resumed with the same keys once the cause is
// fixed" (errors.go). The operator fixes the cause the only way there is:
// a new key. Stripe stored nothing for any of these keys (a 401 is refused
// before execution), so sending them is safe.
//
// Expected: the next Run bills everyone once. Before the fix: every claimed
// customer gets ErrSentElsewhere and stays unbilled until 23 h after the
// claim, because the claim recorded the expired key's fingerprint although
// no request under it ever executed.
func TestAttackFixedKeyAfter401StaysUnbilled(t *testing.T) {
	e := newEnvWith(t, billingtest.Config{APIKeys: []string{rotatedKey}})
	ctx := context.Background()
	cs := customers(5)
	_, err := e.b.Run(ctx, period, billing.Customers(cs...), nil)
	if !errors.Is(err, billing.ErrStripeAuth) {
		t.Fatalf("Run with the expired key = %v, want ErrStripeAuth", err)
	}
	fixed := e.biller(func(c *billing.Config) { c.SecretKey = rotatedKey })
	sum, err := fixed.Run(ctx, period, billing.Customers(cs...), nil)
	for _, c := range cs {
		if n := e.count(c); n != 1 {
			t.Errorf("%s charged %d times after the key was fixed, want 1", c, n)
		}
	}
	if err != nil || !sum.Complete() {
		var idErr *billing.ChargeError
		if len(sum.Failures) > 0 && errors.As(sum.Failures[0], &idErr) && errors.Is(sum.Failures[0], billing.ErrSentElsewhere) {
			t.Logf("first failure: %v", sum.Failures[0])
		}
		t.Errorf("Run with the fixed key = %+v, %v; want complete", sum.Progress, err)
	}
}

// A secret leak through format verbs (I9), now guarded.
//
// Scenario: a Biller (or a VaultTransport) printed with a formatting verb
// other than v/s/q/x/X, e.g. a mistaken log.Printf("%d billers: %v", b).
// String, GoString and LogValue only cover those verbs; fmt prints the
// struct's fields for every other verb, unexported ones included.
//
// Expected: no verb shows the secret key or the vault key. Before the fix:
// %d (and %t, %o, %e, ...) print Config.SecretKey and the vault key.
func TestAttackFormatVerbsLeakSecrets(t *testing.T) {
	e := newEnv(t)
	const vaultKey = "vault_live_S3cretVaultKeyNeverPrint9876"
	vt, err := spendcap.NewTransport(spendcap.Config{ProxyURL: "https://proxy.example.com/stripe", VaultKey: vaultKey})
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimPrefix(secretKey, "sk_test_")
	secret = secret[:len(secret)-4]
	vsecret := vaultKey[:len(vaultKey)-4]
	for _, verb := range []string{"%v", "%+v", "%#v", "%s", "%q", "%x", "%d", "%t", "%o"} {
		for name, v := range map[string]any{"*Biller": e.b, "Biller": *e.b, "*VaultTransport": vt} {
			out := fmt.Sprintf(verb, v)
			if strings.Contains(out, secret) || strings.Contains(out, vsecret) {
				t.Errorf("fmt %s of %s prints a secret: %.160s…", verb, name, out)
			}
		}
	}
}
