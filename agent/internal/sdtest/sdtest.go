// Package sdtest runs a real systemd user manager for tests (docs/design.md,
// "Testing on a real systemd").
//
// A test package opts in with
//
//	func TestMain(m *testing.M) { sdtest.Main(m) }
//
// Main re-executes the test binary under `unshare -m --propagation private`
// (so mounts stay private to that one binary), mounts a tmpfs on /run/systemd
// with /run/systemd/system in it (systemctl then believes systemd is booted)
// and the host's user generators masked (see maskGenerators),
// points XDG_RUNTIME_DIR, XDG_CONFIG_HOME, XDG_DATA_HOME and XDG_STATE_HOME at
// fresh temporary directories, moves itself into a cgroup of its own and
// starts /lib/systemd/systemd --user there, waits for $XDG_RUNTIME_DIR/bus and
// exports DBUS_SESSION_BUS_ADDRESS. Child processes of the tests (the test
// binary run again as a helper) inherit the namespace and the environment
// and use the same manager. The manager is stopped, its processes
// killed and everything removed when the tests end.
//
// Several test binaries may do this at once (`go test ./...` runs packages in
// parallel): each has its own mount namespace, directories and cgroup.
//
// When the machine can't do it (not root, no unshare, no systemd) the tests
// that call Require are skipped — or fail when CI=true, so CI never passes by
// skipping.
//
// Imported by the tests of agent, agent/apply and agent/e2e.
package sdtest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// SystemdPath is the systemd binary started as the user manager.
const SystemdPath = "/lib/systemd/systemd"

const (
	envInside = "DROVER_SDTEST_INSIDE" // set in the re-executed test binary
	envSkip   = "DROVER_SDTEST_SKIP"   // why no manager runs
	envShared = "DROVER_SDTEST_ENV"    // JSON Env of a running manager, for child processes
)

var (
	unavailable string // why no manager runs ("" = one runs)
	env         Env
)

// Env describes the running user manager.
type Env struct {
	RuntimeDir string // $XDG_RUNTIME_DIR (0700)
	ConfigHome string // $XDG_CONFIG_HOME
	DataHome   string // $XDG_DATA_HOME (timer stamps live in DataHome/systemd/timers)
	StateHome  string // $XDG_STATE_HOME
	BusAddress string // $DBUS_SESSION_BUS_ADDRESS
	PID        int    // the manager's pid
}

// UnitDir is where user units are written: $XDG_CONFIG_HOME/systemd/user.
func (e Env) UnitDir() string { return filepath.Join(e.ConfigHome, "systemd", "user") }

// StampDir is where the manager keeps Persistent= timer stamps.
func (e Env) StampDir() string { return filepath.Join(e.DataHome, "systemd", "timers") }

// Main runs the tests of m against a private systemd user manager and exits.
func Main(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	if os.Getenv(envInside) == "" {
		if why := prerequisites(); why != "" {
			unavailable = why
			return m.Run()
		}
		if err := reexec(); err != nil {
			unavailable = "re-exec under unshare: " + err.Error()
		}
		return m.Run()
	}
	if why := os.Getenv(envSkip); why != "" {
		unavailable = why
		return m.Run()
	}
	if shared := os.Getenv(envShared); shared != "" {
		// A child process of a test (the test binary run again as a
		// helper): it uses its parent's manager and namespace.
		if err := json.Unmarshal([]byte(shared), &env); err != nil {
			unavailable = "bad " + envShared + ": " + err.Error()
		}
		return m.Run()
	}
	stop, err := start()
	if err != nil {
		unavailable = "start user manager: " + err.Error()
		return m.Run()
	}
	code := m.Run()
	stop()
	return code
}

func prerequisites() string {
	if os.Geteuid() != 0 {
		return "not root"
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		return "no unshare(1)"
	}
	if _, err := os.Stat(SystemdPath); err != nil {
		return "no " + SystemdPath
	}
	if _, err := exec.LookPath("systemctl"); err != nil {
		return "no systemctl"
	}
	return ""
}

// reexec replaces the process with itself under unshare(1), which keeps the
// pid, so `go test` and its pipes see no difference. It returns only on error.
func reexec() error {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	args := append([]string{unshare, "-m", "--propagation", "private", self}, os.Args[1:]...)
	return syscall.Exec(unshare, args, append(os.Environ(), envInside+"=1"))
}

