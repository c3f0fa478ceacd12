package boottest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// Options change how a container is started.
type Options struct {
	// PrivateNetwork gives the container its own network namespace with
	// only a loopback device (systemd-nspawn --private-network): servers
	// inside bind no host ports, and the host's 127.0.0.1 is out of reach.
	PrivateNetwork bool
	// Copy makes the writable root a `cp -a` copy even where overlayfs works.
	Copy bool
	// NspawnArgs are added to the systemd-nspawn command line (e.g. --bind=).
	NspawnArgs []string
	// MemoryLimits makes MemoryMax= and friends take effect on a cgroup v1
	// host: systemd-nspawn mounts the v1 memory controller read-only in the
	// container, so its systemd cannot limit anything. The container's mount
	// is made writable (it is the container's own memory cgroup, see
	// cgroup.go) and its systemd re-executed to pick the controller up. On a
	// cgroup v2 host it changes nothing.
	MemoryLimits bool
	// BootTimeout bounds the wait for is-system-running (default 90 s).
	BootTimeout time.Duration
	// Logf receives progress lines (default: discarded).
	Logf func(format string, args ...any)
}

// Container is one booted Debian system.
type Container struct {
	Name string // machine name, also its hostname
	PID  int    // the container's PID 1 (its systemd), as a host pid
	// Overlay tells whether the root is an overlay over the cached root
	// (else a copy).
	Overlay bool
	// BootTime is from starting systemd-nspawn to is-system-running
	// answering; Prepare is the time spent making the writable root.
	BootTime, Prepare time.Duration
	// State is what is-system-running answered (running or degraded).
	State string
	// Rootfs tells whether the cached root was built for this container.
	Rootfs BuildStats

	work    string // per-container scratch: upper/work layers or the copy, console log
	console string // console output of the container
	cmd     *exec.Cmd
	exited  chan struct{}
	cg      *cgroupSet
	lock    *os.File
	stopped sync.Once
}

var seq atomic.Int64

// Boot starts a container for t and stops it when t ends. It skips t when
// the machine cannot boot one, or fails it when CI=true. When t has failed
// by the end, the container's journal and console are logged first.
func Boot(t testing.TB, o Options) *Container {
	t.Helper()
	if err := Available(); err != nil {
		unavailable(t, "%v", err)
	}
	if o.Logf == nil {
		o.Logf = t.Logf
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	c, err := Start(ctx, o)
	if err != nil {
		t.Fatalf("boot container: %v", err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			c.logDiagnostics(t)
		}
		begin := time.Now()
		if err := c.Stop(); err != nil {
			t.Errorf("stop container: %v", err)
		}
		t.Logf("boottest: %s stopped in %s", c.Name, time.Since(begin).Round(time.Millisecond))
	})
	t.Logf("boottest: %s booted in %s (root: %s, prepared in %s, state %s)",
		c.Name, c.BootTime.Round(time.Millisecond), map[bool]string{true: "overlay", false: "copy"}[c.Overlay],
		c.Prepare.Round(time.Millisecond), c.State)
	return c
}

