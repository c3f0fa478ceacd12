package packaging

import (
	"bytes"
	"fmt"
	"github.com/drover/drover/internal/testkit"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// TestUnitFiles: both units pass systemd-analyze verify (with the daemon's
// path pointed at an existing binary, since it is not installed here) and
// their sandboxes rate as systemd-analyze security says.
func TestUnitFiles(t *testing.T) {
	sa := testkit.RequireCommand(t, "systemd-analyze", "")
	for _, c := range []struct {
		unit, bin  string
		maxScore   float64 // overall exposure, 0 (best) to 10
		mustHave   []string
		mustNotUse []string
	}{
		{"drover-agent.service", "/usr/bin/drover-agent", 4.5,
			[]string{"Type=notify", "WatchdogSec=", "Restart=on-failure", "NoNewPrivileges=yes", "ProtectHome=yes", "PrivateTmp=yes",
				"ProtectSystem=full", "ReadWritePaths=/etc/systemd/system /etc/drover", "ExecStart=/usr/bin/drover-agent --config /etc/drover/agent.yaml"},
			// Root, unsandboxed writes to the unit directory and D-Bus to PID 1
			// are its job; these would break it.
			[]string{"User=", "DynamicUser=", "ProtectSystem=strict", "PrivateUsers=", "UMask=0077", "CapabilityBoundingSet="}},
		{"drover-server.service", "/usr/bin/drover-server", 2.0,
			[]string{"Type=notify", "WatchdogSec=", "Restart=on-failure", "User=drover", "StateDirectory=drover-server",
				"ConfigurationDirectory=drover-server", "ProtectSystem=strict", "CapabilityBoundingSet=\n", "NoNewPrivileges=yes",
				"ExecStart=/usr/bin/drover-server serve --config /etc/drover-server/server.yaml"},
			nil},
	} {
		t.Run(c.unit, func(t *testing.T) {
			b, err := os.ReadFile(filepath.Join("systemd", c.unit))
			if err != nil {
				t.Fatal(err)
			}
			for _, s := range c.mustHave {
				if !bytes.Contains(b, []byte("\n"+s)) {
					t.Errorf("missing %q", s)
				}
			}
			for _, s := range c.mustNotUse {
				if bytes.Contains(b, []byte("\n"+s)) {
					t.Errorf("must not use %q", s)
				}
			}
			dir := t.TempDir()
			test := bytes.ReplaceAll(b, []byte(c.bin), []byte("/bin/true"))
			test = bytes.ReplaceAll(test, []byte("Documentation=man:"+strings.TrimSuffix(c.unit, ".service")+"(8) "), []byte("Documentation="))
			path := filepath.Join(dir, c.unit)
			if err := os.WriteFile(path, test, 0o644); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command(sa, "verify", "--man=no", path).CombinedOutput()
			if err != nil || len(bytes.TrimSpace(out)) > 0 {
				t.Errorf("systemd-analyze verify: %v\n%s", err, out)
			}
			out, err = exec.Command(sa, "security", "--offline=true", "--no-pager", path).CombinedOutput()
			if err != nil {
				t.Fatalf("systemd-analyze security: %v\n%s", err, out)
			}
			score := exposure(t, out)
			t.Logf("%s: systemd-analyze security exposure %.1f", c.unit, score)
			if score > c.maxScore {
				t.Errorf("exposure %.1f > %.1f:\n%s", score, c.maxScore, out)
			}
		})
	}
}

func exposure(t *testing.T, out []byte) float64 {
	t.Helper()
	for _, line := range strings.Split(string(out), "\n") {
		if i := strings.Index(line, "Overall exposure level for"); i >= 0 {
			_, rest, _ := strings.Cut(line[i:], ": ")
			f := strings.Fields(rest)
			if len(f) > 0 {
				if v, err := strconv.ParseFloat(f[0], 64); err == nil {
					return v
				}
			}
		}
	}
	t.Fatalf("no exposure level in:\n%s", out)
	return 0
}

// builtScripts returns the maintainer scripts with their includes inlined.
func builtScripts(t *testing.T) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, kind := range []string{"deb", "rpm"} {
		entries, err := os.ReadDir(filepath.Join("scripts", kind))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			b, err := os.ReadFile(filepath.Join("scripts", kind, e.Name()))
			if err != nil {
				t.Fatal(err)
			}
			if b, err = InlineIncludes("scripts", b); err != nil {
				t.Fatalf("%s/%s: %v", kind, e.Name(), err)
			}
			out[kind+"/"+e.Name()] = b
		}
	}
	return out
}

