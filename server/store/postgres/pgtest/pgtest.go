// Package pgtest starts a throwaway PostgreSQL cluster for tests: Start(t)
// runs initdb and pg_ctl in a temporary directory (as the postgres user
// when the test runs as root, since PostgreSQL refuses to run as root),
// listening on 127.0.0.1 on a free port with trust authentication, and
// stops it when the test ends; NewDatabase(t) gives each test a fresh
// database. Without PostgreSQL the test is skipped, or fails under CI=true.
// Only tests import it.
package pgtest

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/jackc/pgx/v5"
)

// Cluster is one running PostgreSQL server.
type Cluster struct {
	Port int
	dir  string
	bin  string
	as   []string // the command prefix that runs a command as the cluster's owner
	n    atomic.Int64
	// durable keeps fsync and synchronous_commit on (StartDurable).
	durable bool
}

// bindir finds initdb and pg_ctl: on $PATH, else Debian's versioned
// directories.
func bindir() string {
	if p, err := exec.LookPath("initdb"); err == nil {
		if _, err := exec.LookPath("pg_ctl"); err == nil {
			return filepath.Dir(p)
		}
	}
	dirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	for i := len(dirs) - 1; i >= 0; i-- {
		if _, err := os.Stat(filepath.Join(dirs[i], "pg_ctl")); err == nil {
			return dirs[i]
		}
	}
	return ""
}

// Start starts a cluster for t and stops it when t ends. For speed it runs
// without fsync and with synchronous_commit off: a crash of the machine
// may lose what it committed, which no test causes.
func Start(t testing.TB) *Cluster {
	t.Helper()
	return start(t, false)
}

// StartDurable is Start with PostgreSQL's defaults for durability (fsync,
// synchronous_commit on): a commit is on disk when it returns, as in
// production, for benchmarks of acknowledged writes.
func StartDurable(t testing.TB) *Cluster {
	t.Helper()
	return start(t, true)
}

func start(t testing.TB, durable bool) *Cluster {
	t.Helper()
	bin := bindir()
	if bin == "" {
		testkit.Unavailable(t, "PostgreSQL is not installed (initdb and pg_ctl; Debian package postgresql)")
	}
	dir, err := os.MkdirTemp("", "pgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	c := &Cluster{dir: dir, bin: bin, durable: durable}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			testkit.Unavailable(t, "running as root and there is no postgres user to run PostgreSQL as")
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			t.Fatal(err)
		}
		c.as = []string{"runuser", "-u", "postgres", "--"}
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	c.run(t, "initdb", "-D", c.path("data"), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "--no-sync")
	for attempt := 0; ; attempt++ {
		c.Port = freePort(t)
		out, err := c.start()
		if err == nil {
			break
		}
		if attempt == 2 {
			log, _ := os.ReadFile(c.path("log"))
			t.Fatalf("pg_ctl start: %v\n%s\n%s", err, out, log)
		}
	}
	t.Cleanup(func() {
		if out, err := c.cmd("pg_ctl", "-D", c.path("data"), "-m", "immediate", "-w", "stop").CombinedOutput(); err != nil {
			t.Errorf("pg_ctl stop: %v\n%s", err, out)
		}
	})
	return c
}

func (c *Cluster) start() ([]byte, error) {
	opts := fmt.Sprintf("-k %s -h 127.0.0.1 -p %d -c max_connections=200", c.path(""), c.Port)
	if !c.durable {
		opts += " -F -c synchronous_commit=off -c full_page_writes=off"
	}
	return c.cmd("pg_ctl", "-D", c.path("data"), "-l", c.path("log"), "-o", opts, "-w", "-t", "60", "start").CombinedOutput()
}

// Stop stops the cluster (fast shutdown: every connection is closed).
func (c *Cluster) Stop(t testing.TB) {
	t.Helper()
	c.run(t, "pg_ctl", "-D", c.path("data"), "-m", "fast", "-w", "stop")
}

// StartAgain starts a stopped cluster on the same port.
func (c *Cluster) StartAgain(t testing.TB) {
	t.Helper()
	if out, err := c.start(); err != nil {
		t.Fatalf("pg_ctl start: %v\n%s", err, out)
	}
}

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

func (c *Cluster) cmd(name string, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, c.as...), filepath.Join(c.bin, name)), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = c.dir
	return cmd
}

func (c *Cluster) run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := c.cmd(name, args...).CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", name, err, out)
	}
}

func freePort(t testing.TB) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// DSN is the connection string of database db on the cluster.
func (c *Cluster) DSN(db string) string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/%s?sslmode=disable", c.Port, db)
}

// Exec runs sql on database db.
func (c *Cluster) Exec(t testing.TB, db, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.DSN(db))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, sql); err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
}

// NewDatabase creates a fresh empty database and returns its DSN.
func (c *Cluster) NewDatabase(t testing.TB) string {
	t.Helper()
	name := fmt.Sprintf("t%d_%s", c.n.Add(1), strings.ToLower(sanitize(t.Name())))
	if len(name) > 60 {
		name = name[:60]
	}
	c.Exec(t, "postgres", `CREATE DATABASE "`+name+`"`)
	return c.DSN(name)
}

func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' {
			return r
		}
		return '_'
	}, s)
}