// Start boots a container without a testing.TB (for a TestMain that shares
// one container between tests). The caller must Stop it.
func Start(ctx context.Context, o Options) (c *Container, err error) {
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	if o.BootTimeout == 0 {
		o.BootTimeout = 90 * time.Second
	}
	if err := Available(); err != nil {
		return nil, err
	}
	c = &Container{
		Name:   fmt.Sprintf("drover-bt-%d-%d", os.Getpid(), seq.Add(1)),
		exited: make(chan struct{}),
	}
	defer func() {
		if err != nil {
			if c.console != "" {
				if b, rerr := os.ReadFile(c.console); rerr == nil {
					err = fmt.Errorf("%w\nconsole:\n%s", err, tail(string(b), 4000))
				}
			}
			_ = c.Stop()
		}
	}()
	var lerr error
	c.lock, c.Rootfs, lerr = EnsureRootfs(ctx, o.Logf)
	if lerr != nil {
		return c, lerr
	}
	if c.work, err = os.MkdirTemp("", "drover-boottest-"); err != nil {
		return c, err
	}
	c.console = filepath.Join(c.work, "console.log")
	if c.cg, err = newCgroupSet(c.Name); err != nil {
		return c, err
	}

	begin := time.Now()
	merged, lower, upper, wdir, err := c.prepareRoot(ctx, o.Copy)
	if err != nil {
		return c, err
	}
	c.Prepare = time.Since(begin)

	nspawn := []string{"systemd-nspawn", "--quiet", "-D", merged, "--boot", "--register=no", "--keep-unit",
		"--machine=" + c.Name, "--link-journal=no", "--console=read-only"}
	if o.PrivateNetwork {
		nspawn = append(nspawn, "--private-network")
	}
	nspawn = append(nspawn, o.NspawnArgs...)
	// The shell joins the container's cgroups, mounts the overlay (in the
	// private mount namespace it was started in) and becomes systemd-nspawn.
	const script = `lower=$1 upper=$2 work=$3 merged=$4 n=$5; shift 5
cgdirs=
while [ "$n" -gt 0 ]; do cgdirs="$cgdirs $1"; shift; n=$((n-1)); done
` + joinScript + `
set -e
if [ -n "$lower" ]; then
	mount -t overlay overlay -o "lowerdir=$lower,upperdir=$upper,workdir=$work" "$merged"
fi
exec "$@"`
	args := []string{"-c", script, "sh", lower, upper, wdir, merged, strconv.Itoa(len(c.cg.dirs))}
	args = append(args, c.cg.dirs...)
	args = append(args, nspawn...)
	logf, err := os.Create(c.console)
	if err != nil {
		return c, err
	}
	defer logf.Close()
	c.cmd = exec.Command("/bin/sh", args...)
	c.cmd.Stdin, c.cmd.Stdout, c.cmd.Stderr = nil, logf, logf
	c.cmd.Env = cleanEnv()
	// Go makes / MS_REC|MS_PRIVATE in the new mount namespace, so the
	// overlay never shows on the host and vanishes with the container.
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	start := time.Now()
	if err := c.cmd.Start(); err != nil {
		return c, fmt.Errorf("start systemd-nspawn: %w", err)
	}
	go func() { _ = c.cmd.Wait(); close(c.exited) }()

	if c.PID, err = c.findInit(ctx, 30*time.Second); err != nil {
		return c, err
	}
	if c.State, err = c.waitRunning(ctx, o.BootTimeout); err != nil {
		return c, err
	}
	if o.MemoryLimits && hostHasV1Memory() {
		out, err := c.Command(ctx, "sh", "-c", "mount -o remount,bind,rw /sys/fs/cgroup/memory && systemctl daemon-reexec").CombinedOutput()
		if err != nil {
			return c, fmt.Errorf("make the memory controller writable: %v: %s", err, out)
		}
		if c.State, err = c.waitRunning(ctx, o.BootTimeout); err != nil {
			return c, err
		}
	}
	c.BootTime = time.Since(start)
	return c, nil
}

// prepareRoot makes the container's root below its work directory: an
// overlay on the cached root (its lower, upper and work directories, for
// the launch script to mount) or, with copyRoot or where overlayfs does not
// work, a copy of it (lower ""). merged is where the root will be.
func (c *Container) prepareRoot(ctx context.Context, copyRoot bool) (merged, lower, upper, wdir string, err error) {
	root := RootfsPath()
	merged = filepath.Join(c.work, "root")
	if err := os.Mkdir(merged, 0o755); err != nil {
		return "", "", "", "", err
	}
	c.Overlay = !copyRoot && overlayWorks(root, c.work)
	if !c.Overlay {
		cp := exec.CommandContext(ctx, "cp", "-a", root+"/.", merged+"/")
		if out, err := cp.CombinedOutput(); err != nil {
			return "", "", "", "", fmt.Errorf("copy root: %v: %s", err, out)
		}
		return merged, "", "", "", nil
	}
	lower, upper, wdir = root, filepath.Join(c.work, "upper"), filepath.Join(c.work, "ovl-work")
	for _, d := range []string{upper, wdir} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return "", "", "", "", err
		}
	}
	return merged, lower, upper, wdir, nil
}

// hostHasV1Memory tells whether the host has a cgroup v1 memory controller.
func hostHasV1Memory() bool {
	_, err := os.Stat("/sys/fs/cgroup/memory/memory.limit_in_bytes")
	return err == nil
}