// Available reports why no user manager runs, or nil.
func Available() error {
	if unavailable != "" {
		return errors.New(unavailable)
	}
	return nil
}

// Current returns the running manager's environment. Call Require first.
func Current() Env { return env }

// Require skips t when no user manager runs — or fails it when CI=true — and
// returns the manager's environment otherwise.
func Require(t testing.TB) Env {
	t.Helper()
	why := unavailable
	if why == "" && env.BusAddress == "" {
		why = "sdtest.Main was not called from TestMain"
	}
	if why != "" {
		testkit.Unavailable(t, "systemd user manager unavailable: %s", why)
	}
	return env
}

// start brings up the manager. The process is already in a private mount
// namespace.
func start() (stop func(), err error) {
	if err := os.MkdirAll("/run/systemd", 0o755); err != nil {
		return nil, err
	}
	if err := syscall.Mount("tmpfs", "/run/systemd", "tmpfs", syscall.MS_NOSUID|syscall.MS_NODEV, "mode=0755"); err != nil {
		return nil, fmt.Errorf("mount tmpfs on /run/systemd: %w", err)
	}
	unmount := func() { _ = syscall.Unmount("/run/systemd", syscall.MNT_DETACH) }
	if err := os.Mkdir("/run/systemd/system", 0o755); err != nil {
		unmount()
		return nil, err
	}
	if err := maskGenerators(); err != nil {
		unmount()
		return nil, err
	}
	e, stopManager, err := startManager(fmt.Sprintf("drover-sdtest-%d", os.Getpid()))
	if err != nil {
		unmount()
		return nil, err
	}
	for _, kv := range e.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	env = e
	if b, err := json.Marshal(e); err == nil {
		os.Setenv(envShared, string(b))
	}
	return func() { stopManager(); unmount() }, nil
}

var managers atomic.Int32

// NewManager starts another user manager, private to the calling test and
// stopped when it ends, for tests that must not share the main one (their
// applies would remove each other's units). Its variables are not exported
// to the process: use the Env's methods, and Environ for child processes.
func NewManager(t testing.TB) Env {
	t.Helper()
	Require(t)
	e, stop, err := startManager(fmt.Sprintf("drover-sdtest-%d-%d", os.Getpid(), managers.Add(1)))
	if err != nil {
		t.Fatalf("start another user manager: %v", err)
	}
	t.Cleanup(stop)
	return e
}

// Environ returns the variables that point systemctl, go-systemd and
// systemd's XDG paths at this manager, as KEY=value.
func (e Env) Environ() []string {
	return []string{
		"XDG_RUNTIME_DIR=" + e.RuntimeDir, "XDG_CONFIG_HOME=" + e.ConfigHome,
		"XDG_DATA_HOME=" + e.DataHome, "XDG_STATE_HOME=" + e.StateHome,
		"DBUS_SESSION_BUS_ADDRESS=" + e.BusAddress,
	}
}

