package boottest

import (
	"bytes"
	"errors"
	"fmt"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"sync"
	"testing"
)

// cleanEnv is the environment of every command run for a container, on the
// host or inside: nothing of the test's own environment leaks in.
func cleanEnv() []string {
	return []string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"LANG=C.UTF-8",
		"HOME=/root",
		"TERM=dumb",
		"DEBIAN_FRONTEND=noninteractive",
		"SYSTEMD_PAGER=",
		"SYSTEMD_COLORS=0",
		"SYSTEMD_LOG_COLOR=0",
	}
}

var aptMu sync.Mutex

// ensureCommand makes sure cmd is on PATH, installing the Debian package pkg
// with apt-get when running as root.
func ensureCommand(cmd, pkg string) error {
	if _, err := exec.LookPath(cmd); err == nil {
		return nil
	}
	if os.Geteuid() != 0 {
		return fmt.Errorf("%s is missing (Debian package %s) and only root may install it", cmd, pkg)
	}
	if _, err := exec.LookPath("apt-get"); err != nil {
		return fmt.Errorf("%s is missing (Debian package %s) and there is no apt-get", cmd, pkg)
	}
	aptMu.Lock()
	defer aptMu.Unlock()
	if _, err := exec.LookPath(cmd); err == nil {
		return nil
	}
	var out bytes.Buffer
	// The dpkg lock timeout lets parallel test binaries install in turn.
	for _, args := range [][]string{
		{"-o", "DPkg::Lock::Timeout=300", "-qq", "update"},
		{"-o", "DPkg::Lock::Timeout=300", "-y", "-qq", "--no-install-recommends", "install", pkg},
	} {
		c := exec.Command("apt-get", args...)
		c.Stdout, c.Stderr, c.Env = &out, &out, cleanEnv()
		if err := c.Run(); err != nil {
			return fmt.Errorf("apt-get %v: %v\n%s", args, err, tail(out.String(), 2000))
		}
	}
	if _, err := exec.LookPath(cmd); err != nil {
		return fmt.Errorf("installed %s but %s is still missing", pkg, cmd)
	}
	return nil
}

// Available reports why no container can be booted here, or nil. It may
// install systemd-container (as root) but does not build the cached root.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("not root")
	}
	for _, c := range []struct{ cmd, pkg string }{
		{"systemd-nspawn", "systemd-container"},
		{"nsenter", "util-linux"},
		{"unshare", "util-linux"},
	} {
		if err := ensureCommand(c.cmd, c.pkg); err != nil {
			return err
		}
	}
	if !rootfsOK(RootfsPath()) {
		if err := ensureCommand("debootstrap", "debootstrap"); err != nil {
			return fmt.Errorf("no cached root at %s and cannot build one: %w", RootfsPath(), err)
		}
	}
	return nil
}

// unavailable skips t, or fails it when CI=true.
func unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	testkit.Unavailable(t, "booted Debian container unavailable: %s", fmt.Sprintf(format, args...))
}