// findInit waits for systemd-nspawn's child to become the container's systemd.
func (c *Container) findInit(ctx context.Context, timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	ourPidNS, _ := os.Readlink("/proc/self/ns/pid")
	for {
		for _, pid := range children(c.cmd.Process.Pid) {
			comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", pid))
			ns, _ := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", pid))
			if strings.TrimSpace(string(comm)) == "systemd" && ns != "" && ns != ourPidNS {
				return pid, nil
			}
		}
		select {
		case <-c.exited:
			return 0, errors.New("systemd-nspawn exited before the container's systemd started")
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return 0, errors.New("timed out waiting for the container's systemd")
		}
	}
}

func children(pid int) []int {
	var out []int
	tasks, _ := filepath.Glob(fmt.Sprintf("/proc/%d/task/*/children", pid))
	for _, t := range tasks {
		b, _ := os.ReadFile(t)
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// waitRunning polls is-system-running --wait until the manager answers
// (its private bus appears a moment after PID 1 starts) and boot finished.
func (c *Container) waitRunning(ctx context.Context, timeout time.Duration) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	var last string
	for {
		out, _, _ := c.Output(ctx, "systemctl", "is-system-running", "--wait")
		state := strings.TrimSpace(out)
		switch state {
		case "running":
			return state, nil
		case "degraded":
			failed, _, _ := c.Output(ctx, "systemctl", "--failed", "--no-legend", "--plain")
			return state + " (failed: " + strings.Join(strings.Fields(failed), " ") + ")", nil
		case "maintenance", "stopping":
			return "", fmt.Errorf("container's systemd is %s", state)
		}
		// "offline" and connection errors: PID 1 has not set up
		// /run/systemd/system and its bus yet.
		if state != "" {
			last = state
		}
		select {
		case <-c.exited:
			return "", errors.New("systemd-nspawn exited while booting")
		case <-ctx.Done():
			return "", fmt.Errorf("timed out waiting for is-system-running (last answer %q)", last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// overlayWorks tells whether an overlay over root can be mounted here: it
// tries one in a throw-away mount namespace.
func overlayWorks(root, work string) bool {
	overlayOnce.Do(func() {
		dir, err := os.MkdirTemp(work, "probe-")
		if err != nil {
			return
		}
		defer os.RemoveAll(dir)
		for _, d := range []string{"u", "w", "m"} {
			if os.Mkdir(filepath.Join(dir, d), 0o755) != nil {
				return
			}
		}
		cmd := exec.Command("/bin/sh", "-c", `mount -t overlay overlay -o "lowerdir=$1,upperdir=$2/u,workdir=$2/w" "$2/m" && test -e "$2/m/`+markerFile+`"`, "sh", root, dir)
		cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS}
		overlayOK = cmd.Run() == nil
	})
	return overlayOK
}

var (
	overlayOnce sync.Once
	overlayOK   bool
)

// Command returns a command that runs args inside the container, in all its
// namespaces, with a clean environment (PATH, LANG=C.UTF-8, HOME=/root,
// DEBIAN_FRONTEND=noninteractive, no pager, no colours).
func (c *Container) Command(ctx context.Context, args ...string) *exec.Cmd {
	nargs := append([]string{"-t", strconv.Itoa(c.PID), "-a", "--"}, args...)
	cmd := exec.CommandContext(ctx, "nsenter", nargs...)
	cmd.Env = cleanEnv()
	return cmd
}

// Output runs args inside the container and returns its stdout and stderr.
func (c *Container) Output(ctx context.Context, args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	cmd := c.Command(ctx, args...)
	cmd.Stdout, cmd.Stderr = &o, &e
	err = cmd.Run()
	return o.String(), e.String(), err
}

// Exec runs args inside the container (2 minutes at most) and returns its
// stdout; it fails t, with stdout and stderr, when the command fails.
func (c *Container) Exec(t testing.TB, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	out, errOut, err := c.Output(ctx, args...)
	if err != nil {
		t.Fatalf("in container: %q: %v\nstdout:\n%s\nstderr:\n%s", args, err, tail(out, 6000), tail(errOut, 6000))
	}
	return out
}

// Sh runs a shell script inside the container with /bin/sh -ec, as Exec.
func (c *Container) Sh(t testing.TB, script string) string {
	t.Helper()
	return c.Exec(t, "/bin/sh", "-ec", script)
}

// WriteFile writes data to path inside the container (creating its
// directory) with mode perm, owned by root.
func (c *Container) WriteFile(t testing.TB, path string, data []byte, perm os.FileMode) {
	t.Helper()
	if err := c.writeFile(path, bytes.NewReader(data), perm); err != nil {
		t.Fatalf("write %s in container: %v", path, err)
	}
}

// CopyIn copies the host file src to dst inside the container, keeping its
// permission bits.
func (c *Container) CopyIn(t testing.TB, src, dst string) {
	t.Helper()
	f, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.writeFile(dst, f, fi.Mode().Perm()); err != nil {
		t.Fatalf("copy %s to %s in container: %v", src, dst, err)
	}
}

func (c *Container) writeFile(path string, r io.Reader, perm os.FileMode) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// Written through the container's own view, so symlinks resolve there.
	cmd := c.Command(ctx, "/bin/sh", "-ec", `mkdir -p "$(dirname "$1")"; tmp="$1.boottest-tmp"; cat > "$tmp"; chmod "$2" "$tmp"; mv -f "$tmp" "$1"`,
		"sh", path, fmt.Sprintf("%o", perm))
	cmd.Stdin = r
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%v: %s", err, out)
	}
	return nil
}

// ReadFile returns the content of path inside the container.
func (c *Container) ReadFile(t testing.TB, path string) []byte {
	t.Helper()
	return []byte(c.Exec(t, "cat", path))
}

// HostPath returns a host path that reaches path inside the container
// (through /proc/PID/root; symlinks inside the container must be avoided).
func (c *Container) HostPath(path string) string {
	return filepath.Join(fmt.Sprintf("/proc/%d/root", c.PID), path)
}

// Console returns what the container printed on its console so far.
func (c *Container) Console() string {
	b, _ := os.ReadFile(c.console)
	return string(b)
}

// LogJournalOnFailure logs, when t has failed by the time it ends, the
// last lines of the container's journal of units (journalctl -u patterns,
// e.g. drover-pipe-*). Registered after Boot, it runs before the container
// stops.
func (c *Container) LogJournalOnFailure(t testing.TB, lines int, units ...string) {
	t.Cleanup(func() {
		if !t.Failed() {
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		args := []string{"journalctl", "--no-pager", "-n", strconv.Itoa(lines)}
		for _, u := range units {
			args = append(args, "-u", u)
		}
		out, _, _ := c.Output(ctx, args...)
		t.Logf("---- container journal: %s ----\n%s", strings.Join(units, ", "), out)
	})
}

func (c *Container) logDiagnostics(t testing.TB) {
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if out, _, err := c.Output(ctx, "journalctl", "--no-pager", "-n", "300", "-o", "short-monotonic"); err == nil && strings.TrimSpace(out) != "" {
		t.Logf("container %s journal (last 300 lines):\n%s", c.Name, out)
		return
	}
	t.Logf("container %s console (tail):\n%s", c.Name, tail(c.Console(), 4000))
}

// Stop shuts the container down (SIGTERM to systemd-nspawn makes its systemd
// power off; SIGKILL after 30 s), kills whatever is left in its cgroups and
// removes its scratch directory. It may be called more than once.
func (c *Container) Stop() error {
	var err error
	c.stopped.Do(func() {
		if c.cmd != nil && c.cmd.Process != nil {
			_ = c.cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-c.exited:
			case <-time.After(30 * time.Second):
				err = errors.New("container did not power off within 30 s; killed")
				if c.PID > 0 {
					_ = syscall.Kill(c.PID, syscall.SIGKILL)
				}
				_ = c.cmd.Process.Kill()
				<-c.exited
			}
		}
		if c.cg != nil {
			c.cg.killAll()
			c.cg.remove()
		}
		// systemd-nspawn leaves this behind when /run is not a tmpfs.
		_ = os.RemoveAll(filepath.Join("/run/systemd/nspawn/propagate", c.Name))
		if c.work != "" {
			if rerr := os.RemoveAll(c.work); rerr != nil && err == nil {
				err = rerr
			}
		}
		if c.lock != nil {
			c.lock.Close()
		}
	})
	return err
}
