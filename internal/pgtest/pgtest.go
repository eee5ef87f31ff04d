// Package pgtest gives tests and examples a real, throwaway PostgreSQL.
//
// A test binary starts one cluster from the local PostgreSQL binaries
// (initdb and postgres on PATH or under /usr/lib/postgresql/*/bin), in a
// temporary directory (under /dev/shm where there is one), listening on a
// free loopback port, with fsync off, when its first test asks for a
// database: a binary run as a helper
// process, or whose tests need none, starts nothing. Every test gets a
// fresh database of its own, so tables and advisory locks never leak
// between tests. The cluster is stopped and deleted when the test binary
// exits.
//
// Wire it up once per package:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and ask for a database in each test:
//
//	pool := pgtest.Pool(t)
//
// If BILLONCE_DATABASE_URL is set, no cluster is started: each test gets a
// fresh database created on that server instead (the role needs CREATEDB).
//
// Programs that are not tests (the examples) use [Start] directly.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

// EnvURL names the environment variable that points tests at an existing
// PostgreSQL server instead of a throwaway cluster.
const EnvURL = "BILLONCE_DATABASE_URL"

// ErrNoPostgres is returned by [Start] when no PostgreSQL server binaries can
// be found.
var ErrNoPostgres = errors.New("pgtest: PostgreSQL server binaries (initdb, postgres) not found on PATH or under /usr/lib/postgresql/*/bin; " +
	"install them (Debian/Ubuntu: apt-get install -y postgresql) or set " + EnvURL + " to a server where this role may CREATE DATABASE")

// A Cluster is a PostgreSQL server that hands out fresh databases: either a
// throwaway cluster started by [Start], or an existing server named by
// BILLONCE_DATABASE_URL.
type Cluster struct {
	adminURL string // connection string of the maintenance database

	// Set only for clusters this package started.
	dir     string // data directory and socket directory live under here
	binDir  string
	port    int
	cred    *syscall.Credential
	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{}
	counter atomic.Int64
}

// Start starts a throwaway cluster, or returns the server named by
// BILLONCE_DATABASE_URL when that is set. Call Stop when done.
func Start(ctx context.Context) (*Cluster, error) {
	if u := os.Getenv(EnvURL); u != "" {
		c := &Cluster{adminURL: u}
		if err := ping(ctx, u); err != nil {
			return nil, fmt.Errorf("pgtest: %s is set but the server does not answer: %w", EnvURL, err)
		}
		return c, nil
	}
	binDir, err := findBinDir()
	if err != nil {
		return nil, err
	}
	dir, err := os.MkdirTemp(clusterParent(), "billonce-pg-")
	if err != nil {
		return nil, fmt.Errorf("pgtest: %w", err)
	}
	c := &Cluster{dir: dir, binDir: binDir}
	if err := c.init(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.start(ctx); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := c.prepareTemplate(ctx); err != nil {
		c.Stop()
		return nil, err
	}
	return c, nil
}

// templateExtensions are created once in a throwaway cluster's template1,
// from which its test databases are made: the claim table's migration 6
// needs btree_gist, and creating it takes the server about 0.1 s of CPU
// per database. Its Migrate finds it there and creates nothing; tests of
// a database without it drop it first.
var templateExtensions = []string{"btree_gist"}

// prepareTemplate creates templateExtensions in template1.
func (c *Cluster) prepareTemplate(ctx context.Context) error {
	u, err := url.Parse(c.adminURL)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	u.Path = "/template1"
	conn, err := pgx.Connect(ctx, u.String())
	if err != nil {
		return fmt.Errorf("pgtest: connecting to template1: %w", err)
	}
	defer conn.Close(context.Background())
	for _, ext := range templateExtensions {
		if _, err := conn.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS "+pgx.Identifier{ext}.Sanitize()); err != nil {
			return fmt.Errorf("pgtest: creating the extension %s in template1: %w", ext, err)
		}
	}
	return nil
}

func findBinDir() (string, error) {
	if p, err := exec.LookPath("initdb"); err == nil {
		d := filepath.Dir(p)
		if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
			return d, nil
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			d = filepath.Dir(r)
			if _, err := os.Stat(filepath.Join(d, "postgres")); err == nil {
				return d, nil
			}
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	sort.Slice(dirs, func(i, j int) bool { return versionOf(dirs[i]) > versionOf(dirs[j]) })
	for _, d := range dirs {
		if _, err := os.Stat(filepath.Join(d, "initdb")); err == nil {
			return d, nil
		}
	}
	return "", ErrNoPostgres
}

func versionOf(binDir string) int {
	v, _ := strconv.Atoi(filepath.Base(filepath.Dir(binDir)))
	return v
}

func (c *Cluster) init(ctx context.Context) error {
	if os.Geteuid() == 0 {
		// initdb refuses to run as root: run the server as the postgres user.
		u, err := user.Lookup("postgres")
		if err != nil {
			return fmt.Errorf("pgtest: running as root needs a 'postgres' system user to own the cluster (it comes with the postgresql package): %w", err)
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		c.cred = &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}
		if err := os.Chown(c.dir, uid, gid); err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
	}
	cmd := c.command(ctx, "initdb", "-D", c.dataDir(), "-U", "postgres", "-A", "trust", "-E", "UTF8", "--no-sync", "--no-locale")
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("pgtest: initdb failed: %w\n%s", err, out)
	}
	return nil
}

