package pkgtest

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/drover/drover/internal/testkit"
	"github.com/drover/drover/packaging/boottest"
)

// show returns one property of a unit inside the container.
func show(t *testing.T, c *boottest.Container, unit, prop string) string {
	t.Helper()
	return strings.TrimSpace(c.Exec(t, "systemctl", "show", "-p", prop, "--value", unit))
}

// isEnabled answers systemctl is-enabled (which exits 1 unless enabled).
func isEnabled(c *boottest.Container, unit string) string {
	out, _, _ := c.Output(context.Background(), "systemctl", "is-enabled", unit)
	return strings.TrimSpace(out)
}

func exists(t *testing.T, c *boottest.Container, path string) bool {
	t.Helper()
	_, _, err := c.Output(context.Background(), "test", "-e", path)
	return err == nil
}

// copyDebs copies the amd64 .debs of an index into dir inside the container
// and returns their paths there.
func copyDebs(t *testing.T, c *boottest.Container, hostDir string, path func(pkg string) string, dir string) []string {
	t.Helper()
	var out []string
	for _, pkg := range []string{"drover-server", "droverctl", "drover-agent"} {
		p := path(pkg)
		dst := dir + "/" + filepath.Base(p)
		c.CopyIn(t, p, dst)
		out = append(out, dst)
	}
	return out
}

const (
	fakeTimer  = "drover-pipe-fake.timer"
	lateTimer  = "drover-pipe-late.timer"
	stampDir   = "/var/lib/systemd/timers"
	unitDir    = "/etc/systemd/system"
	fakeMarker = "/root/fake-ran"
)

// plantTimer writes name.timer and name.service into the container with the
// given first line ("" for none), enables and starts the timer, then gives
// it a Persistent= stamp two days old: a restart of the timer from now on
// would fire its service at once (catch-up), so any unplanned run shows.
func plantTimer(t *testing.T, c *boottest.Container, name, firstLine string) {
	t.Helper()
	svc := "[Unit]\nDescription=test pipe " + name + "\n[Service]\nType=oneshot\nExecStart=/bin/sh -c 'echo " + name + " >> " + fakeMarker + "'\n"
	tmr := "[Unit]\nDescription=test timer " + name + "\n[Timer]\nOnCalendar=*-*-* 03:00:00\nPersistent=true\nAccuracySec=1s\n[Install]\nWantedBy=timers.target\n"
	if firstLine != "" {
		svc, tmr = firstLine+svc, firstLine+tmr
	}
	c.WriteFile(t, unitDir+"/"+name+".service", []byte(svc), 0o644)
	c.WriteFile(t, unitDir+"/"+name+".timer", []byte(tmr), 0o644)
	c.Exec(t, "systemctl", "daemon-reload")
	c.Exec(t, "systemctl", "enable", "--now", name+".timer")
	c.Exec(t, "sh", "-c", `mkdir -p `+stampDir+` && touch -d '2 days ago' `+stampDir+`/stamp-`+name+`.timer`)
}

