package pgtest

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { Main(m) }

// Two tests each get a database of their own: a table made in one is not
// visible in the other, and neither sees the other's advisory lock.
func TestDatabasesAreIsolated(t *testing.T) {
	ctx := context.Background()
	a, b := Pool(t), Pool(t)
	if a.Config().ConnConfig.Database == b.Config().ConnConfig.Database {
		t.Fatalf("both pools use database %q", a.Config().ConnConfig.Database)
	}
	if _, err := a.Exec(ctx, "CREATE TABLE only_in_a (id int)"); err != nil {
		t.Fatal(err)
	}
	var n int
	if err := b.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE tablename = 'only_in_a'").Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Fatalf("table made in one test's database is visible in another's")
	}
}

// Subtests running in parallel each see an empty database.
func TestParallelTestsGetFreshDatabases(t *testing.T) {
	for _, name := range []string{"first", "second", "third"} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			pool := Pool(t)
			var n int
			if err := pool.QueryRow(ctx, "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'").Scan(&n); err != nil {
				t.Fatal(err)
			}
			if n != 0 {
				t.Fatalf("fresh database has %d tables", n)
			}
			if _, err := pool.Exec(ctx, "CREATE TABLE t (id int)"); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// The database made for a test is dropped when the test ends.
func TestDatabaseDroppedAfterTest(t *testing.T) {
	var name string
	t.Run("inner", func(t *testing.T) {
		name = Pool(t).Config().ConnConfig.Database
	})
	conn, err := pgx.Connect(context.Background(), Server(t).adminURL)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	var exists bool
	if err := conn.QueryRow(context.Background(), "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)", name).Scan(&exists); err != nil {
		t.Fatal(err)
	}
	if exists {
		t.Fatalf("database %s still exists after its test ended", name)
	}
}

// A restarted cluster keeps its data and accepts connections again.
func TestRestartKeepsData(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip("restart needs a throwaway cluster, not " + EnvURL)
	}
	ctx := context.Background()
	u := URL(t)
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "CREATE TABLE kept (v int); INSERT INTO kept VALUES (7)"); err != nil {
		t.Fatal(err)
	}
	if err := Server(t).Restart(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if err := conn.Ping(ctx); err == nil {
		t.Fatal("a connection opened before the restart still works")
	}
	conn2, err := pgx.Connect(ctx, u)
	if err != nil {
		t.Fatal(err)
	}
	defer conn2.Close(ctx)
	var v int
	if err := conn2.QueryRow(ctx, "SELECT v FROM kept").Scan(&v); err != nil || v != 7 {
		t.Fatalf("after restart: v=%d err=%v", v, err)
	}
}

// The cluster's files and server are gone once the test binary exits. The
// test runs a child test binary that reports its cluster, then checks.
func TestClusterGoneAfterRun(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip("nothing is started when " + EnvURL + " is set")
	}
	if os.Getenv("PGTEST_CHILD") == "1" {
		c := Server(t)
		Pool(t) // the cluster is in use when the binary exits
		os.Stdout.WriteString("CLUSTER " + c.dir + " " + strings.TrimPrefix(c.adminURL, "postgres://postgres@") + "\n")
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestClusterGoneAfterRun$", "-test.v")
	cmd.Env = append(os.Environ(), "PGTEST_CHILD=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child test binary failed: %v\n%s", err, out)
	}
	var dir, addr string
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "CLUSTER" {
			dir, addr = f[1], strings.SplitN(f[2], "/", 2)[0]
		}
	}
	if dir == "" {
		t.Fatalf("child did not report its cluster:\n%s", out)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("cluster directory %s still exists (stat err=%v)", dir, err)
	}
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("a server still listens on %s after the child exited", addr)
	}
}

// Without binaries, Start says how to get them.
func TestNoPostgresMessage(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip("Start does not look for binaries when " + EnvURL + " is set")
	}
	t.Setenv("PATH", t.TempDir())
	if _, err := findBinDir(); err == nil {
		// /usr/lib/postgresql/*/bin exists on this machine; the message is
		// still checked directly below.
		t.Log("binaries found under /usr/lib/postgresql; checking the message only")
	}
	for _, want := range []string{"apt-get install -y postgresql", EnvURL} {
		if !strings.Contains(ErrNoPostgres.Error(), want) {
			t.Errorf("ErrNoPostgres does not mention %q: %v", want, ErrNoPostgres)
		}
	}
}

// Outside a test binary, StartPool hands back a working pool on its own
// cluster; stop removes it.
func TestStartPool(t *testing.T) {
	if os.Getenv(EnvURL) != "" {
		t.Skip("StartPool uses the server named by " + EnvURL)
	}
	ctx := context.Background()
	pool, stop, err := startOwnPool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var one int
	if err := pool.QueryRow(ctx, "SELECT 1").Scan(&one); err != nil || one != 1 {
		t.Fatalf("SELECT 1 = %d, %v", one, err)
	}
	addr := pool.Config().ConnConfig.Host + ":" + strconv.Itoa(int(pool.Config().ConnConfig.Port))
	stop()
	if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
		c.Close()
		t.Errorf("a server still listens on %s after stop", addr)
	}
}

// In a test binary that runs Main (a runnable example), StartPool hands
// back a pool on a fresh database of the binary's cluster; stop drops the
// database and leaves the cluster to the other tests.
func TestStartPoolInTestBinary(t *testing.T) {
	ctx := context.Background()
	pool, stop, err := StartPool(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var name string
	if err := pool.QueryRow(ctx, "SELECT current_database()").Scan(&name); err != nil {
		t.Fatal(err)
	}
	stop()
	admin := Pool(t)
	var n int
	if err := admin.QueryRow(ctx, "SELECT count(*) FROM pg_database WHERE datname = $1", name).Scan(&n); err != nil || n != 0 {
		t.Errorf("database %s: %d left after stop, %v; want dropped", name, n, err)
	}
}