func (c *Cluster) dataDir() string { return filepath.Join(c.dir, "data") }

func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.binDir, name), args...)
	cmd.Dir = c.dir
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: c.cred, Setpgid: true}
	return cmd
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// start launches the server process and waits until it accepts connections.
func (c *Cluster) start(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for try := 0; ; try++ {
		if c.port == 0 {
			p, err := freePort()
			if err != nil {
				return fmt.Errorf("pgtest: no free loopback port: %w", err)
			}
			c.port = p
		}
		cmd := c.command(context.Background(), "postgres",
			"-D", c.dataDir(),
			"-p", strconv.Itoa(c.port),
			"-k", c.dir,
			"-c", "listen_addresses=127.0.0.1",
			"-c", "fsync=off",
			"-c", "synchronous_commit=off",
			"-c", "full_page_writes=off",
			"-c", "max_connections=400",
			"-c", "shared_buffers=64MB",
		)
		// Stop the server if the test binary dies without cleaning up.
		cmd.SysProcAttr.Pdeathsig = syscall.SIGQUIT
		logf, err := os.Create(filepath.Join(c.dir, "postgres.log"))
		if err != nil {
			return fmt.Errorf("pgtest: %w", err)
		}
		cmd.Stdout, cmd.Stderr = logf, logf
		if err := cmd.Start(); err != nil {
			logf.Close()
			return fmt.Errorf("pgtest: starting postgres: %w", err)
		}
		exited := make(chan struct{})
		go func() { cmd.Wait(); logf.Close(); close(exited) }()
		c.cmd, c.exited = cmd, exited
		c.adminURL = fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", c.port)

		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, cancel := context.WithTimeout(ctx, time.Second)
			err := ping(pctx, c.adminURL)
			cancel()
			if err == nil {
				return nil
			}
			select {
			case <-exited:
				log, _ := os.ReadFile(filepath.Join(c.dir, "postgres.log"))
				if try < 3 && strings.Contains(string(log), "could not bind") {
					c.port = 0 // the port was taken between probe and bind
					goto retry
				}
				return fmt.Errorf("pgtest: postgres exited during start-up:\n%s", log)
			case <-ctx.Done():
				c.kill()
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
			if time.Now().After(deadline) {
				c.kill()
				return fmt.Errorf("pgtest: postgres did not accept connections within 30s: %w", err)
			}
		}
	retry:
	}
}

func (c *Cluster) kill() {
	if c.cmd != nil && c.cmd.Process != nil {
		c.cmd.Process.Signal(syscall.SIGQUIT)
		<-c.exited
	}
}

// halt stops the server process (fast shutdown) and waits for it to exit.
func (c *Cluster) halt() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cmd == nil {
		return
	}
	c.cmd.Process.Signal(syscall.SIGINT) // fast shutdown: abort sessions, checkpoint
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		c.cmd.Process.Signal(syscall.SIGKILL)
		<-c.exited
	}
	c.cmd = nil
}

// Stop stops a cluster started by [Start] and deletes its files. For a
// server named by BILLONCE_DATABASE_URL it does nothing.
func (c *Cluster) Stop() {
	if c.dir == "" {
		return
	}
	c.halt()
	os.RemoveAll(c.dir)
}

// Restart stops the server and starts it again on the same port and data,
// as an operator restarting PostgreSQL would; open connections are broken.
// down is how long the server stays stopped. It fails for a server named by
// BILLONCE_DATABASE_URL.
func (c *Cluster) Restart(ctx context.Context, down time.Duration) error {
	if c.dir == "" {
		return fmt.Errorf("pgtest: cannot restart the server named by %s", EnvURL)
	}
	c.halt()
	if down > 0 {
		select {
		case <-time.After(down):
		case <-ctx.Done():
		}
	}
	return c.start(ctx)
}