// TestDebLifecycle installs, upgrades, removes and purges the .debs in a
// booted Debian bookworm and checks what the maintainer scripts promise.
// It needs no enrolled agent: the pipes are hand-made units, some with the
// managed header and some without.
func TestDebLifecycle(t *testing.T) {
	t.Parallel()
	dir, ix := packages(t)
	updir, upix := upgradePackages(t)
	c := boottest.Boot(t, boottest.Options{PrivateNetwork: true}) // the server binds :8443 in the container only
	start := time.Now()

	v1 := copyDebs(t, c, dir, func(p string) string { return ix.Path(dir, p, "amd64", "deb") }, "/root/v1")
	v2 := copyDebs(t, c, updir, func(p string) string { return upix.Path(updir, p, "amd64", "deb") }, "/root/v2")

	header := strings.TrimSuffix(managedHeader, "\n")
	plantTimer(t, c, "drover-pipe-fake", managedHeader)
	plantTimer(t, c, "drover-pipe-imposter", "# an admin's own unit that quotes the header below\n"+managedHeader) // header not on line 1
	plantTimer(t, c, "unrelated", "")
	c.WriteFile(t, "/var/lib/drover-runs/fake/spool.json", []byte("{}"), 0o600)
	c.WriteFile(t, "/run/drover/requests/fake.json", []byte("{}"), 0o644)

	// ---- install
	t.Logf("dpkg -i: %s", c.Exec(t, append([]string{"dpkg", "-i"}, v1...)...))
	if got := c.Exec(t, "getent", "passwd", "drover"); !strings.Contains(got, ":/var/lib/drover-server:/usr/sbin/nologin") {
		t.Errorf("user drover: %q", got)
	}
	for path, want := range map[string]string{
		"/var/lib/drover-server":         "700 drover:drover",
		"/etc/drover-server":             "750 root:drover",
		"/etc/drover-server/server.yaml": "640 root:drover",
		"/var/lib/drover":                "700 root:root",
		"/etc/drover":                    "755 root:root",
		"/etc/drover/agent.yaml":         "644 root:root",
		"/usr/bin/drover-agent":          "755 root:root",
	} {
		if got := strings.TrimSpace(c.Exec(t, "stat", "-c", "%a %U:%G", path)); got != want {
			t.Errorf("%s: %s, want %s", path, got, want)
		}
	}
	for _, u := range []string{"drover-agent.service", "drover-server.service"} {
		if got := isEnabled(c, u); got != "enabled" {
			t.Errorf("%s is %s after install, want enabled", u, got)
		}
	}
	// Started on install (Debian policy), and both run under their sandboxes.
	for _, u := range []string{"drover-server.service", "drover-agent.service"} {
		if !testkit.Eventually(30*time.Second, func() bool { return show(t, c, u, "ActiveState") == "active" }) {
			t.Errorf("%s not active after install: %s\n%s", u, show(t, c, u, "ActiveState"),
				c.Exec(t, "journalctl", "-u", u, "--no-pager", "-n", "40"))
		}
	}
	if !testkit.Eventually(30*time.Second, func() bool { return exists(t, c, "/var/lib/drover-server/admin.token") }) {
		t.Errorf("the server wrote no admin.token:\n%s", c.Exec(t, "journalctl", "-u", "drover-server", "--no-pager", "-n", "40"))
	} else {
		if got := strings.TrimSpace(c.Exec(t, "stat", "-c", "%a %U", "/var/lib/drover-server/admin.token", "/var/lib/drover-server/ca.crt")); !strings.HasPrefix(got, "600 drover\n") {
			t.Errorf("admin.token and ca.crt: %q", got)
		}
	}
	if got := show(t, c, "drover-server.service", "User"); got != "drover" {
		t.Errorf("server runs as %q", got)
	}
	adminToken := c.Exec(t, "cat", "/var/lib/drover-server/admin.token")
	agentInv := show(t, c, "drover-agent.service", "InvocationID")
	serverInv := show(t, c, "drover-server.service", "InvocationID")
	fakeNext := show(t, c, fakeTimer, "NextElapseUSecRealtime")

	// ---- upgrade (the admin edited the agent's conffile and disabled the server)
	c.Exec(t, "sh", "-c", `echo '# local edit' >> /etc/drover/agent.yaml && echo kept > /var/lib/drover/marker`)
	// An admin's mode on a conffile is dpkg's to keep: configure does not
	// reset it.
	c.Exec(t, "chmod", "0440", "/etc/drover-server/server.yaml")
	c.Exec(t, "systemctl", "disable", "drover-server.service")
	t.Logf("dpkg -i (upgrade): %s", c.Exec(t, append([]string{"dpkg", "-i"}, v2...)...))
	if got := strings.TrimSpace(c.Exec(t, "dpkg-query", "-W", "-f", "${Version}", "drover-agent")); got != upix.Version+"-1" {
		t.Errorf("after upgrade drover-agent is %s, want %s-1", got, upix.Version)
	}
	if got := show(t, c, "drover-agent.service", "InvocationID"); got == agentInv || show(t, c, "drover-agent.service", "ActiveState") != "active" {
		t.Errorf("the agent was not restarted by the upgrade (invocation %s -> %s)", agentInv, got)
	}
	if got := isEnabled(c, "drover-server.service"); got != "disabled" {
		t.Errorf("the upgrade re-enabled a server the admin disabled: %s", got)
	}
	if got := strings.TrimSpace(c.Exec(t, "stat", "-c", "%a %U:%G", "/etc/drover-server/server.yaml")); got != "440 root:drover" {
		t.Errorf("/etc/drover-server/server.yaml after upgrade: %s, want the admin's 440 root:drover", got)
	}
	if !strings.Contains(c.Exec(t, "cat", "/etc/drover/agent.yaml"), "# local edit") {
		t.Error("the upgrade replaced the edited conffile /etc/drover/agent.yaml")
	}
	if c.Exec(t, "cat", "/var/lib/drover/marker") != "kept\n" || c.Exec(t, "cat", "/var/lib/drover-server/admin.token") != adminToken {
		t.Error("the upgrade lost state in /var/lib/drover or /var/lib/drover-server")
	}
	if got := show(t, c, fakeTimer, "NextElapseUSecRealtime"); got != fakeNext || show(t, c, fakeTimer, "ActiveState") != "active" {
		t.Errorf("the upgrade touched a pipe timer: next elapse %s -> %s", fakeNext, got)
	}
	_ = serverInv
	c.Exec(t, "systemctl", "enable", "--now", "drover-server.service")

	// ---- remove the agent: it stops, its managed units go (files, links,
	// loaded units), everything else stays, data stays.
	c.Exec(t, "dpkg", "-r", "drover-agent")
	if got := show(t, c, "drover-agent.service", "LoadState"); got != "not-found" {
		t.Errorf("drover-agent.service after remove: LoadState %s", got)
	}
	for _, f := range []string{unitDir + "/" + fakeTimer, unitDir + "/drover-pipe-fake.service", unitDir + "/timers.target.wants/" + fakeTimer} {
		if exists(t, c, f) {
			t.Errorf("after remove: %s still exists", f)
		}
	}
	if got := show(t, c, fakeTimer, "LoadState"); got != "not-found" {
		t.Errorf("%s after remove: LoadState %s", fakeTimer, got)
	}
	for _, f := range []string{"/var/lib/drover/marker", "/etc/drover/agent.yaml", stampDir + "/stamp-" + fakeTimer, "/var/lib/drover-runs/fake/spool.json"} {
		if !exists(t, c, f) {
			t.Errorf("after remove: %s is gone (only purge removes it)", f)
		}
	}
	checkOthersUntouched(t, c, header)

	// ---- purge the agent, with a managed unit that appeared since remove.
	plantTimer(t, c, "drover-pipe-late", managedHeader)
	c.Exec(t, "dpkg", "-P", "drover-agent")
	for _, f := range []string{"/var/lib/drover", "/etc/drover", unitDir + "/" + lateTimer, unitDir + "/timers.target.wants/" + lateTimer,
		stampDir + "/stamp-" + fakeTimer, stampDir + "/stamp-" + lateTimer, "/var/lib/drover-runs", "/run/drover"} {
		if exists(t, c, f) {
			t.Errorf("after purge: %s still exists", f)
		}
	}
	if !exists(t, c, stampDir+"/stamp-drover-pipe-imposter.timer") || !exists(t, c, stampDir+"/stamp-unrelated.timer") {
		t.Error("purge removed the stamp of a timer it does not manage")
	}
	checkOthersUntouched(t, c, header)
	timers := c.Exec(t, "systemctl", "list-timers", "--all", "--no-pager")
	if !strings.Contains(timers, "unrelated.timer") || strings.Contains(timers, "drover-pipe-fake") || strings.Contains(timers, "drover-pipe-late") {
		t.Errorf("list-timers after purge:\n%s", timers)
	}

	// ---- purge the server and droverctl: data goes, the user stays.
	c.Exec(t, "dpkg", "-P", "drover-server", "droverctl")
	for _, f := range []string{"/var/lib/drover-server", "/etc/drover-server", "/usr/bin/drover-server", "/usr/bin/droverctl"} {
		if exists(t, c, f) {
			t.Errorf("after purging the server: %s still exists", f)
		}
	}
	if got := show(t, c, "drover-server.service", "LoadState"); got != "not-found" {
		t.Errorf("drover-server.service after purge: %s", got)
	}
	c.Exec(t, "getent", "passwd", "drover")
	if exists(t, c, fakeMarker) {
		t.Errorf("a pipe ran that nobody planned: %s", c.Exec(t, "cat", fakeMarker))
	}
	t.Logf("install, upgrade, remove and purge in the container took %s", time.Since(start).Round(100*time.Millisecond))
}

// checkOthersUntouched: the units without the managed header on line 1
// are still there, enabled and active.
func checkOthersUntouched(t *testing.T, c *boottest.Container, header string) {
	t.Helper()
	for _, u := range []string{"unrelated.timer", "drover-pipe-imposter.timer"} {
		if !exists(t, c, unitDir+"/"+u) || !exists(t, c, unitDir+"/timers.target.wants/"+u) {
			t.Errorf("%s or its enablement link was removed", u)
		}
		if got := show(t, c, u, "ActiveState"); got != "active" {
			t.Errorf("%s is %s", u, got)
		}
	}
	if got := c.Exec(t, "sed", "-n", "2p", unitDir+"/drover-pipe-imposter.timer"); strings.TrimSpace(got) != header {
		t.Errorf("imposter changed: %q", got)
	}
	_ = fmt.Sprint()
}