// TestScriptsSyntax: every maintainer script is POSIX sh (dash and bash
// --posix parse it), includes are resolved, and the set is complete.
func TestScriptsSyntax(t *testing.T) {
	scripts := builtScripts(t)
	var names []string
	for n := range scripts {
		names = append(names, n)
	}
	sort.Strings(names)
	want := "deb/drover-agent.postinst deb/drover-agent.postrm deb/drover-agent.prerm deb/drover-server.postinst deb/drover-server.postrm deb/drover-server.preinst deb/drover-server.prerm " +
		"rpm/drover-agent.post rpm/drover-agent.postun rpm/drover-agent.preun rpm/drover-server.post rpm/drover-server.postun rpm/drover-server.pre rpm/drover-server.preun"
	if got := strings.Join(names, " "); got != want {
		t.Errorf("scripts:\n got %s\nwant %s", got, want)
	}
	for _, n := range names {
		b := scripts[n]
		if !bytes.HasPrefix(b, []byte("#!/bin/sh\n")) || bytes.Contains(b, []byte("#INCLUDE")) {
			t.Errorf("%s: no #!/bin/sh or an unresolved include", n)
		}
		for _, sh := range [][]string{{"dash", "-n"}, {"bash", "--posix", "-n"}} {
			if _, err := exec.LookPath(sh[0]); err != nil {
				continue
			}
			cmd := exec.Command(sh[0], sh[1:]...)
			cmd.Stdin = bytes.NewReader(b)
			if out, err := cmd.CombinedOutput(); err != nil {
				t.Errorf("%s: %s: %v\n%s", n, sh[0], err, out)
			}
		}
	}
}

const managedHeader = "# Managed by drover-agent. Local changes are overwritten.\n"

// TestManagedUnitSweep runs the scripts' sweep over a fake unit directory:
// it removes exactly the regular files whose first line is the managed
// header and their enablement links, and nothing else. (The booted test in
// pkgtest does the same through dpkg on a running systemd.)
func TestManagedUnitSweep(t *testing.T) {
	testkit.RequireCommand(t, "dash", "")
	dir := t.TempDir()
	units := filepath.Join(dir, "system")
	wants := filepath.Join(units, "timers.target.wants")
	multi := filepath.Join(units, "multi-user.target.wants")
	for _, d := range []string{wants, multi} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	write := func(name, content string) {
		if err := os.WriteFile(filepath.Join(units, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	body := "[Timer]\nOnCalendar=daily\n"
	write("drover-pipe-a.timer", managedHeader+body)
	write("drover-pipe-a.service", managedHeader+"[Service]\nExecStart=/usr/bin/drover-agent run a\n")
	write("other-with-header.service", managedHeader+"[Service]\nExecStart=/bin/true\n") // the header is the rule, not the name
	write("drover-pipe-imposter.timer", "# an admin's own timer\n"+managedHeader+body)
	write("drover-pipe-spaced.timer", " "+managedHeader+body)
	write("drover-pipe-crlf.timer", strings.TrimSuffix(managedHeader, "\n")+"\r\n"+body)
	write("unrelated.timer", "[Timer]\nOnCalendar=hourly\n")
	write("unrelated.service", "[Service]\nExecStart=/bin/true\n")
	write("it's odd name.timer", managedHeader+body) // spaces and quotes must not derail the loop
	if err := os.Symlink(filepath.Join(units, "drover-pipe-a.timer"), filepath.Join(units, "alias-to-managed.timer")); err != nil {
		t.Fatal(err)
	}
	for _, l := range []struct{ dir, name string }{{wants, "drover-pipe-a.timer"}, {wants, "unrelated.timer"}, {wants, "drover-pipe-imposter.timer"}, {multi, "other-with-header.service"}} {
		if err := os.Symlink(filepath.Join(units, l.name), filepath.Join(l.dir, l.name)); err != nil {
			t.Fatal(err)
		}
	}
	inc, err := os.ReadFile("scripts/managed-units.sh")
	if err != nil {
		t.Fatal(err)
	}
	script := string(inc) + fmt.Sprintf("\ndrover_unit_dir=%q\necho \"managed: $(drover_managed_units | tr '\\n' ' ')\"\ndrover_remove_managed_units\n", units)
	cmd := exec.Command("dash", "-e", "-c", script)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("sweep: %v\n%s", err, out)
	}
	t.Logf("%s", out)
	var left []string
	_ = filepath.WalkDir(units, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != units && !d.IsDir() {
			rel, _ := filepath.Rel(units, p)
			left = append(left, rel)
		}
		return nil
	})
	sort.Strings(left)
	want := []string{
		"alias-to-managed.timer", // a symlink is never a managed unit, even when it points to one
		"drover-pipe-crlf.timer",
		"drover-pipe-imposter.timer",
		"drover-pipe-spaced.timer",
		"timers.target.wants/drover-pipe-imposter.timer",
		"timers.target.wants/unrelated.timer",
		"unrelated.service",
		"unrelated.timer",
	}
	if strings.Join(left, "\n") != strings.Join(want, "\n") {
		t.Errorf("left after the sweep:\n%s\nwant:\n%s", strings.Join(left, "\n"), strings.Join(want, "\n"))
	}
	if !strings.Contains(string(out), "managed: drover-pipe-a.service drover-pipe-a.timer it's odd name.timer other-with-header.service") {
		t.Errorf("managed list: %s", out)
	}
}
