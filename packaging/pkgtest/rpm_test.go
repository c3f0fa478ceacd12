package pkgtest

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging/boottest"
)

// No RPM-based system can be booted here (the machine reaches Debian's
// archive only), so the RPMs are proven in two scratch roots:
//
//   - an empty root, `rpm -i --root --nodeps --noscripts`: every file lands
//     with its mode; the owner drover falls back to root there because no
//     %pre ran and the root has no passwd database;
//   - a copy of the cached Debian root (packaging/boottest), with the
//     scriptlets run chrooted: %pre creates the user drover with
//     systemd-sysusers so files get their owner, %post applies presets
//     offline, an upgrade keeps an edited %config(noreplace) file, and %preun
//     on erase removes exactly the units the agent manages.
//
// What a booted Fedora/RHEL system would add, and these roots cannot show:
// the distribution's systemd presets deciding whether the services are
// enabled (Fedora's default is disabled, so `systemctl enable --now`),
// daemon-reload and `try-restart` on upgrade against a running manager,
// SELinux file contexts for /var/lib/drover* and the ports 8443/8444 under
// an enforcing policy, and dnf resolving the weak dependencies (Recommends:
// systemd, droverctl).

func TestRPMInstallEmptyRoot(t *testing.T) {
	testkit.RequireCommand(t, "rpm", "Debian package rpm; `make deps` installs it")
	dir, ix := packages(t)
	root := t.TempDir()
	run(t, "rpm", "--root", root, "--initdb")
	var rpms []string
	for _, pkg := range []string{"drover-agent", "drover-server", "droverctl"} {
		rpms = append(rpms, ix.Path(dir, pkg, "amd64", "rpm"))
	}
	args := append([]string{"-i", "--root", root, "--nodeps", "--noscripts", "--ignorearch"}, rpms...)
	out, err := exec.Command("rpm", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("rpm -i: %v\n%s", err, out)
	}
	t.Logf("rpm -i --root (no scriptlets) says:\n%s", out)
	if got := strings.Fields(run(t, "rpm", "--root", root, "-qa", "--qf", "%{NAME}\n")); len(got) != 3 {
		t.Errorf("installed: %v", got)
	}
	for path, mode := range map[string]os.FileMode{
		"usr/bin/drover-agent":                            0o755,
		"usr/bin/drover-server":                           0o755,
		"usr/bin/droverctl":                               0o755,
		"usr/lib/systemd/system/drover-agent.service":     0o644,
		"usr/lib/systemd/system/drover-server.service":    0o644,
		"etc/drover/agent.yaml":                           0o644,
		"etc/drover-server/server.yaml":                   0o640,
		"etc/drover-server":                               0o750 | os.ModeDir,
		"var/lib/drover":                                  0o700 | os.ModeDir,
		"var/lib/drover-server":                           0o700 | os.ModeDir,
		"usr/share/bash-completion/completions/droverctl": 0o644,
		"usr/share/zsh/site-functions/_droverctl":         0o644,
	} {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Errorf("%s: %v", path, err)
			continue
		}
		if got := fi.Mode() & (os.ModeDir | os.ModePerm); got != mode {
			t.Errorf("%s: mode %v, want %v", path, got, mode)
		}
	}
	// rpm -V checks the installed files against the header (the owner is
	// expected to differ: no user drover in this root). --nodeps: nothing
	// in this root provides /bin/sh (TestRPMs checks the Requires).
	out, _ = exec.Command("rpm", "--root", root, "-V", "--nodeps", "drover-agent", "droverctl").CombinedOutput()
	if strings.TrimSpace(string(out)) != "" {
		t.Errorf("rpm -V drover-agent droverctl:\n%s", out)
	}
}