// startManager starts systemd --user in a cgroup called name, with fresh XDG
// directories. The process is already in the private mount namespace.
func startManager(name string) (e Env, stop func(), err error) {
	var cleanups []func()
	stop = func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()

	base, err := os.MkdirTemp("", "sdtest-")
	if err != nil {
		return e, nil, err
	}
	cleanups = append(cleanups, func() { _ = os.RemoveAll(base) })
	e = Env{
		RuntimeDir: filepath.Join(base, "run"),
		ConfigHome: filepath.Join(base, "config"),
		DataHome:   filepath.Join(base, "data"),
		StateHome:  filepath.Join(base, "state"),
	}
	for _, d := range []string{e.RuntimeDir, e.ConfigHome, e.DataHome, e.StateHome} {
		if err := os.Mkdir(d, 0o700); err != nil {
			return e, nil, err
		}
	}
	if err := os.MkdirAll(e.UnitDir(), 0o755); err != nil {
		return e, nil, err
	}
	bus := filepath.Join(e.RuntimeDir, "bus")
	e.BusAddress = "unix:path=" + bus

	cg, err := newCgroups(name)
	if err != nil {
		return e, nil, err
	}
	cleanups = append(cleanups, cg.remove)

	logf, err := os.Create(filepath.Join(base, "systemd.log"))
	if err != nil {
		return e, nil, err
	}
	cleanups = append(cleanups, func() { logf.Close() })
	// The shell joins the cgroups, then becomes the manager: systemd takes
	// its own cgroup minus "/init.scope" as its root.
	var script strings.Builder
	for _, p := range cg.procsFiles() {
		fmt.Fprintf(&script, "echo $$ > %s || exit 97; ", p)
	}
	script.WriteString("exec " + SystemdPath + " --user")
	cmd := exec.Command("/bin/sh", "-c", script.String())
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.Env = append(os.Environ(), e.Environ()...)
	// A test binary killed before its cleanup (a -timeout, ^C) must not
	// leave a manager behind: it gets SIGTERM when we die.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
	if err := cmd.Start(); err != nil {
		return e, nil, err
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	cleanups = append(cleanups, func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		cg.killAll()
	})
	e.PID = cmd.Process.Pid

	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, err := os.Stat(bus); err == nil {
			break
		}
		select {
		case <-exited:
			log, _ := os.ReadFile(logf.Name())
			return e, nil, fmt.Errorf("systemd --user exited: %s", bytes.TrimSpace(log))
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return e, nil, errors.New("timed out waiting for " + bus)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := exec.CommandContext(ctx, "systemctl", "--user", "is-system-running", "--wait")
	c.Env = append(os.Environ(), e.Environ()...)
	out, err := c.CombinedOutput()
	if s := strings.TrimSpace(string(out)); err != nil && s != "degraded" {
		return e, nil, fmt.Errorf("systemctl --user is-system-running: %s: %v", s, err)
	}
	return e, stop, nil
}

// maskGenerators disables the host's user generators and environment
// generators for this manager only (links to /dev/null in the private
// /run/systemd, which comes first in their search path): they run at every
// daemon-reload and cost about a second here (gpg-agent's, xdg-autostart),
// and test units need none of them.
func maskGenerators() error {
	for _, kind := range []string{"user-generators", "user-environment-generators"} {
		dir := filepath.Join("/run/systemd", kind)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		for _, base := range []string{"/etc/systemd", "/usr/local/lib/systemd", "/usr/lib/systemd", "/lib/systemd"} {
			ents, _ := os.ReadDir(filepath.Join(base, kind))
			for _, e := range ents {
				link := filepath.Join(dir, e.Name())
				if _, err := os.Lstat(link); err == nil {
					continue
				}
				if err := os.Symlink("/dev/null", link); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// cgroups are the per-manager cgroups in each hierarchy systemd uses: the
// cgroup2 one and, on hybrid hosts, the v1 name=systemd one.
type cgroups struct{ roots []string }

func newCgroups(name string) (*cgroups, error) {
	mounts, err := cgroupMounts()
	if err != nil {
		return nil, err
	}
	if len(mounts) == 0 {
		return nil, errors.New("no cgroup2 or name=systemd hierarchy mounted")
	}
	cg := &cgroups{}
	for _, m := range mounts {
		removeStaleCgroups(m)
		root := filepath.Join(m, name)
		if err := os.MkdirAll(filepath.Join(root, "init.scope"), 0o755); err != nil {
			cg.remove()
			return nil, fmt.Errorf("create cgroup: %w", err)
		}
		cg.roots = append(cg.roots, root)
	}
	return cg, nil
}

// removeStaleCgroups removes the empty cgroups of test binaries that died
// before their cleanup (their managers got SIGTERM through Pdeathsig). It
// only removes empty directories; it kills nothing.
func removeStaleCgroups(mount string) {
	ents, _ := os.ReadDir(mount)
	for _, e := range ents {
		rest, ok := strings.CutPrefix(e.Name(), "drover-sdtest-")
		if !ok || !e.IsDir() {
			continue
		}
		pidText, _, _ := strings.Cut(rest, "-")
		pid, err := strconv.Atoi(pidText)
		if err != nil || pid <= 0 || syscall.Kill(pid, 0) == nil {
			continue // malformed, or its test binary still runs
		}
		(&cgroups{roots: []string{filepath.Join(mount, e.Name())}}).remove()
	}
}

// cgroupMounts are the mount points of the hierarchies systemd uses.
func cgroupMounts() ([]string, error) {
	ms, err := testkit.CgroupMounts()
	var out []string
	for _, m := range ms {
		if m.V2 || m.Has("name=systemd") {
			out = append(out, m.Path)
		}
	}
	return out, err
}

func (c *cgroups) procsFiles() []string {
	var out []string
	for _, r := range c.roots {
		out = append(out, filepath.Join(r, "init.scope", "cgroup.procs"))
	}
	return out
}

// killAll SIGKILLs every process left in the cgroups (units' processes).
func (c *cgroups) killAll() { testkit.KillCgroups(20*time.Millisecond, c.roots...) }

// remove deletes the cgroup trees, deepest first.
func (c *cgroups) remove() { testkit.RemoveCgroups(c.roots...) }

// Systemctl runs `systemctl --user ARGS...` against the main manager and
// returns its standard output; it fails t when the command fails.
func Systemctl(t testing.TB, args ...string) string {
	t.Helper()
	return env.Systemctl(t, args...)
}

// SystemctlErr runs `systemctl --user ARGS...`; the error carries stderr.
func SystemctlErr(args ...string) (string, error) { return env.SystemctlErr(args...) }

// Show returns one property of a unit (`systemctl --user show -P PROP UNIT`).
func Show(t testing.TB, unit, prop string) string {
	t.Helper()
	return env.Show(t, unit, prop)
}

// WaitProperty polls a unit's property until want(value) holds or timeout
// passes, and fails t then. It returns the last value.
func WaitProperty(t testing.TB, unit, prop string, timeout time.Duration, want func(string) bool) string {
	t.Helper()
	return env.WaitProperty(t, unit, prop, timeout, want)
}

// WaitState waits until the unit's ActiveState is state.
func WaitState(t testing.TB, unit, state string, timeout time.Duration) {
	t.Helper()
	env.WaitProperty(t, unit, "ActiveState", timeout, func(v string) bool { return v == state })
}

// ListTimers parses `systemctl --user list-timers --all --output=json` of
// the main manager, keyed by timer unit name.
func ListTimers(t testing.TB) map[string]Timer {
	t.Helper()
	return env.ListTimers(t)
}

// Systemctl runs `systemctl --user ARGS...` against e.
func (e Env) Systemctl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := e.SystemctlErr(args...)
	if err != nil {
		t.Fatalf("systemctl --user %s: %v", strings.Join(args, " "), err)
	}
	return out
}

// SystemctlErr runs `systemctl --user ARGS...` against e.
func (e Env) SystemctlErr(args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "systemctl", append([]string{"--user", "--no-pager"}, args...)...)
	cmd.Env = append(os.Environ(), e.Environ()...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return stdout.String(), fmt.Errorf("%w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}

// Show returns one property of a unit of e.
func (e Env) Show(t testing.TB, unit, prop string) string {
	t.Helper()
	return strings.TrimSpace(e.Systemctl(t, "show", "-P", prop, unit))
}

// WaitProperty polls a unit's property on e until want(value) holds.
func (e Env) WaitProperty(t testing.TB, unit, prop string, timeout time.Duration, want func(string) bool) string {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		v := e.Show(t, unit, prop)
		if want(v) {
			return v
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s=%q after %v", unit, prop, v, timeout)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ListTimers parses e's `systemctl --user list-timers --all --output=json`.
func (e Env) ListTimers(t testing.TB) map[string]Timer {
	t.Helper()
	out := e.Systemctl(t, "list-timers", "--all", "--output=json")
	timers, err := ParseListTimers([]byte(out))
	if err != nil {
		t.Fatalf("list-timers: %v\n%s", err, out)
	}
	return timers
}

// Timer is one row of `systemctl --user list-timers`.
type Timer struct {
	Unit      string
	Activates string
	Next      time.Time // zero when there is no next elapse
	Last      time.Time // zero when it never elapsed
}

// ParseListTimers parses the JSON form of list-timers.
func ParseListTimers(b []byte) (map[string]Timer, error) {
	var rows []struct {
		Next      *uint64 `json:"next"`
		Last      *uint64 `json:"last"`
		Unit      string  `json:"unit"`
		Activates string  `json:"activates"`
	}
	if err := json.Unmarshal(b, &rows); err != nil {
		return nil, err
	}
	usec := func(p *uint64) time.Time {
		if p == nil || *p == 0 || *p == ^uint64(0) {
			return time.Time{}
		}
		return time.UnixMicro(int64(*p))
	}
	out := make(map[string]Timer, len(rows))
	for _, r := range rows {
		out[r.Unit] = Timer{Unit: r.Unit, Activates: r.Activates, Next: usec(r.Next), Last: usec(r.Last)}
	}
	return out, nil
}