// NewDatabase creates a fresh database, with no tables, and returns its
// connection string. In a throwaway cluster it has the extensions of
// templateExtensions; on a server named by BILLONCE_DATABASE_URL it has
// none.
func (c *Cluster) NewDatabase(ctx context.Context) (string, error) {
	name := fmt.Sprintf("billonce_%d_%d", os.Getpid(), c.counter.Add(1))
	conn, err := pgx.Connect(ctx, c.adminURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	template := "template0"
	if c.dir != "" {
		template = "template1"
	}
	if _, err := conn.Exec(ctx, "CREATE DATABASE "+name+" TEMPLATE "+template+" STRATEGY FILE_COPY"); err != nil {
		return "", fmt.Errorf("pgtest: creating database %s: %w", name, err)
	}
	u, err := url.Parse(c.adminURL)
	if err != nil {
		return "", fmt.Errorf("pgtest: %w", err)
	}
	u.Path = "/" + name
	return u.String(), nil
}

// StartPool starts a throwaway cluster with [Start] and returns a pool on a
// fresh database in it, and a stop function that closes the pool and the
// cluster. It is the whole set-up of a runnable example. In a test binary
// whose TestMain runs [Main], it starts no cluster of its own: the pool is
// on a fresh database of the package's cluster, which stop drops.
func StartPool(ctx context.Context) (pool *pgxpool.Pool, stop func(), err error) {
	if !mainCalled {
		return startOwnPool(ctx)
	}
	c, err := mainServer()
	if err != nil {
		return nil, nil, err
	}
	u, err := c.NewDatabase(ctx)
	if err != nil {
		return nil, nil, err
	}
	drop := func() { _ = c.DropDatabase(context.WithoutCancel(ctx), u) }
	if pool, err = pgxpool.New(ctx, u); err != nil {
		drop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); drop() }, nil
}

// startOwnPool is StartPool outside a test binary: a cluster of its own.
func startOwnPool(ctx context.Context) (pool *pgxpool.Pool, stop func(), err error) {
	c, err := Start(ctx)
	if err != nil {
		return nil, nil, err
	}
	u, err := c.NewDatabase(ctx)
	if err == nil {
		pool, err = pgxpool.New(ctx, u)
	}
	if err != nil {
		c.Stop()
		return nil, nil, err
	}
	return pool, func() { pool.Close(); c.Stop() }, nil
}

// DropDatabase drops a database made by NewDatabase, ending its sessions.
func (c *Cluster) DropDatabase(ctx context.Context, dbURL string) error {
	u, err := url.Parse(dbURL)
	if err != nil {
		return fmt.Errorf("pgtest: %w", err)
	}
	name := strings.TrimPrefix(u.Path, "/")
	if !strings.HasPrefix(name, "billonce_") {
		return fmt.Errorf("pgtest: refusing to drop %q: not a database made by NewDatabase", name)
	}
	conn, err := pgx.Connect(ctx, c.adminURL)
	if err != nil {
		return fmt.Errorf("pgtest: connecting to the server: %w", err)
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	return err
}

func ping(ctx context.Context, u string) error {
	conn, err := pgx.Connect(ctx, u)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.Ping(ctx)
}

var (
	mainCalled  bool // set by Main before any test runs
	mainMu      sync.Mutex
	mainStarted bool
	mainCluster *Cluster
	mainErr     error
)

// mainServer starts the test binary's cluster on first use.
func mainServer() (*Cluster, error) {
	mainMu.Lock()
	defer mainMu.Unlock()
	if !mainStarted {
		mainStarted = true
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		mainCluster, mainErr = Start(ctx)
	}
	return mainCluster, mainErr
}

// Main runs the package's tests against one cluster, started when the
// first of them asks for a database, and stops it when they are done. Call
// it from TestMain:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// A start-up failure is not fatal here: it makes every test that asks for a
// database fail with the reason, so tests that need none still run.
func Main(m *testing.M) {
	mainCalled = true
	code := m.Run()
	mainMu.Lock()
	if mainCluster != nil {
		mainCluster.Stop()
	}
	mainMu.Unlock()
	os.Exit(code)
}

// Server returns the cluster the test binary runs against. It fails the
// test if there is none.
func Server(tb testing.TB) *Cluster {
	tb.Helper()
	if !mainCalled {
		tb.Fatal("pgtest: call pgtest.Main(m) from this package's TestMain before asking for a database")
	}
	c, err := mainServer()
	if err != nil {
		tb.Fatalf("%v", err)
	}
	return c
}

// URL creates a fresh database for this test and returns its connection
// string. The database is dropped when the test ends.
func URL(tb testing.TB) string {
	tb.Helper()
	c := Server(tb)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	u, err := c.NewDatabase(ctx)
	if err != nil {
		tb.Fatalf("%v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := c.DropDatabase(ctx, u); err != nil {
			tb.Logf("pgtest: dropping test database: %v", err)
		}
	})
	return u
}

// Pool returns a pool on a fresh database of this test's own. The pool is
// closed and the database dropped when the test ends.
func Pool(tb testing.TB) *pgxpool.Pool {
	tb.Helper()
	u := URL(tb)
	pool, err := pgxpool.New(context.Background(), u)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(pool.Close) // runs before the database is dropped (LIFO)
	return pool
}

// clusterParent is where throwaway clusters live: /dev/shm when it is a
// writable directory, so that the files of a cluster nobody keeps never
// reach a disk (creating a test database copies a template of some 8 MB,
// hundreds of times per package: on tmpfs the quick suite took 122 s
// wall instead of 156 s on a 2-core machine); otherwise os.TempDir.
func clusterParent() string {
	const shm = "/dev/shm"
	const writable = 2 // W_OK
	if fi, err := os.Stat(shm); err == nil && fi.IsDir() && syscall.Access(shm, writable) == nil {
		return shm
	}
	return ""
}