func TestRPMScriptletsInDebianRoot(t *testing.T) {
	testkit.RequireCommand(t, "rpm", "Debian package rpm; `make deps` installs it")
	if os.Geteuid() != 0 {
		testkit.Unavailable(t, "needs root (chrooted scriptlets)")
	}
	// The cached root of the booted tests is a Debian system with a shell,
	// systemd-sysusers and systemctl to run the scriptlets with.
	if err := boottest.Available(); err != nil {
		testkit.Unavailable(t, "no Debian root for the scriptlets: %v", err)
	}
	lock, _, err := boottest.EnsureRootfs(t.Context(), t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	dir, ix := packages(t)
	updir, upix := upgradePackages(t)
	root := filepath.Join(t.TempDir(), "root")
	run(t, "cp", "-a", boottest.RootfsPath(), root)
	lock.Close()
	rpmIn := func(args ...string) string {
		t.Helper()
		out, err := exec.Command("rpm", append([]string{"--root", root}, args...)...).CombinedOutput()
		if err != nil {
			t.Fatalf("rpm --root %v: %v\n%s", args, err, out)
		}
		return string(out)
	}
	rpmIn("--initdb")
	pkgs := func(d string, ixPath func(string) string) []string {
		var out []string
		for _, p := range []string{"drover-agent", "drover-server", "droverctl"} {
			out = append(out, ixPath(p))
		}
		return out
	}
	v1 := pkgs(dir, func(p string) string { return ix.Path(dir, p, "amd64", "rpm") })
	out := rpmIn(append([]string{"-i", "--nodeps"}, v1...)...)
	t.Logf("rpm -i (with scriptlets):\n%s", out)

	passwd, _ := os.ReadFile(filepath.Join(root, "etc/passwd"))
	var uid, home, shell string
	for _, line := range strings.Split(string(passwd), "\n") {
		if f := strings.Split(line, ":"); len(f) == 7 && f[0] == "drover" {
			uid, home, shell = f[2], f[5], f[6]
		}
	}
	if uid == "" || home != "/var/lib/drover-server" || shell != "/usr/sbin/nologin" {
		t.Fatalf("%%pre did not create the user drover (uid %q, home %q, shell %q)", uid, home, shell)
	}
	for path, owner := range map[string]string{
		"var/lib/drover-server":         uid + ":" + uid,
		"etc/drover-server/server.yaml": "0:" + uid,
		"var/lib/drover":                "0:0",
	} {
		fi, err := os.Stat(filepath.Join(root, path))
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		if got := fmt.Sprintf("%d:%d", st.Uid, st.Gid); got != owner {
			t.Errorf("%s owned by %s, want %s", path, got, owner)
		}
	}
	// --nodeps: the Debian root's /bin/sh and systemd are dpkg's, not in
	// the rpm database (TestRPMs checks the Requires).
	if out := rpmIn("-V", "--nodeps", "drover-agent", "drover-server", "droverctl"); strings.TrimSpace(out) != "" {
		t.Errorf("rpm -V after install:\n%s", out)
	}

	// Upgrade keeps an edited %config(noreplace) file.
	agentYAML := filepath.Join(root, "etc/drover/agent.yaml")
	edited := "server: https://drover.example.com:8443\n"
	if err := os.WriteFile(agentYAML, []byte(edited), 0o644); err != nil {
		t.Fatal(err)
	}
	v2 := pkgs(updir, func(p string) string { return upix.Path(updir, p, "amd64", "rpm") })
	out = rpmIn(append([]string{"-U", "--nodeps"}, v2...)...)
	t.Logf("rpm -U:\n%s", out)
	if b, _ := os.ReadFile(agentYAML); string(b) != edited {
		t.Errorf("the upgrade replaced the edited agent.yaml: %q", b)
	}
	if got := strings.TrimSpace(rpmIn("-q", "--qf", "%{VERSION}", "drover-agent")); got != upix.Version {
		t.Errorf("after rpm -U: version %s, want %s", got, upix.Version)
	}

	// Erase: the agent's managed units go, nothing else does; data stays.
	units := filepath.Join(root, "etc/systemd/system")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(units, "timers.target.wants"), 0o755))
	must(os.WriteFile(filepath.Join(units, "drover-pipe-x.timer"), []byte(managedHeader+"[Timer]\nOnCalendar=daily\n"), 0o644))
	must(os.WriteFile(filepath.Join(units, "drover-pipe-x.service"), []byte(managedHeader+"[Service]\nExecStart=/usr/bin/drover-agent run x\n"), 0o644))
	must(os.Symlink("/etc/systemd/system/drover-pipe-x.timer", filepath.Join(units, "timers.target.wants/drover-pipe-x.timer")))
	must(os.WriteFile(filepath.Join(units, "mine.timer"), []byte("[Timer]\nOnCalendar=daily\n"), 0o644))
	must(os.Symlink("/etc/systemd/system/mine.timer", filepath.Join(units, "timers.target.wants/mine.timer")))
	must(os.WriteFile(filepath.Join(root, "var/lib/drover/identity-marker"), []byte("x"), 0o600))
	rpmIn("-e", "drover-agent")
	for _, gone := range []string{"drover-pipe-x.timer", "drover-pipe-x.service", "timers.target.wants/drover-pipe-x.timer", "../../../usr/bin/drover-agent"} {
		if _, err := os.Lstat(filepath.Join(units, gone)); err == nil {
			t.Errorf("after rpm -e drover-agent: %s is still there", gone)
		}
	}
	for _, kept := range []string{"etc/systemd/system/mine.timer", "etc/systemd/system/timers.target.wants/mine.timer", "var/lib/drover/identity-marker"} {
		if _, err := os.Lstat(filepath.Join(root, kept)); err != nil {
			t.Errorf("after rpm -e drover-agent: %s is gone", kept)
		}
	}
	// An edited %config(noreplace) file is saved as .rpmsave on erase.
	if _, err := os.Stat(agentYAML + ".rpmsave"); err != nil {
		t.Errorf("no agent.yaml.rpmsave after erasing with an edited config: %v", err)
	}
	rpmIn("-e", "drover-server", "droverctl")
	if _, err := os.Stat(filepath.Join(root, "usr/bin/drover-server")); err == nil {
		t.Error("drover-server still installed")
	}
}

const managedHeader = "# Managed by drover-agent. Local changes are overwritten.\n"
